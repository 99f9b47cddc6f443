"""The fast paths of sampling and of the log-prob forward equal the plain computation.

Oracle: one full forward over prompt + response with full [N, L, V] logits and ``log_softmax`` -- the textbook
definition, written here independently of capo's code. Checked against it: the tiled vocabulary projection, the
shared-prefix forward (prompt run once per group), their gradients, and the log-probs recorded during generation
(with and without the shared-prefix prefill, under temperature/top-p warping that must not leak into them).
"""

from __future__ import annotations

import pytest
import torch

from capo.rollout import HFEngine, load_model, sample_rollout, token_logprobs
from capo.rollout.engine import KV_CACHES


@pytest.fixture(scope="module")
def model_tok(tiny_model):
    return load_model(tiny_model)  # tests/conftest.py: 2-layer Qwen2, capo's character tokenizer


def oracle_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask):
    ids = torch.cat([prompt_ids, response_ids], 1)
    attn = torch.cat([prompt_mask, response_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
    p = prompt_ids.shape[1]
    lp = torch.log_softmax(logits[:, p - 1:-1], -1).gather(-1, response_ids[..., None]).squeeze(-1)
    return lp * response_mask


PROMPTS = ["What is 2+3?", "Compute 17-9, then add 4.", "1+1", "Say hi"]


def batch(tok, group_sizes=(3, 2, 4, 1), t=9, seed=0):
    """Rows whose prompts repeat in groups (plus one row shuffled out of its group), left-padded prompts of
    different lengths, right-padded random responses of random lengths (1..t)."""
    g = torch.Generator().manual_seed(seed)
    tok.padding_side = "left"
    enc = tok(PROMPTS[:len(group_sizes)], return_tensors="pt", padding=True, add_special_tokens=False)
    rows = torch.tensor([i for i, n in enumerate(group_sizes) for _ in range(n)])
    rows = torch.cat([rows[1:], rows[:1]])  # a group split across the ends: sharing must not need contiguity
    n = len(rows)
    resp = torch.randint(10, len(tok), (n, t), generator=g)
    lens = torch.randint(1, t + 1, (n,), generator=g)
    lens[0] = t
    mask = (torch.arange(t)[None] < lens[:, None]).long()
    resp = resp.masked_fill(mask == 0, tok.pad_token_id)
    return enc["input_ids"][rows], enc["attention_mask"][rows], resp, mask


@pytest.mark.parametrize("attention_impl", [None, "eager"])
@pytest.mark.parametrize("share", [False, True])
def test_token_logprobs_and_gradients_equal_oracle(model_tok, share, attention_impl):
    """The oracle runs the model's own attention (SDPA); ``model.attention: eager`` must give the same numbers and
    leave the model's attention as it was."""
    model, tok = model_tok
    assert model.config._attn_implementation == "sdpa"
    pi, pm, ri, rm = batch(tok)
    w = torch.randn(ri.shape, generator=torch.Generator().manual_seed(1))  # arbitrary upstream gradient

    model.zero_grad()
    ref = oracle_logprobs(model, pi, pm, ri, rm)
    (ref * w).sum().backward()
    g_ref = {k: p.grad.clone() for k, p in model.named_parameters()}

    model.zero_grad()
    lp, ent = token_logprobs(model, pi, pm, ri, rm, with_entropy=True, share_prefix=share,
                             attention_impl=attention_impl)
    assert model.config._attn_implementation == "sdpa"
    (lp * rm * w).sum().backward()
    torch.testing.assert_close(lp * rm, ref, rtol=0, atol=2e-6)
    assert torch.isfinite(ent).all() and (ent * rm).min() >= 0
    for k, p in model.named_parameters():
        scale = float(g_ref[k].abs().max())
        torch.testing.assert_close(p.grad, g_ref[k], rtol=0, atol=2e-6 * max(scale, 1e-3), msg=k)


def test_shared_prefix_runs_each_prompt_once(model_tok):
    """The shared path really shares: the backbone sees 4 distinct prompt rows, then the 10 response rows."""
    model, tok = model_tok
    pi, pm, ri, rm = batch(tok)
    seen = []
    h = model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                              with_kwargs=True)
    try:
        with torch.no_grad():
            token_logprobs(model, pi, pm, ri, rm, share_prefix=True)
            token_logprobs(model, pi, pm, ri, rm, share_prefix=False)
    finally:
        h.remove()
    n, p, t = pi.shape[0], pi.shape[1], ri.shape[1]
    assert seen == [(4, p), (n, t), (n, p + t)]


@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_recorded_logprobs_are_raw_policy_logprobs(model_tok, share, temperature, top_p, kv_cache):
    """Log-probs recorded during generation == the oracle re-forward (temperature 1, no top-p), whatever warping
    was used for sampling and whichever KV cache; EOS counted, nothing after it."""
    model, tok = model_tok
    torch.manual_seed(0)
    ro = sample_rollout(model, tok, PROMPTS[:3], k=4, max_new_tokens=12, temperature=temperature, top_p=top_p,
                        share_prefix=share, kv_cache=kv_cache)
    assert ro.response_ids.shape[0] == 12
    with torch.no_grad():
        ref = oracle_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
    torch.testing.assert_close(ro.gen_logp, ref, rtol=0, atol=2e-6)
    eos = tok.eos_token_id
    for r, m, tr in zip(ro.response_ids, ro.response_mask, ro.truncated):
        n = int(m.sum())
        assert bool(tr) == (eos not in r[:n].tolist())
        assert tr or r[n - 1] == eos and eos not in r[:n - 1].tolist()
    if temperature == 0:  # greedy: the k rows of a prompt are identical
        assert torch.equal(ro.response_ids[0], ro.response_ids[3])


def test_shared_prefix_sampling_draws_the_same_tokens(model_tok):
    """Same seed, shared-prefix prefill or not: the same responses (log-probs equal to float summation order)."""
    model, tok = model_tok
    out = []
    for share in (False, True):
        torch.manual_seed(11)
        out.append(sample_rollout(model, tok, PROMPTS, k=5, max_new_tokens=16, share_prefix=share))
    a, b = out
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    torch.testing.assert_close(a.gen_logp, b.gen_logp, rtol=0, atol=2e-6)


@pytest.mark.parametrize("share", [False, True])
def test_static_and_dynamic_kv_caches_draw_the_same_tokens(model_tok, share):
    """Same seed, the preallocated (static) or the growing (dynamic) KV cache: the same responses, log-probs equal to
    float summation order; the static cache is sized by the call (prompt + max_new_tokens), and a call after a longer
    one draws exactly what it draws first in a fresh stream."""
    model, tok = model_tok
    out = {}
    for kv in KV_CACHES:
        torch.manual_seed(5)
        out[kv] = sample_rollout(model, tok, PROMPTS, k=3, max_new_tokens=20, share_prefix=share, kv_cache=kv)
    a, b = out["static"], out["dynamic"]
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    torch.testing.assert_close(a.gen_logp, b.gen_logp, rtol=0, atol=2e-6)
    sample_rollout(model, tok, PROMPTS[1:2] * 2, k=2, max_new_tokens=40, share_prefix=share)  # a longer call first
    torch.manual_seed(5)
    again = sample_rollout(model, tok, PROMPTS, k=3, max_new_tokens=20, share_prefix=share)
    assert torch.equal(again.response_ids, a.response_ids) and torch.equal(again.gen_logp, a.gen_logp)


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_generation_shares_the_prefix_with_either_kv_cache(model_tok, kv_cache):
    """With share_prefix, generation runs each prompt's first P-1 tokens once (U rows), then only new tokens for the
    N = U*k rows: the prefix reaches the (static or dynamic) cache, nothing re-runs it."""
    model, tok = model_tok
    seen = []
    h = model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                              with_kwargs=True)
    try:
        sample_rollout(model, tok, PROMPTS, k=3, max_new_tokens=6, share_prefix=True, kv_cache=kv_cache)
    finally:
        h.remove()
    p = max(len(tok(x, add_special_tokens=False)["input_ids"]) for x in PROMPTS)
    assert seen[0] == (4, p - 1)  # the distinct prompts, once
    assert all(shape == (12, 1) for shape in seen[1:]) and len(seen) >= 2  # then one token per row per step


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_generate_is_never_compiled(model_tok, kv_cache, monkeypatch):
    """On CUDA with a static cache, generate() compiles the forward with CUDA graphs unless told not to; the compiled
    graph then overwrites the logits the log-prob hook keeps between steps (seen on an H100: training stopped). The
    engine passes disable_compile, and generate() must take it (CUDA runs: tests/trainer/test_cuda.py)."""
    model, tok = model_tok
    seen = []
    real = model.generate

    def spy(*a, generation_config=None, **kw):
        seen.append(generation_config.disable_compile)
        return real(*a, generation_config=generation_config, **kw)

    monkeypatch.setattr(model, "generate", spy)
    sample_rollout(model, tok, PROMPTS[:1], k=2, max_new_tokens=4, kv_cache=kv_cache)
    assert seen == [True]


def test_an_unknown_kv_cache_is_refused(model_tok):
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        sample_rollout(*model_tok, PROMPTS[:1], k=2, max_new_tokens=4, kv_cache="paged")


def test_model_generation_defaults_do_not_change_the_policy(model_tok):
    """A repetition penalty (or top-k) in the model's generation config must not warp RL/eval sampling: the sampler
    builds its own generation config from temperature/top_p only."""
    model, tok = model_tok
    gc = model.generation_config
    out = []
    for penalty in (None, 5.0):
        saved = (gc.repetition_penalty, gc.top_k, gc.no_repeat_ngram_size)
        if penalty:
            gc.repetition_penalty, gc.top_k, gc.no_repeat_ngram_size = penalty, 3, 1
        try:
            out.append(HFEngine(model, tok, autocast="off").sample(PROMPTS[:2], k=3, temperature=1.0, top_p=1.0,
                                                                   max_new_tokens=10, seed=4).samples(3))
        finally:
            gc.repetition_penalty, gc.top_k, gc.no_repeat_ngram_size = saved
    assert [[s.token_ids for s in r] for r in out[0]] == [[s.token_ids for s in r] for r in out[1]]
    assert gc.repetition_penalty == saved[0]  # the model's own config is restored


@pytest.mark.parametrize("share", [False, True])
def test_recorded_token_statistics_equal_the_oracle_distribution(model_tok, share):
    """record_stats: entropy, KL(U || p) and the top-20 confidence recorded during generation equal those of the
    oracle's full-logits distribution at each response position (computed here from the definitions), are 0 at
    padding, and recording them changes no sampled token or log-prob."""
    model, tok = model_tok
    out = []
    for stats in (False, True):
        torch.manual_seed(3)
        out.append(sample_rollout(model, tok, PROMPTS[:3], k=4, max_new_tokens=12, temperature=0.8, top_p=0.9,
                                  share_prefix=share, record_stats=stats))
    plain, ro = out
    assert plain.token_stats is None
    assert torch.equal(plain.response_ids, ro.response_ids) and torch.equal(plain.gen_logp, ro.gen_logp)
    ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.response_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn,
                       position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits.double()
    lp = torch.log_softmax(logits[:, ro.prompt_ids.shape[1] - 1:-1], -1)  # [N, T, V]
    v = lp.shape[-1]
    want = {"entropy": -(lp.exp() * lp).sum(-1),
            "kl_uniform": (-(lp + torch.log(torch.tensor(float(v), dtype=torch.float64)))).mean(-1),
            "topk_conf": -lp.topk(20, dim=-1).values.mean(-1)}
    m = ro.response_mask.bool()
    assert set(ro.token_stats) == set(want)
    for name, w in want.items():
        got = ro.token_stats[name]
        assert got.shape == ro.gen_logp.shape
        torch.testing.assert_close(got[m].double(), w[m], rtol=0, atol=2e-5, msg=name)
        assert bool((got[~m] == 0).all())
    samples = ro.samples(4)
    first = samples[1][2]
    n = first.n_tokens
    assert first.token_stats["entropy"] == ro.token_stats["entropy"][6, :n].tolist()


@pytest.mark.parametrize("k,heads,kv_heads,written", [(3, 4, 2, 5), (2, 4, 4, 1), (4, 6, 2, 9)])
def test_grouped_prefix_attention_equals_sdpa(k, heads, kv_heads, written):
    """One decoding step: each group's k rows share their first P cache positions (left padding differing between
    groups), each row has ``written`` response positions of its own and unwritten preallocated ones after them.
    The grouped attention == transformers' SDPA over the full rows; calls it does not handle go to SDPA itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from capo.rollout.prefix import GroupedPrefixAttention

    g = torch.Generator().manual_seed(k * 100 + written)
    b, p, length, d = 3, 7, 20, 8
    n = b * k
    key, value = torch.randn(n, kv_heads, length, d, generator=g), torch.randn(n, kv_heads, length, d, generator=g)
    for t in (key, value):  # the prefix is a copy per group, as shared_prefix leaves the cache
        t[:, :, :p] = t[::k, :, :p].repeat_interleave(k, 0)
    query = torch.randn(n, 1, heads, d, generator=g).transpose(1, 2)
    pads = torch.tensor([0, 2, 4])[:b].repeat_interleave(k)
    pos = torch.arange(length)
    mask = ((pos[None] >= pads[:, None]) & (pos[None] < p + written))[:, None, None, :]
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx = heads // kv_heads, 0
    attend = GroupedPrefixAttention(k, p)
    out, _ = attend(module, query, key, value, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert out.shape == ref.shape == (n, 1, heads, d)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    assert attend._prefix[0][0].shape == (b, kv_heads, p, d)  # the prefix is held once per group
    q2 = torch.randn(n, heads, 2, d, generator=g)  # two query tokens: not a decoding step
    mask2 = mask.expand(n, 1, 2, length)
    assert torch.equal(attend(module, q2, key, value, mask2, scaling=0.3)[0],
                       sdpa_attention_forward(module, q2, key, value, mask2, scaling=0.3)[0])


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_grouped_prefix_attention_draws_the_same_tokens(model_tok, kv_cache, monkeypatch):
    """Sampling with the grouped prefix attention (default) or SDPA over the k copies: same seed, the same responses,
    log-probs equal to float summation order; every decoding step took the grouped path, and the model's attention
    implementation is SDPA again afterwards."""
    from capo.rollout.prefix import GroupedPrefixAttention

    model, tok = model_tok
    assert model.config._attn_implementation == "sdpa"
    taken = []
    applies = GroupedPrefixAttention._applies
    monkeypatch.setattr(GroupedPrefixAttention, "_applies", lambda self, *a: taken.append(applies(self, *a)) or
                        taken[-1])
    out = {}
    for grouped in (True, False):
        torch.manual_seed(3)
        out[grouped] = sample_rollout(model, tok, PROMPTS, k=3, max_new_tokens=20, kv_cache=kv_cache,
                                      prefix_attention=grouped)
    a, b = out[True], out[False]
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    torch.testing.assert_close(a.gen_logp, b.gen_logp, rtol=0, atol=2e-6)
    n_layers = model.config.num_hidden_layers
    assert len(taken) == n_layers * a.response_ids.shape[1] and all(taken)  # only the grouped run, every step
    assert model.config._attn_implementation == "sdpa"


def test_grouped_prefix_attention_restores_the_model_and_leaves_other_attention_alone(model_tok):
    """The model is on SDPA again after the block (also when it raises), the registered function holds no prefix
    copy afterwards, and a model without groups, without a shared prefix or not on SDPA is left alone."""
    from transformers import AttentionInterface

    from capo.rollout.prefix import GROUPED_PREFIX_ATTENTION, grouped_prefix_attention

    model, _ = model_tok
    with pytest.raises(RuntimeError, match="inside"):
        with grouped_prefix_attention(model, 3, 5):
            assert model.config._attn_implementation == GROUPED_PREFIX_ATTENTION
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    torch.manual_seed(0)
    sample_rollout(model, model_tok[1], PROMPTS, k=3, max_new_tokens=4)
    assert not AttentionInterface._global_mapping[GROUPED_PREFIX_ATTENTION]._prefix
    with grouped_prefix_attention(model, 1, 5), grouped_prefix_attention(model, 3, 0):
        assert model.config._attn_implementation == "sdpa"  # no groups, or no shared prefix: unchanged
    model.config._attn_implementation = "eager"
    try:
        with grouped_prefix_attention(model, 3, 5):
            assert model.config._attn_implementation == "eager"  # only SDPA models are switched
    finally:
        model.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_the_kv_cache_goes_by_the_name_the_installed_transformers_takes(model_tok, kv_cache):
    """transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40); the vLLM
    environments pin older versions. capo passes and reads the cache under the installed version's name: no
    deprecation warning on the shared-prefix forward or in generation."""
    import warnings

    model, tok = model_tok
    pi, pm, ri, rm = batch(tok)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        with torch.no_grad():
            token_logprobs(model, pi, pm, ri, rm, share_prefix=True)
        sample_rollout(model, tok, PROMPTS[:2], k=3, max_new_tokens=4, share_prefix=True, kv_cache=kv_cache)


def test_cache_names_on_either_side_of_the_rename():
    import dataclasses

    from capo.rollout.prefix import cache_kwarg, output_cache

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None): ...

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None): ...

    assert (cache_kwarg(New()), cache_kwarg(Old())) == ("cache", "past_key_values")
    NewOut = dataclasses.make_dataclass("NewOut", ["last_hidden_state", "cache"])
    OldOut = dataclasses.make_dataclass("OldOut", ["last_hidden_state", "past_key_values"])
    assert output_cache(NewOut(0, "c")) == "c" and output_cache(OldOut(0, "p")) == "p"
    assert output_cache(object()) is None  # no cache field at all: the caller runs its plain forward


def test_eager_attention_runs_eager_and_is_restored(model_tok, monkeypatch):
    """``attention_impl="eager"`` really switches the log-prob forward to transformers' eager attention (counted),
    restores SDPA even when the forward raises, and refuses an unknown implementation."""
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    from capo.rollout.logprobs import attention

    model, tok = model_tok
    pi, pm, ri, rm = batch(tok)
    calls = []
    real = qwen2.eager_attention_forward
    monkeypatch.setattr(qwen2, "eager_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        token_logprobs(model, pi, pm, ri, rm)
        assert calls == []
        token_logprobs(model, pi, pm, ri, rm, attention_impl="eager")
    assert len(calls) >= model.config.num_hidden_layers and model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), attention(model, "eager"):
        assert model.config._attn_implementation == "eager"
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="attention 'flash' is not allowed; allowed values: sdpa, eager"):
        with attention(model, "flash"):
            pass

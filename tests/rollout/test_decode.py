"""capo's static-cache decoding loop (``rollout.decode``, capo.rollout.decode) samples what ``generate`` samples.

On the CPU the loop runs eagerly, and at a fixed seed it must draw the very tokens ``generate`` draws (the same
logits processors, the same ``torch.multinomial`` calls on the same RNG stream, which must end in the same state),
with log-probs and per-token statistics equal to ``generate``'s hook to 1e-5 and to an independent re-forward
(``oracle_logprobs``). The compiled step is traced whole (``fullgraph``, the "aot_eager" backend: what CUDA graphs
need) and reused across rollouts without recompiling; a cache kept between rollouts never leaks into the next one.
On a CUDA device (tests/_device.py) the default ``auto`` runs the step as a CUDA graph, checked against the oracle.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from capo.errors import ConfigError
from capo.rollout import HFEngine, load_model, sample_rollout, token_logprobs
from capo.rollout.decode import CACHE_BUCKET, MAX_CACHES, StaticDecoder, new_static_cache, use_static_decoder
from capo.rollout.engine import DECODERS
from capo.tasks.generated import generated_task
from capo.trainer.config import load_config

from _cycles import left_to_the_cyclic_collector  # noqa: E402  (tests/ is on sys.path: its conftest.py)
from _device import DEVICE  # noqa: E402
from test_forward_equivalence import PROMPTS, oracle_logprobs  # noqa: E402

# the default task's first 6 eval prompts at seed 3, written out: its generator (reasoning_gym) is missing on the GPU
# image, where this file runs too (test_the_default_prompts_are_the_tasks checks them where it is installed)
DEFAULT_PROMPTS = ["8+4+4=", "0-0+3=", "8+3+2+1=", "6-1-5+1+3=", "1-5+1-2=", "0+0="]
DEVICE_CPU = torch.device("cpu")
SETTINGS = [dict(temperature=1.0, top_p=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=0.0, top_p=1.0)]


@pytest.fixture(scope="module")
def models(tiny_model):
    """A random 2-layer Qwen2 with grouped KV heads (responses run to the length limit) and the shipped default
    Llama (responses end with EOS at different lengths), with prompts of different lengths for each."""
    return {"tiny": (*load_model(tiny_model), PROMPTS, 12), "default": (*load_model("default"), DEFAULT_PROMPTS, 40)}


def _sample(engine, prompts, max_new, seed, **kw):
    torch.manual_seed(seed)
    out = engine.sample(prompts, k=3, max_new_tokens=max_new, **kw)
    return out, torch.get_rng_state()


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1", "t0.7-p0.9", "greedy"])
@pytest.mark.parametrize("name", ["tiny", "default"])
def test_the_loop_draws_the_tokens_generate_draws(models, name, sampling, share):
    """Against generate with transformers' SDPA attention (prefix_attention=False: the same attention the loop
    runs): the same tokens and RNG stream, the log-probs and statistics to float32 rounding, 1e-5 (measured:
    identical on an Intel Xeon; up to 2.7e-6 on an AMD EPYC with AVX-512, where attention over the static cache
    sums in another order). The engines' defaults (generate with the grouped prefix attention) differ in summation
    order only: tokens equal, 3e-5."""
    model, tok, prompts, max_new = models[name]
    common = dict(k=3, max_new_tokens=max_new, share_prefix=share, record_stats=True, **sampling)
    torch.manual_seed(11)
    a = sample_rollout(model, tok, prompts, prefix_attention=False, **common)
    rng_a = torch.get_rng_state()
    torch.manual_seed(11)
    b = sample_rollout(model, tok, prompts, decoder=StaticDecoder(model), **common)
    assert torch.equal(torch.get_rng_state(), rng_a)  # the same draws from the global RNG, no more and no fewer
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert a.texts == b.texts and torch.equal(a.truncated, b.truncated)
    torch.testing.assert_close(b.gen_logp, a.gen_logp, atol=1e-5, rtol=0)
    for key in a.token_stats:
        torch.testing.assert_close(b.token_stats[key], a.token_stats[key], atol=1e-5, rtol=0)
    if name == "default":  # the shipped model ends responses with EOS: rows of different lengths were checked
        assert len(set(b.response_mask.sum(1).tolist())) > 1
    c, _ = _sample(HFEngine(model, tok, decode="graph", share_prefix=share), prompts, max_new, 11, **sampling)
    d, _ = _sample(HFEngine(model, tok, decode="generate", share_prefix=share), prompts, max_new, 11, **sampling)
    assert torch.equal(c.response_ids, d.response_ids) and torch.equal(c.response_ids, b.response_ids)
    torch.testing.assert_close(c.gen_logp, d.gen_logp, atol=3e-5, rtol=0)


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_the_loop_records_the_raw_policy_logprobs(models, name):
    """Under temperature and top-p warping, the recorded log-probs are the raw temperature-1 ones of a re-forward."""
    model, tok, prompts, max_new = models[name]
    ro, _ = _sample(HFEngine(model, tok, decode="graph"), prompts, max_new, 5, temperature=0.7, top_p=0.9)
    with torch.no_grad():
        ref = oracle_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
    torch.testing.assert_close(ro.gen_logp, ref, atol=1e-5, rtol=0)


def test_the_compiled_step_is_traced_whole_and_reused(models, monkeypatch):
    """fullgraph=True (a graph break would raise) on the "aot_eager" backend; three rollouts of different prompts in
    one cache bucket compile once (a recompile raises, and the fallback that would catch it warns: an error here),
    keep the cache's addresses, and give the eager loop's numbers."""
    model, tok, prompts, max_new = models["default"]
    compiled, eager = HFEngine(model, tok, decode="graph"), HFEngine(model, tok, decode="graph")
    compiled._decoder = StaticDecoder(model, backend="aot_eager")
    addresses = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, chunk in enumerate([prompts[:3], prompts[3:], prompts[1:4]]):
            if i == 1:
                monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
            a, _ = _sample(compiled, chunk, max_new, i)
            b, _ = _sample(eager, chunk, max_new, i)
            assert torch.equal(a.response_ids, b.response_ids)
            torch.testing.assert_close(a.gen_logp, b.gen_logp, atol=1e-6, rtol=0)
            addresses.add(tuple(layer.keys.data_ptr() for layer in compiled._decoder.cache.layers))
    assert len(addresses) == 1
    assert compiled._decoder.compiled  # never fell back to eager


def test_a_kept_cache_never_leaks_into_the_next_rollout(models):
    """A rollout after a longer one in the same cache gives exactly what a fresh decoder gives."""
    model, tok, prompts, max_new = models["tiny"]
    used, fresh = HFEngine(model, tok, decode="graph"), HFEngine(model, tok, decode="graph")
    _sample(used, prompts, max_new, 1)
    a, _ = _sample(used, prompts[:2][::-1] + prompts[2:], max_new, 2)
    b, _ = _sample(fresh, prompts[:2][::-1] + prompts[2:], max_new, 2)
    assert used._decoder.cache is not None and torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.gen_logp, b.gen_logp)


def test_the_cache_length_is_rounded_up_to_a_bucket_and_a_cache_is_kept_per_row_count(models):
    model, tok, prompts, _ = models["tiny"]
    engine = HFEngine(model, tok, decode="graph")
    p = max(len(tok(x, add_special_tokens=False)["input_ids"]) for x in prompts)
    _sample(engine, prompts, 12, 0)
    first = engine._decoder.cache
    want = -(-(p + 12) // CACHE_BUCKET) * CACHE_BUCKET
    assert want % CACHE_BUCKET == 0 and want >= p + 12
    assert [layer.max_cache_len for layer in first.layers] == [want] * len(first.layers)
    _sample(engine, prompts, 12, 1)
    assert engine._decoder.cache is first  # same shape: the same cache, zeroed in place
    _sample(engine, prompts[:2], 12, 1)
    assert engine._decoder.cache is not first  # fewer rows: a cache of their own
    _sample(engine, prompts, 12, 2)
    assert engine._decoder.cache is first  # and back: the first one, still kept
    _sample(engine, prompts, want - p + 1, 3)  # one position too many: the cache grows by a bucket
    grown = engine._decoder.cache
    assert grown is not first and grown.layers[0].max_cache_len == want + CACHE_BUCKET
    _sample(engine, prompts, 12, 4)
    assert engine._decoder.cache is grown  # a cache never shrinks: what fits decodes in it
    for n in range(1, MAX_CACHES + 2):
        _sample(engine, prompts[:1] * n, 2, 5)
    assert list(engine._decoder.caches) == [(3 * n, DEVICE_CPU) for n in range(2, MAX_CACHES + 2)]  # the latest


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_a_longer_kept_cache_gives_a_fresh_caches_numbers(models, name):
    """Rows decoded in a cache grown by a longer rollout (more positions, hidden by the mask) get exactly the tokens
    and log-probs a decoder with a cache of their own length gives."""
    model, tok, prompts, max_new = models[name]
    used, fresh = HFEngine(model, tok, decode="graph"), HFEngine(model, tok, decode="graph")
    _sample(used, prompts, max_new + 3 * CACHE_BUCKET, 1)
    a, _ = _sample(used, prompts, max_new, 2)
    b, _ = _sample(fresh, prompts, max_new, 2)
    assert used._decoder.cache.layers[0].max_cache_len > fresh._decoder.cache.layers[0].max_cache_len
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.gen_logp, b.gen_logp, atol=1e-6, rtol=0)  # measured: identical


def test_a_failing_compiled_step_falls_back_to_the_same_numbers(models):
    """A compiled step that writes the cache and then fails (a broken Triton, say): the loop warns, restores the
    cache to the positions written before the step and goes on eagerly, with the eager loop's exact numbers."""
    model, tok, prompts, max_new = models["default"]
    broken, eager = HFEngine(model, tok, decode="graph"), HFEngine(model, tok, decode="graph")
    decoder = broken._decoder = StaticDecoder(model)
    calls = []

    def writes_then_fails(tokens, positions, mask):
        decoder._forward(tokens, positions, mask)  # the cache now holds one position too many
        calls.append(1)
        raise RuntimeError("no working Triton")

    decoder._step, decoder.compiled = writes_then_fails, True  # as a compiled step
    with pytest.warns(UserWarning, match="compiled decoding step failed .*no working Triton"):
        a, _ = _sample(broken, prompts, max_new, 4)
    b, _ = _sample(eager, prompts, max_new, 4)
    assert calls == [1] and not decoder.compiled
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.gen_logp, b.gen_logp)


def test_bf16_autocast_decodes_with_fp32_keys_beside_bf16_values(models):
    """Under bf16 autocast RoPE returns fp32 keys beside bf16 values; the static cache keeps each in its own dtype
    (generate falls back to the growing cache there). The log-probs are a bf16 forward's: within bf16 noise of a
    bf16 re-forward over the sampled tokens (0.09 measured; generate's own hook: 0.32)."""
    model, tok, prompts, max_new = models["default"]
    engine = HFEngine(model, tok, decode="graph", autocast="on")
    ro, _ = _sample(engine, prompts, max_new, 1)
    layer = engine._decoder.cache.layers[0]  # values: bf16 where transformers keeps each dtype (5.24), else fp32
    assert layer.keys.dtype == torch.float32 and layer.values.dtype in (torch.bfloat16, torch.float32)
    with torch.no_grad():
        ref = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask,
                             autocast_bf16=True)
    m = ro.response_mask.bool()
    assert torch.isfinite(ro.gen_logp).all() and (ro.gen_logp - ref)[m].abs().max() < 0.2


def test_which_loop_each_setting_selects():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    table = {(d, dev.type): use_static_decoder(d, dev) for d in DECODERS for dev in (cpu, cuda)}
    assert table == {("auto", "cpu"): False, ("auto", "cuda"): True, ("generate", "cpu"): False,
                     ("generate", "cuda"): False, ("graph", "cpu"): True, ("graph", "cuda"): True}
    with pytest.raises(ValueError, match="decode must be one of"):
        use_static_decoder("cudagraph", cpu)


def test_the_engine_refuses_what_the_loop_cannot_do(models, monkeypatch):
    model, tok, prompts, _ = models["tiny"]
    with pytest.raises(ValueError, match="decode must be one of"):
        HFEngine(model, tok, decode="graphs")
    with pytest.raises(ValueError, match="needs kv_cache='static'"):
        HFEngine(model, tok, decode="graph", kv_cache="dynamic")
    assert HFEngine(model, tok, decode="auto", kv_cache="dynamic").decoder(torch.device("cuda")) is None
    monkeypatch.setattr(model, "_supports_default_dynamic_cache", lambda: False)
    assert HFEngine(model, tok, decode="auto").decoder(torch.device("cuda")) is None  # generate instead
    with pytest.raises(ValueError, match="needs a model that takes a static KV cache"):
        HFEngine(model, tok, decode="graph").sample(prompts, k=2, max_new_tokens=3)


def test_the_config_refuses_an_unknown_loop_and_graph_without_the_static_cache(tiny_model, tmp_path):
    base = {"model.path": tiny_model, "run.out_dir": str(tmp_path)}
    assert load_config(None, base).rollout.decode == "auto"
    with pytest.raises(ConfigError, match="rollout.decode"):
        load_config(None, {**base, "rollout.decode": "cuda"})
    with pytest.raises(ConfigError, match="rollout.decode=graph .* needs rollout.kv_cache=static"):
        load_config(None, {**base, "rollout.decode": "graph", "rollout.kv_cache": "dynamic"})


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (and CAPO_TEST_DEVICE unset or cuda)")
def test_on_cuda_auto_runs_the_step_as_a_cuda_graph(models):
    """The default on a GPU: the compiled step (CUDA graphs), reused across rollouts, with the raw policy's
    log-probs (against the oracle on the same device) and the tokens generate draws in nearly every row (the
    compiled kernels sum in another order, which may flip a near-tie)."""
    _, _, prompts, max_new = models["default"]
    model, tok = load_model("default")
    model = model.to("cuda")
    loop, gen = HFEngine(model, tok), HFEngine(model, tok, decode="generate")
    for seed in range(3):
        a, _ = _sample(loop, prompts, max_new, seed)
        b, _ = _sample(gen, prompts, max_new, seed)
        assert loop._decoder.graphs and loop._decoder.compiled
        with torch.no_grad():
            ref = oracle_logprobs(model, a.prompt_ids, a.prompt_mask, a.response_ids, a.response_mask)
        torch.testing.assert_close(a.gen_logp, ref, atol=1e-4, rtol=0)
        t = min(a.response_ids.shape[1], b.response_ids.shape[1])
        same = (a.response_ids[:, :t] == b.response_ids[:, :t]).all(1).float().mean()
        assert same >= 0.9


def test_a_finished_row_continues_with_the_pad_token(models):
    """StaticDecoder.decode itself (below the engine's masking): after a row's first EOS every token is the pad
    token, as generate pads finished rows."""
    model, tok, prompts, max_new = models["default"]
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = StaticDecoder(model).decode(enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new,
                                      temperature=1.0, top_p=1.0, eos=[tok.eos_token_id], pad=tok.pad_token_id)
    is_eos = out.tokens == tok.eos_token_id
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    assert after.any() and (out.tokens[after] == tok.pad_token_id).all()
    assert (out.tokens[~after] != tok.pad_token_id).all()


def test_the_default_prompts_are_the_tasks():
    pytest.importorskip("reasoning_gym", reason="the default task's generator is not installed")
    task = generated_task("default")
    assert [task.prompt(p) for p in task.problems("eval", 6, seed=3)] == DEFAULT_PROMPTS


def test_a_static_layer_casts_writes_to_the_dtypes_it_holds(models):
    """A layer that holds fp32 values (transformers 5.17 allocates values in the keys' dtype; a DynamicCache prefix
    upcasts them) takes a later bf16 write, upcast exactly; keys likewise. Without the cast: index_copy_ fails."""
    model = models["default"][0]
    layer = new_static_cache(model, CACHE_BUCKET).layers[0]
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(2, 4, 3, 24, generator=g) for _ in range(2))
    layer.update(k, v)
    k2, v2 = (torch.randn(2, 4, 1, 24, generator=g).to(torch.bfloat16) for _ in range(2))
    keys, values = layer.update(k2, v2)
    assert (keys.dtype, values.dtype) == (torch.float32, torch.float32)
    assert torch.equal(values[:, :, :3], v) and torch.equal(values[:, :, 3:4], v2.float())
    assert torch.equal(keys[:, :, 3:4], k2.float()) and not values[:, :, 4:].any()


@pytest.mark.parametrize("decode", ["generate", "graph"])
def test_a_sampling_call_leaves_no_tensor_in_a_reference_cycle(models, decode):
    """Reference counting frees every cache a rollout made: a cycle through a static layer kept each call's cache
    (12 tensors; 3.2 GB at the reasoning testbed's mask calibration) until Python's cyclic collector ran, and a
    testbed run grew to 8.5 GB resident. The decoder's own kept cache is live, not garbage."""
    model, tok, prompts, max_new = models["default"]
    engine = HFEngine(model, tok, decode=decode)
    garbage = left_to_the_cyclic_collector(lambda: [_sample(engine, prompts[:2], max_new, seed=0) for _ in range(2)])
    left = [type(o).__name__ for o in garbage if isinstance(o, torch.Tensor) or "Layer" in type(o).__name__]
    assert left == []


def test_training_with_the_loop_logs_what_training_with_generate_logs(tmp_path):
    """Two CAPO steps on the embedded default task, rollout.decode=graph against generate: the same rewards and
    lengths (the same tokens), every other logged number within float noise (the log-probs agree to 1e-5)."""
    pytest.importorskip("reasoning_gym", reason="the default task's generator is not installed")
    from capo.trainer.loop import Trainer

    over = {"algo.name": "capo", "run.steps": 2, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
            "data.n_eval": 4, "run.eval_samples": 2, "run.eval_every": 2, "run.threads": 1, "run.progress": False}
    logs = {}
    for decode in ("generate", "graph"):
        out = tmp_path / decode
        Trainer(load_config("default", {**over, "rollout.decode": decode, "run.out_dir": str(out)})).train()
        logs[decode] = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    for a, b in zip(logs["generate"], logs["graph"], strict=True):
        assert a.keys() == b.keys()
        for key in ("train/reward_mean", "train/accuracy", "train/response_len", "train/truncated_frac"):
            assert a[key] == b[key], key
        for key in a:
            if not key.startswith("time/") and isinstance(a[key], float):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key

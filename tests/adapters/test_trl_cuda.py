"""CapoGRPOTrainer in bf16 on a CUDA GPU (a user's bf16 TRL script on an H200 is the path most users take).

TRL's bf16=True runs the policy's forwards under bf16 autocast. CAPO must still rank temperature-1 log-probs held in
float32 or wider, as every other path does (capo's trainer: bf16 matmuls, float32 log-softmax), and the noise mask
must act. Recomputed independently on the GPU: a float32 copy of the policy and of the reference, no autocast, full
logits. Skipped unless the test device (tests/_device.py) is cuda with bf16: CI has no GPU; `sh scripts/gpu-check.sh`
runs it.
"""

from __future__ import annotations

import math

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

import torch  # noqa: E402

from capo.core import capo_noise_mask, compute_advantages, sequence_logprob_mean  # noqa: E402
from _tiny import DEVICE, cpu_copy, dataset, grpo_args, raw_token_logps, reference_model, seven_reward  # noqa: E402

pytestmark = pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_bf16_supported(),
                                reason="needs a CUDA GPU with bf16 (and CAPO_TEST_DEVICE unset or cuda)")
G, TEMPERATURE = 4, 0.7
BF16_TOL = 0.05  # |bf16-autocast lpm - float32 lpm| allowed on this tiny model (not yet measured on a GPU)


def _fp32_copy(model, model_dir):
    """A float32 copy of ``model``'s current weights in a fresh module: TRL's autocast wrapper is not copied."""
    fresh = reference_model(model_dir)
    fresh.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return fresh


def _probe(model_dir):
    from capo.adapters.trl import CapoGRPOTrainer

    class Probe(CapoGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            policy = _fp32_copy(self.accelerator.unwrap_model(self.model), model_dir)  # the policy that generated
            with torch.autocast("cuda", enabled=False):
                rec = {"lp": raw_token_logps(policy, out), "lp_scaled": raw_token_logps(policy, out, TEMPERATURE),
                       "ref": raw_token_logps(self.probe_ref, out)}
            self.records = getattr(self, "records", []) + [{"out": cpu_copy(out), "batch": dict(self.capo_last_batch),
                                                            **rec}]
            return out

    Probe.probe_ref = reference_model(model_dir)
    return Probe


def _check_batch(rec) -> tuple[int, int]:
    """One generation batch: scores are float32+ temperature-1 log-prob means, the mask is the fixed rule on the
    reference PPL, and the advantages are capo core's on them. Returns (kept, rows)."""
    b, mask = rec["batch"], rec["out"]["completion_mask"]
    rows = mask.bool().any(-1)
    scores = b["scores"]
    assert scores.dtype in (torch.float32, torch.float64)
    raw, scaled = (sequence_logprob_mean(rec[k], mask) for k in ("lp", "lp_scaled"))
    err_raw, err_scaled = ((scores - x)[rows].abs().max().item() for x in (raw, scaled))
    print(f"bf16 lpm vs float32 at temperature 1: {err_raw:.2e}; vs temperature {TEMPERATURE}: {err_scaled:.2e}")
    assert err_raw <= BF16_TOL and err_raw < err_scaled / 2, (err_raw, err_scaled)  # temperature 1, not TRL's 0.7
    ppl = torch.exp(-sequence_logprob_mean(rec["ref"], mask))
    low, high = b["mask_thresholds"]  # the quantile rule's, from the first batch's PPL_ref
    want = capo_noise_mask(ppl, b["correct"], low=low, high=high)
    near = ((ppl - low).abs() < 0.01 * low) | ((ppl - high).abs() < 0.01 * high)  # a rounding may flip these
    assert torch.equal(b["keep"][~near], want[~near])
    exp = compute_advantages("capo", b["rewards"], G, scores=scores.double(), keep=b["keep"] & rows,
                             correct=b["correct"], partners=rows, tau=0.6)
    torch.testing.assert_close(rec["out"]["advantages"].double(), exp, rtol=0, atol=1e-5)  # TRL holds float32
    return int((b["keep"] & rows).sum()), int(rows.sum())


def test_bf16_capo_run_on_cuda_ranks_fp32_temperature1_logprobs(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}, noise_mask="quantile",
                              mask_q_low=0.3, mask_q_high=0.7)
    tr = _probe(tiny_model_dir)(model=tiny_model_dir, reward_funcs=seven_reward, train_dataset=dataset(),
                                args=grpo_args(tmp_path / "out", bf16=True, temperature=TEMPERATURE, max_steps=3),
                                processing_class=AutoTokenizer.from_pretrained(tiny_model_dir), capo=cfg)
    assert tr.args.bf16 and not tr.args.use_cpu and tr.accelerator.device.type == "cuda"
    init = {k: v.detach().float().cpu().clone() for k, v in tr.accelerator.unwrap_model(tr.model).state_dict().items()}
    tr.train()
    assert len(tr.records) == 3
    kept, rows = map(sum, zip(*(_check_batch(r) for r in tr.records)))
    assert 0 < kept < rows, "the noise mask should drop some but not all responses"
    logged = [h for h in tr.state.log_history if "calib/auroc" in h or "calib/accuracy" in h]
    assert logged, "no calib/* logged"
    for key in ("calib/accuracy", "calib/ece", "train/masked_frac"):
        vals = [h[key] for h in logged if key in h]
        assert vals and all(math.isfinite(v) for v in vals), (key, vals)
    assert any("time/capo_extra_forward_s" in h for h in tr.state.log_history)
    now = tr.accelerator.unwrap_model(tr.model).state_dict()
    moved = max((now[k].detach().float().cpu() - v).abs().max().item() for k, v in init.items())
    assert moved > 1e-4, "three bf16 steps did not move the policy"

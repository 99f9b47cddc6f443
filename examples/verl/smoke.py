"""Smoke twin of run_capo_qwen2.5_math_1.5b.sh: capo's CAPO inside verl's own algorithm code, offline, on a CPU.

    .venv-verl/bin/python examples/verl/smoke.py            # 3 steps, embedded model and task, ~1 minute

What runs, per step, with the full script's algorithm settings (CAPO with the reference-perplexity noise mask, PPO
clip 0.2, token-mean loss, temperature 1, binary correctness reward):
  1. sampling: capo's HF sampler on capo's embedded default model (0.37M parameters, no download) for B prompts of
     its chain-sum task x n responses -- the full script's vLLM rollout has no CPU build verl can use;
  2. reward: ``examples/verl/capo_reward.py:compute_score_correctness``, the same function the full script names;
  3. old-policy and reference log-probs of the responses (the reference is the initial model, frozen);
  4. a verl ``DataProto`` with the fields verl's trainer holds at this point, and verl's own
     ``ray_trainer.compute_advantage(adv_estimator="capo")``, which reaches capo through the plugin verl loaded by
     itself (entry point ``verl.plugins``);
  5. verl's own policy loss (``core_algos.get_policy_loss_fn("vanilla")``, ``agg_loss`` token-mean) on the current
     policy's log-probs, backward, one AdamW step.
What does not run here: verl's Ray workers, FSDP, its rollout engines and its trainer loop (``main_ppo``); on a CPU
they run only through the test-only shims of ``tests/adapters/verl_cpu_shim.py`` (``test_verl_main_ppo.py``;
docs/engines.md lists the blockers). A GPU user runs the full script.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (verl's data.train_batch_size)")
    ap.add_argument("--n", type=int, default=8, help="responses per prompt (verl's actor_rollout_ref.rollout.n)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (the embedded model's scale)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if min(a.steps, a.prompts, a.n) < 1 or a.n < 2 or not a.lr > 0:
        ap.error("--steps, --prompts >= 1, --n >= 2 and --lr > 0")
    return a


def verl_batch(ro, rewards, correct, old, ref, n: int):
    """The batch verl's trainer holds before its advantage step: reward on the last response token, uids per prompt,
    the reward function's verdicts in non_tensor_batch."""
    from verl import DataProto

    mask = ro.response_mask.float()
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    tok_r = torch.zeros_like(mask)
    tok_r[torch.arange(len(rewards)), last] = rewards
    uid = np.array([f"p{i // n}" for i in range(len(rewards))], dtype=object)
    return DataProto.from_dict(
        tensors={"responses": ro.response_ids, "response_mask": mask, "token_level_scores": tok_r,
                 "token_level_rewards": tok_r, "old_log_probs": old, "ref_log_prob": ref},
        non_tensors={"uid": uid, "correct": np.array(correct, dtype=object)})


def policy_loss(model, ro, data, actor_cfg):
    """verl's vanilla PPO-clip loss on the current policy's log-probs (token-mean over the batch)."""
    from verl.trainer.ppo import core_algos

    from capo.rollout import token_logprobs

    logp = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
    actor_cfg.global_batch_info["batch_num_tokens"] = int(data.batch["response_mask"].sum())
    fn = core_algos.get_policy_loss_fn("vanilla")
    loss, metrics = fn(old_log_prob=data.batch["old_log_probs"], log_prob=logp, advantages=data.batch["advantages"],
                       response_mask=data.batch["response_mask"], loss_agg_mode="token-mean", config=actor_cfg)
    return loss, metrics


def step(i, a, model, ref_model, engine, problems, opt, algo_cfg, actor_cfg) -> dict:
    from verl.trainer.ppo import ray_trainer as rt

    from capo.adapters.verl_plugin import compute_score_correctness
    from capo.rollout import token_logprobs
    from capo.tasks.prompts import render_problem

    t0 = time.perf_counter()
    batch = problems[i * a.prompts:(i + 1) * a.prompts]
    prompts = [render_problem(engine.tokenizer, p, dataset="default") for p in batch]
    model.eval()
    ro = engine.sample(prompts, k=a.n, max_new_tokens=64, temperature=1.0, seed=a.seed + i)
    scores = [compute_score_correctness("capo:default", t, batch[j // a.n].answer) for j, t in enumerate(ro.texts)]
    rewards = torch.tensor([s["score"] for s in scores], dtype=torch.float32)
    with torch.no_grad():
        old = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
        ref = token_logprobs(ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
    data = rt.compute_advantage(verl_batch(ro, rewards, [s["correct"] for s in scores], old, ref, a.n),
                                adv_estimator="capo", num_repeat=a.n, config=algo_cfg)
    model.train()
    loss, metrics = policy_loss(model, ro, data, actor_cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    adv = data.batch["advantages"].sum(-1) / data.batch["response_mask"].sum(-1).clamp(min=1)
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref_model.parameters(), strict=True))
    return {"step": i + 1, "moved_from_initial": round(moved, 6), "reward_mean": round(rewards.mean().item(), 4), "loss": round(loss.item(), 6),
            "adv_abs_mean": round(adv.abs().mean().item(), 4), "ppo_kl": metrics["actor/ppo_kl"],
            "seconds": round(time.perf_counter() - t0, 2)}


def main() -> int:
    a = parse()
    from omegaconf import OmegaConf

    import verl  # noqa: F401  (importing verl loads capo's plugin through its entry point)
    from verl.trainer.ppo import ray_trainer as rt

    from capo.rollout import HFEngine, load_model
    from capo.tasks.default import default_problems

    if not getattr(rt.compute_advantage, "__capo_wrapped__", False):
        raise SystemExit("verl did not load capo's plugin: install capo in verl's environment "
                         "(sh scripts/engine-env.sh verl, or pip install -e '.[verl]' in capo's clone)")
    torch.manual_seed(a.seed)
    model, tok = load_model("default")
    ref_model, _ = load_model("default")
    ref_model.eval().requires_grad_(False)
    engine = HFEngine(model, tok)
    problems = default_problems("train", a.steps * a.prompts, seed=a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    # the full script's settings: +algorithm.capo.{advantage_kwargs.tau, noise_mask} and the actor's PPO clip 0.2
    algo_cfg = OmegaConf.create({"capo": {"advantage_kwargs": {"tau": 0.6}, "noise_mask": "fixed"}})
    actor_cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                                  "clip_ratio_c": 3.0, "global_batch_info": {"dp_size": 1, "batch_num_tokens": 1}})
    for i in range(a.steps):
        print(json.dumps(step(i, a, model, ref_model, engine, problems, opt, algo_cfg, actor_cfg)), flush=True)
    print(f"smoke: {a.steps} optimizer steps with capo inside verl's compute_advantage and policy loss")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

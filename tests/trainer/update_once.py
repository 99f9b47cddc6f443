"""One deterministic update, for the 1-process vs 2-process invariance test (run under `accelerate launch`).

Every process builds the same global rollout batch (same seed, same model), keeps its own share of the groups,
computes advantages on it, and makes one optimizer step; rank 0 writes the gradient the optimizer received to OUT
and the update's logged policy/* values to OUT.json.
Usage: python update_once.py MODEL_DIR OUT_FILE [micro_batch_size] [dropped groups, e.g. 0,1]
Dropped groups (global indices 0-3) take no part in the update, as a group filter or the numerical guard leaves them:
the processes then hold different numbers of rows, or one holds none.
"""

import json
import sys

import torch


def main():
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer
    from capo.rollout import HFEngine

    model_dir, out = sys.argv[1], sys.argv[2]
    micro = sys.argv[3] if len(sys.argv) > 3 else "0"
    dropped = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
    B, G = 4, 4
    cfg = load_config(None, {"model.path": model_dir, "rollout.prompts_per_step": B, "rollout.group_size": G,
                             "rollout.max_new_tokens": 12, "algo.name": "capo", "algo.noise_mask": "off",
                             "optim.micro_batch_size": micro, "optim.lr": 1e-2, "run.out_dir": out + ".run",
                             "run.resume": False, "data.n_train": 64, "data.n_eval": 4})
    tr = Trainer(cfg)
    problems = tr.train_set[:B]
    torch.manual_seed(123)  # the same global rollout on every process
    from capo.trainer.data import render_prompts

    model = tr.acc.unwrap_model(tr.model)
    ro = HFEngine(model, tr.tok).sample(render_prompts(problems, tr.tok, cfg.data, use_chat_template=False), k=G,
                                        max_new_tokens=12)
    g, _ = tr.reward(ro, problems)
    rewards = torch.rand(B * G, generator=torch.Generator().manual_seed(7)).round()  # mixed groups, deterministic
    g.correct = rewards.bool()  # the verdicts these binary rewards stand for (CAPO reads verdicts)
    per = B // tr.world * G
    rows = torch.arange(tr.rank * per, (tr.rank + 1) * per)
    ro, g.correct, rewards = ro.select(rows), g.correct[rows], rewards[rows]
    g.confidence, g.format_ok = g.confidence[rows], g.format_ok[rows]  # this process's share of every graded row
    g.answers = [g.answers[i] for i in rows.tolist()]
    batch, _ = tr.advantages(ro, g, rewards, None, None)
    for group in dropped:  # a global group: inactive where this process holds it
        local = group * G - tr.rank * per
        if 0 <= local < per:
            batch.active[local:local + G] = False
    seen, step = [], tr.opt.step

    def wrapped(*args, **kwargs):  # the gradient the optimizer receives (Adam would amplify float noise)
        seen.append(torch.cat([p.grad.detach().flatten() for p in tr.model.parameters()]))
        return step(*args, **kwargs)

    tr.opt.step = wrapped
    logged = tr.update(batch)
    if tr.acc.is_main_process:
        torch.save(seen[0], out)
        with open(out + ".json", "w") as f:
            json.dump({k: v for k, v in logged.items() if k.startswith("policy/")}, f)
    assert tr.leave_process_group(), "DDP outlived the trainer's references"


if __name__ == "__main__":
    main()

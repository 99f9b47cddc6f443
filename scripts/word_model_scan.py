"""Choose the reasoning testbed's warm-up length: pre-train ``word_problems`` for ``--steps`` and, every
``--every`` steps, save a checkpoint and measure it on held-out problems (temperature 1). The whole training state is
saved after each measurement (OUT/state.pt): the same command continues a killed scan where it stopped, exactly. Because the warm-up's
learning rate is constant after its warm-up, checkpoint k equals ``capo build-default --task word_problems
--steps k`` (same seed and thread count). Prints one JSON line per checkpoint; docs/model-builds.md records the choice.

    python scripts/word_model_scan.py --out runs/word_scan --steps 2000 --every 200 --threads 2 > runs/word_scan.log

To ship checkpoint K as the package's model, build it with capo (the same weights, by the identity above, for the
same seed and thread count), which also writes its build record and measures it on 128 held-out prompts x 8 samples:

    capo build-default --task word_problems --steps K --threads 2 --out src/capo/assets/word_problems_model
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for checkpoints (step-K/) and scan.jsonl")
    ap.add_argument("--steps", type=int, default=2000, help="warm-up steps in all")
    ap.add_argument("--every", type=int, default=200, help="checkpoint and measure every this many steps")
    ap.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts per measurement (8 samples each)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch

    from capo.evaluation.default_task import evaluate_default
    from capo.tasks import model_builder as mb
    from capo.tasks import word_problems as wp
    from capo.tasks.generated import generated_task

    torch.set_num_threads(args.threads)
    task = generated_task(wp.TASK_NAME)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held = wp.word_problems("eval", args.eval_prompts, seed=0)
    tok = mb.build_tokenizer(model_max_length=wp.ARCH["max_positions"])
    t0 = time.perf_counter()

    def on_step(step: int, model) -> None:
        if step % args.every:
            return
        model.eval()
        mb.save_model(mb.export_llama(model), tok, out / f"step-{step}")  # first: a failed measurement loses nothing
        t1 = time.perf_counter()
        ev = evaluate_default(model, tok, held, group_size=8, max_new_tokens=task.max_new_tokens, seed=0,
                              dataset=wp.TASK_NAME)
        rec = {"step": step, "train_s": round(t1 - t0, 1), "eval_s": round(time.perf_counter() - t1, 1),
               **{k: v for k, v in ev.items() if k != "samples"}}
        with open(out / "scan.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        (out / f"step-{step}" / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in ev["samples"]))
        print(json.dumps(rec), flush=True)
        model.train()

    stats = wp.build_word_model(out / "final", seed=args.seed, steps=args.steps,
                                log=lambda s: print(s, file=sys.stderr, flush=True), on_step=on_step,
                                resume=out / "state.pt", save_every=args.every)
    print(json.dumps({k: v for k, v in stats.items() if k != "loss_curve"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Choose the reasoning testbed's warm-up length: pre-train ``word_problems`` for ``--steps`` and, every
``--every`` steps, save a checkpoint and measure it on held-out problems (temperature 1). The whole training state is
saved after each measurement (OUT/state.pt): the same command continues a killed scan where it stopped, exactly. Because the warm-up's
learning rate is constant after its warm-up, checkpoint k equals ``capo build-default --task word_problems
--steps k`` (same seed and thread count). Prints one JSON line per checkpoint; docs/results.md records the choice.

    python scripts/word_model_scan.py --out runs/word_scan --steps 2000 --every 200 --threads 2 > runs/word_scan.log

``--ship K --log FILE --to DIR`` then ships checkpoint K: copies its files to DIR (the package's
``capo/assets/word_problems_model``), writes DIR/capo_default.json -- the build record of a K-step build (the loss
curve read from the scan's log, which prints the same 50-step means the build records) -- and measures it on 128
held-out prompts x 8 samples as ``capo build-default`` does:

    python scripts/word_model_scan.py --out runs/word_scan --ship 800 --log runs/word_scan.log \
        --to src/capo/assets/word_problems_model
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
    ap.add_argument("--ship", type=int, default=None, metavar="K", help="ship checkpoint K of --out (no training)")
    ap.add_argument("--log", default=None, help="with --ship: the scan's log (its 'step N/M loss X' lines)")
    ap.add_argument("--to", default=None, help="with --ship: the folder to ship the model to")
    args = ap.parse_args()
    if args.ship is not None:
        return ship(args)
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


def ship(args) -> int:
    """Copy checkpoint K and write its build record plus a 128-prompt measurement (see the module docstring)."""
    import re
    import shutil

    import torch

    from capo.evaluation.default_task import evaluate_default
    from capo.tasks import word_problems as wp
    from capo.tasks.default import load_default
    from capo.tasks.generated import generated_task

    src, dst, k = Path(args.out) / f"step-{args.ship}", Path(args.to), args.ship
    if not (src / "model.safetensors").exists() or not args.log:
        raise SystemExit(f"--ship {k}: needs {src}/model.safetensors and --log")
    scan = {r["step"]: r for r in map(json.loads, (Path(args.out) / "scan.jsonl").read_text().splitlines())}
    found = list(re.finditer(r"step (\d+)/(\d+) loss ([0-9.]+)", Path(args.log).read_text()))
    losses, total = {int(m[1]): float(m[3]) for m in found}, int(found[-1][2])
    every = 50
    curve = [losses[s] for s in range(every, k + 1, every)]
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(src / f, dst / f)
    torch.set_num_threads(args.threads)
    model, tok = load_default(model_dir=dst)
    task = generated_task(wp.TASK_NAME)
    t0 = time.perf_counter()
    ev = evaluate_default(model, tok, task.problems("eval", 128, seed=0), group_size=8, seed=args.seed,
                          max_new_tokens=task.max_new_tokens, dataset=wp.TASK_NAME)
    record = {
        "task": f"capo:{wp.TASK_NAME}", "options": wp.DEFAULT_OPTIONS, "seed": args.seed, "steps": k,
        "batch_size": int(wp.WARMUP["batch_size"]), "lr": float(wp.WARMUP["lr"]),
        "warmup_steps": int(wp.WARMUP["warmup_steps"]),
        "architecture": {"type": "llama (trained as qwen2, exported)", **wp.ARCH, "vocab": len(tok)},
        "params": sum(p.numel() for p in model.parameters()), "loss_every": every, "loss_curve": curve,
        "final_loss": curve[-1], "torch_threads": args.threads, "torch": torch.__version__,
        "built_by": f"checkpoint {k} of `scripts/word_model_scan.py --steps {total}` (seed {args.seed}); equal to "
                    f"`capo build-default --task word_problems --steps {k}` with the same thread count",
        "scan_elapsed_seconds_at_checkpoint": scan.get(k, {}).get("train_s"),
        "eval": {k2: v for k2, v in ev.items() if k2 != "samples"},
        "eval_seconds": round(time.perf_counter() - t0, 1),
    }
    (dst / "capo_default.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({x: y for x, y in record.items() if x != "loss_curve"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Do the trainer's periodic evaluation and `capo eval` measure the same thing on the same model?

    python scripts/eval_paths.py --preset word_problems --draws 10 [--out runs/eval_paths]

The trainer's periodic held-out evaluation (`Trainer.evaluate`: the preset's first `data.n_eval` held-out problems,
`run.eval_samples` responses each, one sampling call, seeded by the training seed) and `capo eval` (batches of
`--batch-size` sequences, per-batch seeds, its own metric code) draw from the same sampler. This script evaluates the
preset's initial model `--draws` times through each path at the same problems and samples per problem -- the trainer at
training seeds 0, 1, ... (its step-0 evaluation), `capo eval` at sampling seeds 0, 1, ... -- and prints each draw's
accuracy and AUC-mean, each path's mean and sd over draws, and the difference of the paths' means with Welch's
95% t-interval (`capo.evaluation.stats.two_sample_interval`). A path difference would show as an interval away from
0; the sd over draws is the sampling noise of one evaluation of that size, which every single-draw reading carries.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch


def trainer_draw(preset: str, seed: int, out: Path) -> dict:
    """The trainer's step-0 periodic evaluation at training seed ``seed`` (nothing trained)."""
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    cfg = load_config(preset, {"run.seed": seed, "run.out_dir": str(out / f"trainer-{seed}"), "run.progress": False})
    m = Trainer(cfg).evaluate()
    return {"accuracy": m["eval/accuracy"], "auc_mean": m["eval/auc_mean"], "auroc": m["eval/auroc"]}


def eval_draw(preset: str, seed: int, out: Path, engine) -> dict:
    """`capo eval` of the preset's initial model on the same problems and samples per problem, sampling seed
    ``seed``, the settings `capo sweep` uses for its final evaluation."""
    from capo.evaluation.run import EvalSettings, run_eval
    from capo.trainer.config import load_config

    cfg = load_config(preset)
    s = EvalSettings(model=cfg.model.path, dataset=cfg.data.dataset, split="test", limit=cfg.data.n_eval,
                     k=cfg.run.eval_samples, temperature=cfg.rollout.temperature,
                     max_new_tokens=cfg.rollout.max_new_tokens, batch_size=64, seed=seed, chat_template=False,
                     system_prompt="", answer_format=cfg.data.answer_format, n_boot=0, token_stats=False)
    m = run_eval(s, out / f"eval-{seed}", progress=False, engine=engine)
    return {"accuracy": m["accuracy"], "auc_mean": m["auc_mean"], "auroc": m["auroc"]}


def main(argv=None) -> int:
    from capo.evaluation.run import EvalSettings, make_engine
    from capo.evaluation.stats import two_sample_interval
    from capo.trainer.config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="word_problems", help="training preset whose initial model and periodic "
                    "evaluation are compared")
    ap.add_argument("--draws", type=int, default=10, help="evaluations per path (seeds 0 .. draws-1)")
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    a = ap.parse_args(argv)
    if a.draws < 2:
        ap.error("--draws must be >= 2 (an sd needs two draws)")
    torch.set_num_threads(1)
    out = a.out or Path(tempfile.mkdtemp(prefix="eval_paths-"))
    engine = make_engine(EvalSettings(model=load_config(a.preset).model.path, token_stats=False))
    res: dict[str, list[dict]] = {"trainer": [], "capo eval": []}
    for seed in range(a.draws):
        res["trainer"].append(trainer_draw(a.preset, seed, out))
        res["capo eval"].append(eval_draw(a.preset, seed, out, engine))
        print(f"seed {seed}: " + "; ".join(f"{p} accuracy {r[-1]['accuracy']:.3f} AUC-mean {r[-1]['auc_mean']:.3f}"
                                           for p, r in res.items()), flush=True)
    for key in ("accuracy", "auc_mean", "auroc"):
        t, e = ([r[key] for r in res[p]] for p in ("trainer", "capo eval"))
        w = two_sample_interval(t, e)
        print(f"{key}: trainer {np.mean(t):.3f} (sd {np.std(t, ddof=1):.3f}), capo eval {np.mean(e):.3f} "
              f"(sd {np.std(e, ddof=1):.3f}); trainer - capo eval {w['mean']:+.3f} [{w['low']:+.3f}, {w['high']:+.3f}]"
              f", p {w['p']:.3g} (Welch, {a.draws} draws each)")
    (out / "eval_paths.json").write_text(json.dumps(res, indent=1))
    print(f"draws: {out / 'eval_paths.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

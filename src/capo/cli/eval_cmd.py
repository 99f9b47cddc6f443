"""``capo eval``: sample k responses per prompt from a causal LM, judge them, and measure calibration."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from capo.errors import ConfigError
from capo.rollout.engine import ENGINES
from capo.rollout.models import AUTOCAST_MODES
from capo.tasks.datasets import DATASET_NAMES, FILE_ANSWER_FORMATS
from capo.core.voting import KEEP_FRACTION
from capo.verify import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="evaluate a model: accuracy, calibration (AUC-mean, AUROC, ECE, Brier, AURC), test-time scaling",
        description="Sample k responses per prompt, verify them with math-verify, and write generations.jsonl, "
        "metrics.json, plots and report.html to --out. Rerun the same command to resume an interrupted eval.",
    )
    p.add_argument("--model", help="HF model folder, DIR/FILE.gguf, 'default', or a Hub id")
    p.add_argument("--engine", default="hf", choices=ENGINES,
                   help="generation engine: hf (Hugging Face generate, every causal LM) or vllm (needs vLLM: "
                   "`sh scripts/vllm-env.sh` on CPU, `pip install 'capo[vllm]'` on a GPU; a model folder or Hub id "
                   "whose architecture vLLM supports) (default: hf)")
    p.add_argument("--generations", metavar="FILE.jsonl",
                   help="compute everything from responses + log-probs produced elsewhere "
                   "(schema: docs/generations-schema.md); no model is loaded")
    p.add_argument("--dataset", default="gsm8k",
                   help=f"{', '.join(DATASET_NAMES)}, or a .jsonl/.parquet file (default: gsm8k)")
    p.add_argument("--split", default="test", help="split of a built-in dataset (default: test)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    p.add_argument("--prompt-field", default="prompt", help="prompt field of a JSONL/parquet dataset")
    p.add_argument("--answer-field", default="answer", help="gold-answer field of a JSONL/parquet dataset")
    p.add_argument("--dataset-answer-format", default="plain", choices=FILE_ANSWER_FORMATS,
                   help="how the gold answer is stored in a JSONL/parquet dataset")
    p.add_argument("-k", type=int, default=4, help="responses sampled per prompt (default: 4)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default: 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="maximum response length (default: 512)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="sequences per generate call; rounded down to a multiple of k, at least k (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="feed the raw prompt even if the tokenizer has a chat template")
    p.add_argument("--system-prompt", default=None,
                   help="system message (default: asks for the final answer within \\boxed{})")
    p.add_argument("--autocast", default="auto", choices=AUTOCAST_MODES,
                   help="bf16 autocast (auto: on for CUDA with bf16 and for bf16-capable CPUs with >= 25M params)")
    _add_scoring_flags(p)
    p.add_argument("--out", default=None,
                   help="run directory (created; an existing one is resumed; default: runs/eval/MODEL-DATASET, or "
                        "runs/eval/rescored-NAME for --generations, printed at the start)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress output")
    return p


def _add_scoring_flags(p: argparse.ArgumentParser) -> None:
    """How answers are judged and the metrics computed (the same for sampled runs and --generations)."""
    g = p.add_argument_group("judging and metrics")
    g.add_argument("--answer-format", default=None, choices=ANSWER_FORMATS,
                   help="how to extract the model's answer (default: auto = <answer> tag, else last \\boxed{}, "
                   "else '#### N')")
    g.add_argument("--fallback-last-number", action="store_true", default=None,
                   help="use the last number in the response when no answer was found")
    g.add_argument("--verify-timeout", type=float, default=5.0, help="hard timeout per answer judgement, s")
    g.add_argument("--verify-workers", type=int, default=None, help="verifier processes (default: min(4, cpus))")
    g.add_argument("--n-bins", type=int, default=10, help="equal-width bins for ECE and reliability (default: 10)")
    g.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates for intervals; 0 = none")
    g.add_argument("--no-token-stats", dest="token_stats", action="store_false",
                   help="do not write per-token log-probs / entropy / self-certainty / DeepConf confidence into "
                   "generations.jsonl (smaller files; only lpm, verbal and consistency estimators then)")
    g.add_argument("--conf-window", type=int, default=2048,
                   help="sliding-window length in tokens of DeepConf's group confidences (default: 2048, DeepConf's)")
    g.add_argument("--conf-fraction", type=float, default=0.1,
                   help="bottom fraction of the windows averaged by the bottom_group estimator (default: 0.1)")
    g.add_argument("--conf-tail", type=int, default=2048,
                   help="number of last tokens averaged by the tail estimator (default: 2048, DeepConf's)")
    g.add_argument("--keep-fraction", type=float, default=KEEP_FRACTION,
                   help=f"confidence-filtered vote: fraction of each prompt's responses kept (default: {KEEP_FRACTION})")


def run(args) -> int:
    from capo.evaluation.run import EvalSettings, run_eval, validate_settings

    if args.model and args.generations:
        raise ConfigError("--model and --generations are mutually exclusive: give one")
    _extraction_settings(args)
    s = EvalSettings(
        model=args.model, engine=args.engine, dataset=args.dataset, split=args.split, limit=args.limit, k=args.k,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, seed=args.seed, chat_template=args.chat_template,
        system_prompt=args.system_prompt, answer_format=args.answer_format,
        fallback_last_number=args.fallback_last_number, prompt_field=args.prompt_field,
        answer_field=args.answer_field, dataset_answer_format=args.dataset_answer_format, autocast=args.autocast,
        verify_timeout=args.verify_timeout, verify_workers=args.verify_workers, n_bins=args.n_bins,
        n_boot=args.n_boot, generations=args.generations, token_stats=args.token_stats,
        conf_window=args.conf_window, conf_fraction=args.conf_fraction, conf_tail=args.conf_tail,
        keep_fraction=args.keep_fraction,
    )
    validate_settings(s)  # before loading anything
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out) if args.out else _default_out(args)
    if not args.out:
        print(f"capo eval: --out not given; writing to {out}", flush=True)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    t0 = time.perf_counter()
    m = run_eval(s, out, progress=args.progress)
    el = time.perf_counter() - t0

    def f(key):
        v = m.get(key)
        return "n/a" if v is None else f"{v:.4f}"

    print(f"capo eval: {int(m['n'])} responses on {int(m['n_groups'])} prompts in {el:.1f} s -> {out}")
    print(f"  accuracy {f('accuracy')}  AUC-mean {f('auc_mean')} ({int(m['auc_mean_groups'] or 0)} prompts)  "
          f"AUROC {f('auroc')}  ECE {f('ece')}  Brier {f('brier')}  AURC {f('aurc')}")
    print(f"  report: {out / 'report.html'}")
    return 0


# how answers are extracted from a response; recorded in a run's config.json and reused when its generations are
# re-scored with `--generations RUN/generations.jsonl` (the defaults apply to files from elsewhere)
EXTRACTION_DEFAULTS = {"answer_format": DEFAULT_ANSWER_FORMAT, "fallback_last_number": False}


def _extraction_settings(args) -> None:
    """Fill --answer-format / --fallback-last-number: the flag when given; for a re-scored capo eval run, the value
    recorded in its config.json (said on stdout), so that re-scoring never silently judges with other settings;
    else the default."""
    recorded = {}
    if args.generations:
        cfg_path = Path(args.generations).parent / "config.json"
        try:
            recorded = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        except (OSError, json.JSONDecodeError):
            recorded = {}
    for key, default in EXTRACTION_DEFAULTS.items():
        if getattr(args, key) is not None:
            continue
        if key in recorded:
            setattr(args, key, recorded[key])
            flag = "--" + key.replace("_", "-")
            print(f"capo eval: {flag} taken from {cfg_path} ({recorded[key]!r}); pass {flag} to override",
                  flush=True)
        else:
            setattr(args, key, default)


def _default_out(args) -> Path:
    """runs/eval/MODEL-DATASET (names made path-safe), or runs/eval/rescored-RUN for --generations."""
    def safe(x: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in x).strip("._") or "run"

    if args.generations:
        g = Path(args.generations)
        return Path("runs") / "eval" / f"rescored-{safe(g.parent.name or g.stem)}"
    model = Path(args.model.rstrip("/")).name if args.model else "model"
    return Path("runs") / "eval" / f"{safe(model)}-{safe(Path(args.dataset).stem)}"

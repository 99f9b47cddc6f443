"""The ``capo`` command line. Each subcommand lives in its own module exposing ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from capo.errors import CapoError

# name -> module (relative to capo.cli). Each module defines add_parser(subparsers) -> parser and run(args) -> int.
SUBCOMMANDS = {
    "eval": "eval_cmd",
    "report": "report_cmd",
    "train": "train_cmd",
    "demo": "demo_cmd",
    "build-default": "build_default_cmd",
    "sweep": "sweep_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="capo", allow_abbrev=False,
        description="Calibration-aware RL from verifiable rewards (CAPO, RLCR, GRPO family) and calibration metrics.",
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    parser.add_argument("--system-malloc", action="store_true",
                        help="keep glibc's default allocation thresholds (by default capo keeps large CPU tensors on "
                             "the heap: capo.rollout.models.tune_cpu_allocator)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(f"capo.cli.{modname}")
        except ModuleNotFoundError as e:  # a subcommand not built yet in this checkout
            if e.name == f"capo.cli.{modname}":
                continue
            raise
        p = mod.add_parser(sub)
        p.allow_abbrev = False  # a prefix such as --run.step must not silently mean --run.steps
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def _reject_unknown(parser: argparse.ArgumentParser, args, extra: list[str]) -> None:
    """argparse's "unrecognized arguments" error, with the closest known flag suggested (``--algo.nmae`` ->
    ``--algo.name``); exits 2 like argparse."""
    from capo.core.checks import did_you_mean

    p = getattr(args, "_parser", parser)
    flags = [o for a in p._actions for o in a.option_strings]
    first = next((e.split("=", 1)[0] for e in extra if e.startswith("-")), extra[0])
    p.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(first, flags)}")


def _quiet_hf_progress_bars() -> None:
    """Silence the Hugging Face progress bars capo does not own ("Loading weights", "Writing model shards",
    download and dataset bars): capo prints its own progress. A user's explicit setting of the variables wins."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub, and transformers follows it
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_hf_progress_bars()
    debug = "--debug" in argv  # accepted anywhere on the line, also after the subcommand
    if "--system-malloc" not in argv:
        from capo.rollout.models import tune_cpu_allocator

        tune_cpu_allocator()
    argv = [a for a in argv if a not in ("--debug", "--system-malloc")]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _reject_unknown(parser, args, extra)
    args.debug = debug
    args.argv = argv[argv.index(args.command) + 1:] if getattr(args, "command", None) in argv else []
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except CapoError as e:
        if args.debug:
            raise
        print(f"capo {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except UnicodeDecodeError as e:  # a config, dataset, spec or record that is not UTF-8 text
        if args.debug:
            raise
        print(f"capo {args.command}: error: an input file is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} "
              f"at position {e.start}: {e.reason}); save it as UTF-8. Nothing was marked complete", file=sys.stderr)
        return 2
    except OSError as e:  # full disk, read-only or missing output folder, ...: the OS's reason and the path
        if args.debug:
            raise
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"capo {args.command}: error: {e.strerror or e}{where}; nothing was marked complete", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"capo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

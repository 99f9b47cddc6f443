"""A sweep's report, with the training seed as the unit: ``capo sweep report RECORDS... --reference grpo``.

Prints, and writes to OUT/summary.md and OUT/summary.json:
- per-seed final held-out values of each method;
- mean and sd over seeds;
- each method minus the reference, paired by training seed: mean difference, its sd, a 95% t-interval over the
  seeds (n_seeds - 1 degrees of freedom), the two-sided paired t-test p-value and, per measure, that p-value
  Holm-adjusted over the methods compared with the reference (statsmodels `multipletests`: many methods make many
  tests, and at 5% some exclude 0 by chance); each method is paired with the reference on the seeds both
  finished (so two methods may be read on different seeds: the table says how many);
- the power analysis: how many seeds a paired t-test needs to detect a difference of ``effect`` (default 0.03) with
  80% power at the 5% level, given the observed sd of the paired difference (`capo.evaluation.stats.seeds_for_power`);
- with the sweep's base records (`base.json`, spec `base: true`; `base-drawD.json` too with `base: N`): each method's
  change from the start, final - base (the initial model under the same evaluation): with one draw a 95% t-interval
  over the method's seeds, with several Welch's t-interval of the seed mean minus the draws' mean;
- for runs whose periodic curve starts at step 0: the change along that curve (last periodic evaluation - step 0).
- a note for every seed a reading left out because a method could not compute the measure there (an AUC of a
  model whose answers were all wrong or all right): each reading stands on the other seeds, and says so.
Figures: OUT/curves.png (small multiples: each method's held-out accuracy and AUC-mean -- for stochastic outcomes the
stated-probability ECE and |m - p_c| -- during training over the reference's, mean, a band of +-1 sd over seeds and
each seed), OUT/plane.png (every method on the final accuracy / AUC-mean plane: each seed, the mean +-1 sd, the
start; not for stochastic outcomes) and OUT/forest.png (one panel per measure: the paired
seed-level differences with their t-intervals; intervals from fewer than 3 seeds are cut at the panel's edge) and
OUT/reliability.png (one reliability diagram of exp(lpm) per method over every response of all its seeds' final
evaluations, the base's draws first; a description, not a test). The data files are written before any figure.
"""

from __future__ import annotations

import json
from pathlib import Path

from capo.errors import ConfigError, DataError

DEFAULT_OUT = Path("docs") / "figures" / "sweeps"  # relative to the current directory; the folder is the records' name
DEFAULT_REFERENCE = "grpo"  # the method every other is paired against, unless a report names another
DEFAULT_EFFECT = 0.03  # the difference the power analysis is for


def default_out(folders: list[Path]) -> Path:
    """``docs/figures/sweeps/NAME`` under the current directory, the folders' names joined by ``+`` for several."""
    return Path.cwd() / DEFAULT_OUT / "+".join(Path(f).name for f in folders)


def write_report(folders: list[Path], reference: str = DEFAULT_REFERENCE, effect: float = DEFAULT_EFFECT,
                 out: Path | None = None, base_draws: int | None = None, curve_tables: bool = False) -> list[Path]:
    """Read the records of ``folders`` (one comparison), print the summary (and, with ``curve_tables``, each run's
    held-out curve), write OUT/summary.md, OUT/summary.json and the figures; returns the figures written."""
    from capo.sweep.analysis import summary
    from capo.sweep.records import load_base, load_records
    from capo.sweep.tables import curve_table, markdown

    if base_draws is not None and base_draws < 1:
        raise ConfigError(f"--base-draws must be >= 1, got {base_draws}")
    records = load_records(*folders)
    if reference not in records:
        raise ConfigError(f"--reference {reference!r} has no records; methods: {', '.join(sorted(records))}")
    seed = min(records[reference])
    bases = load_base(*folders, trained=(Path(f"{reference}-seed{seed}"), records[reference][seed]))[:base_draws]
    out = Path(out) if out is not None else default_out(folders)
    out.mkdir(parents=True, exist_ok=True)
    s = summary(records, reference, effect, bases)
    md = markdown(s)
    (out / "summary.md").write_text(md)
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    print(md)
    for line in _code_notes(records):
        print(line)
    if curve_tables:
        for m in sorted(records):
            for seed in sorted(records[m]):
                print(curve_table(records[m][seed]))
    figures = _draw(records, s, reference, out, bases)
    print("figures: " + ", ".join(map(str, figures)))
    return figures


def _code_notes(records: dict) -> list[str]:
    """A line for each record whose job ran under more than one commit or with uncommitted edits to capo
    (:func:`capo.sweep.records.mixed_code`): its numbers stand, and the reader is told which code made them."""
    from capo.sweep.records import mixed_code

    return [f"note: {m} seed {seed} ran under {why}" for m in sorted(records) for seed in sorted(records[m])
            if (why := mixed_code(records[m][seed]))]


def _draw(records: dict, s: dict, reference: str, out: Path, bases: list[dict]) -> list[Path]:
    from capo.sweep.analysis import HEADLINE_PAIR, headline_pair
    from capo.sweep.plots import plot_curves, plot_forest, plot_plane, plot_reliability

    pair = headline_pair(s["methods"])
    plot_curves(records, reference, out / "curves.png", tuple(f"eval/{k}" for k in pair))
    figures = [out / "curves.png"]
    if pair == HEADLINE_PAIR:  # the accuracy / AUC-mean plane; stochastic outcomes have no AUC-mean
        plot_plane(s, out / "plane.png")
        figures.append(out / "plane.png")
    if plot_forest(s, out / "forest.png"):
        figures.append(out / "forest.png")
    else:
        (out / "forest.png").unlink(missing_ok=True)  # nothing paired: no stale plot from an earlier run
    if plot_reliability(records, bases, reference, out / "reliability.png"):
        figures.append(out / "reliability.png")
    else:
        (out / "reliability.png").unlink(missing_ok=True)
    return figures


def compare_summary_report(path: Path, reference: str = DEFAULT_REFERENCE, effect: float = DEFAULT_EFFECT) -> str:
    """The seed-paired table of a ``capo report --figures`` summary JSON (model -> measure -> per-seed list)."""
    from capo.sweep.tables import check_compare_summary, from_compare_summary

    path = Path(path)
    if path.is_dir():  # e.g. the --figures folder or a sweep's records folder: not "no such" file
        raise DataError(f"{path}: is a folder, not a summary file (--compare-summary reads one `capo report "
                        "--figures` PREFIX-summary.json)")
    if not path.is_file():
        raise DataError(f"{path}: no such summary file (--compare-summary reads one *-summary.json)")
    try:
        models = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a compare summary (invalid JSON: {e})") from None
    check_compare_summary(path, models)  # the file's shape before its models: a misshapen file has no reference
    if reference not in models:
        raise ConfigError(f"--reference {reference!r} is not a model of {path}; models: {', '.join(sorted(models))}")
    return from_compare_summary(path, reference, effect)

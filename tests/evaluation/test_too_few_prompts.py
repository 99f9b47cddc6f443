"""Readings that say when they cannot say: a conclusion, a shaded best value or a comparison drawn from fewer than
compare.MIN_PROMPTS prompts says so instead of naming a winner; reports label runs by method and seed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from capo.cli import main
from capo.cli.demo_cmd import _paired_line
from capo.evaluation import compare
from capo.evaluation.compare import MIN_PROMPTS, Comparison, Model, headline
from capo.evaluation.report import RunInfo, render_report, run_label


def _run(name: str, **metrics) -> RunInfo:
    return RunInfo(name, Path(name), "eval", {"n_groups": 16.0, **metrics}, {}, {}, [])


def test_the_conclusion_names_no_winner_from_two_prompts():
    """The demo said "grpo has the highest AUC-mean (1.000)" from 2 of 16 prompts."""
    base = _run("base", auc_mean=0.6, auc_mean_groups=12.0, accuracy=0.50)
    grpo = _run("grpo-seed0", auc_mean=1.0, auc_mean_groups=2.0, accuracy=0.60)
    cmp = Comparison([Model("base", [base]), Model("grpo", [grpo])], "base", 16, 200, {})
    plain, htm = headline(cmp)
    assert "highest AUC-mean" not in plain
    assert f"Too few prompts to compare AUC-mean: the comparison with grpo rests on 2 of 16 prompts (a comparison " \
           f"needs at least {MIN_PROMPTS})." in plain
    assert "grpo has the highest accuracy (0.600)" in plain  # 16 prompts enter accuracy: a reading
    assert "Too few prompts to compare AUC-mean" in htm


def test_enough_prompts_still_name_the_winner():
    base = _run("base", auc_mean=0.6, auc_mean_groups=12.0, accuracy=0.5)
    grpo = _run("grpo-seed0", auc_mean=0.9, auc_mean_groups=MIN_PROMPTS, accuracy=0.6)
    plain, _ = headline(Comparison([Model("base", [base]), Model("grpo", [grpo])], "base", 16, 200, {}))
    assert "grpo has the highest AUC-mean (0.900)" in plain and "Too few" not in plain


def _best_cells(page: str) -> list[str]:
    return re.findall(r'<td class="best">([^<]*)', page)


def test_a_value_from_one_prompt_is_never_shaded_best():
    one = _run("a", auc_mean=1.0, auc_mean_groups=1.0, accuracy=0.5)
    many = _run("b", auc_mean=0.7, auc_mean_groups=12.0, accuracy=0.4)
    more = _run("c", auc_mean=0.65, auc_mean_groups=11.0, accuracy=0.3)
    page = render_report([one, many, more])
    assert "1.000" not in _best_cells(page) and "0.700" in _best_cells(page)
    assert "(from 1 prompt: too few to compare)" in page
    assert "0.500" in _best_cells(page)  # accuracy drew on 16 prompts in both runs


def test_the_estimator_table_bolds_no_value_from_too_few_prompts():
    """`capo eval` bolded "AUC-mean 1.000" among the estimators from one prompt."""
    est = {"lpm": {"auc_mean": 1.0, "auc_mean_groups": 1, "auroc": 0.6},
           "sum_logprob": {"auc_mean": 0.7, "auc_mean_groups": 12, "auroc": 0.5},
           "min_token_prob": {"auc_mean": 0.65, "auc_mean_groups": 11, "auroc": 0.4}}
    r = RunInfo("eval", Path("eval"), "eval", {"n_groups": 16.0}, {"estimators": est}, {}, [])
    page = render_report([r])
    assert "<b>1.000" not in page and "<b>0.700" in page
    assert "<b>0.600" in page  # the pooled AUROC drew on all 16 prompts


def test_the_demo_terminal_says_too_few_prompts():
    """It printed "0.000 [0.000, 0.000] over 1 prompts"."""
    assert _paired_line({"diff": 0.0, "low": 0.0, "high": 0.0, "n_prompts": 1}).startswith(
        "too few prompts to pair: 1 with right and wrong answers in both runs")
    assert _paired_line({"diff": 0.1, "low": 0.05, "high": 0.2, "n_prompts": 12}).endswith("over 12 prompts")


@pytest.mark.parametrize("n,few", [(None, False), (0, True), (MIN_PROMPTS - 1, True), (MIN_PROMPTS, False)])
def test_the_rule(n, few):
    assert compare.too_few(n) == few


def test_reports_label_runs_by_method_and_seed(tmp_path, capsys):
    """`capo report` labelled an eval run "eval" (its folder name)."""
    train = tmp_path / "t"
    ckpt = train / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    (train / "config.yaml").write_text("algo:\n  name: grpo\nrun:\n  seed: 3\n")
    (train / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1.0 / s}) + "\n" for s in (1, 2)))
    ev, base = tmp_path / "eval", tmp_path / "base_eval"
    for d, model in ((ev, str(ckpt)), (base, "builtin:default")):
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"config": {"model": model}, "metrics": {"n_groups": 12.0,
                                                                                              "accuracy": 0.5}}))
    assert run_label(ev) == "grpo-seed3"
    assert run_label(train) == "grpo-seed3 (training)"
    assert run_label(base) == "base_eval"  # a base model: no method to name
    out = tmp_path / "r.html"
    assert main(["report", str(ev), str(train), str(base), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<th>grpo-seed3</th>" in page and "<th>eval</th>" not in page


def test_the_forest_plot_leaves_out_comparisons_from_too_few_prompts():
    from capo.evaluation.report import paired_panels

    runs = {"base": _run("base", auc_mean=0.6, auc_mean_groups=12.0, accuracy=0.5),
            "a": _run("a-seed0", auc_mean=1.0, auc_mean_groups=2.0, accuracy=0.6),
            "b": _run("b-seed0", auc_mean=0.7, auc_mean_groups=12.0, accuracy=0.4),
            "c": _run("c-seed0", auc_mean=0.65, auc_mean_groups=11.0, accuracy=0.3)}
    cmp = Comparison([Model(n, [r]) for n, r in runs.items()], "base", 16, 200, {n: {} for n in runs})
    panels = paired_panels(cmp)
    assert set(panels["AUC-mean (+ better)"]) == {"b", "c"}
    assert set(panels["accuracy (+ better)"]) == {"a", "b", "c"}

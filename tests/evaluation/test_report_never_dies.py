"""A finished run never dies in its report: evaluation rows at the edges go through metrics, comparison, figures and
the HTML report (property tests), the data files are written before any figure, and a drawing failure costs one
printed line, never a result."""

import json
import math

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from capo.evaluation import plots
from capo.evaluation.compare import compare, headline
from capo.evaluation.report import load_run, write_report
from capo.evaluation.run import EvalSettings, _finish


class _ClassesByText:
    """Stand-in verifier for the answer classes only: equal strings are one class, None is -1 (the real verifier's
    equivalence is tested in tests/verify; here only the drawing path is under test)."""

    def equivalence_classes_batch(self, groups):
        out = []
        for answers in groups:
            seen: dict[str, int] = {}
            out.append([-1 if a is None else seen.setdefault(a, len(seen)) for a in answers])
        return out


LPM = st.one_of(st.none(), st.just(-0.7), st.floats(-6.0, 0.0), st.just(0.0))
CONF = st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 1.0), st.just(1.0), st.just(0.0))
VERDICT = st.sampled_from(["correct", "incorrect", "unparsable"])


@st.composite
def runs(draw):
    """Rows of one eval run at the edges: 1-4 prompts x 1-5 samples, outcome mode all-correct / all-wrong / nothing
    parsable / mixed, constant or missing lpm, missing or NaN verbal confidence."""
    n_prompts, k = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    mode = draw(st.sampled_from(["all_correct", "all_wrong", "unparsable", "mixed"]))
    constant = draw(st.booleans())
    rows = []
    for p in range(n_prompts):
        for i in range(k):
            verdict = {"all_correct": "correct", "all_wrong": "incorrect", "unparsable": "unparsable"}.get(
                mode, draw(VERDICT))
            lpm = -0.5 if constant else draw(LPM)
            answer = None if verdict == "unparsable" else draw(st.sampled_from(["1", "2", "3"]))
            rows.append({"prompt_id": f"p{p}", "prompt_idx": p, "sample_idx": i, "prompt": "q", "gold": "1",
                         "text": f"t{i}", "answer": answer, "verdict": verdict, "n_tokens": 3,
                         "mean_logprob": lpm, "sum_logprob": None if lpm is None else 3 * lpm,
                         "confidence": draw(CONF), "format_ok": verdict != "unparsable", "finish_reason": "stop"})
    return rows


def _finish_run(out_dir, rows, n_boot):
    out_dir.mkdir(parents=True, exist_ok=True)
    s = EvalSettings(model="stand-in", n_boot=n_boot)
    return _finish(out_dir, [dict(r) for r in rows], s, {"model": "stand-in"}, _ClassesByText(), {})


@given(a=runs(), b=runs())
# no shrinking phase: each example draws ~6 figures (~1 s), and shrinking a failure took > 5 min
@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_edge_rows_go_through_metrics_comparison_figures_and_report(tmp_path_factory, capsys, a, b):
    root = tmp_path_factory.mktemp("edge")
    for name, rows in (("base", a), ("capo", b)):
        m = _finish_run(root / name, rows, n_boot=20)
        assert m["n"] == len(rows)
        assert (root / name / "metrics.json").is_file() and (root / name / "report.html").is_file()
        written = [json.loads(ln) for ln in (root / name / "generations.jsonl").read_text().splitlines()]
        assert [r["answer_id"] for r in written] == [r["answer_id"] for r in written if "answer_id" in r]
        assert len(written) == len(rows)
    assert "could not be drawn" not in capsys.readouterr().err  # drawn, not merely survived
    evals = [load_run(root / n, name=n) for n in ("base", "capo")]
    cmp = compare(evals, n_boot=20)
    text, html_text = headline(cmp)
    assert text and html_text
    out = write_report(evals, root / "both.html", comparison=cmp)
    assert "<html" in out.read_text()[:200].lower()


def test_data_files_are_complete_before_any_figure(tmp_path, monkeypatch, capsys):
    """A figure that raises (the old negative-error-bar failure) leaves metrics.json and generations.jsonl complete,
    prints one line naming the re-render command, and `capo report` draws the report later."""
    rows = [{"prompt_id": "p0", "prompt_idx": 0, "sample_idx": i, "prompt": "q", "gold": "1", "text": str(i),
             "answer": "1", "verdict": "correct", "n_tokens": 2, "mean_logprob": -0.1 * i, "sum_logprob": -0.2 * i,
             "confidence": None, "format_ok": True, "finish_reason": "stop"} for i in range(4)]

    def broken(*args, **kwargs):
        raise ValueError("'yerr' must not contain negative values")

    monkeypatch.setattr(plots, "plot_selective", broken)
    m = _finish_run(tmp_path / "run", rows, n_boot=0)
    assert m["accuracy"] == 1.0
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["metrics"]["accuracy"] == 1.0 and not (tmp_path / "run" / ".metrics.json.pending").exists()
    assert len((tmp_path / "run" / "generations.jsonl").read_text().splitlines()) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not be drawn" in err[0] and "every result is saved" in err[0]
    assert f"capo report {tmp_path / 'run'}" in err[0]
    monkeypatch.undo()
    from capo.cli import main

    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "run" / "report.html")]) == 0
    assert "accuracy" in (tmp_path / "run" / "report.html").read_text()


@pytest.mark.parametrize("acc_count", [(1.0, 7), (0.0, 3), (0.9999999999999999, 5), (1 / 3, 3)])
def test_reliability_panel_at_bin_edges_draws(acc_count):
    """The bin accuracies that made the hand-written Wilson interval cross the bar (all right, all wrong, k/n a
    rounding error below 1) draw without a negative error bar."""
    acc, n = acc_count
    rel = {"bin_edges": [0.0, 0.5, 1.0], "confidence": [0.25, 0.75], "accuracy": [acc, acc], "count": [n, n]}
    assert plots.plot_reliability_panels({"m": {"reliability": rel}})[:4] == b"\x89PNG"


def test_drawing_leaves_the_matplotlib_backend_alone():
    """Figures are drawn without pyplot: a user's interactive backend is not switched to Agg by capo."""
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg'); from capo.evaluation import plots; "
            "rel = {'bin_edges': [0, 0.5, 1], 'confidence': [0.2, 0.8], 'accuracy': [0.5, 1.0], 'count': [2, 3]}; "
            "assert plots.plot_reliability_panels({'m': {'reliability': rel}})[:4] == b'\\x89PNG'; "
            "import sys; print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["svg", "False"]

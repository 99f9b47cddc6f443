"""`capo.evaluation.compare`: the paired bootstrap's per-draw measures equal the eval's own metrics on the full data,
and the reference model is selectable (`capo report --reference`, `capo demo --reference`)."""

import json
import math

import pytest

from capo.cli import main
from capo.core import calibration as cal
from capo.errors import ConfigError
from capo.evaluation import compare as cmpmod
from capo.evaluation.report import load_run
from tests.evaluation.test_report_browser import fake_eval_run


def _with_verbal(d, seed: int):
    """Give every row of a fake eval run a verbal confidence (some missing) and recompute its metrics.json."""
    import random

    from capo.evaluation.metrics import compute_metrics
    from capo.evaluation.run import atomic_write_text

    rng = random.Random(seed)
    rows = [json.loads(ln) for ln in (d / "generations.jsonl").read_text().splitlines()]
    for r in rows:
        r["confidence"] = None if rng.random() < 0.1 else round(rng.random(), 1)
    (d / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(d / "metrics.json", json.dumps({"config": {"model": "m", "k": 4}, **compute_metrics(rows, n_boot=20)}))
    return d


def _runs(tmp_path):
    specs = {"base": (0.0, 1), "grpo-seed0": (0.2, 2), "grpo-seed1": (0.1, 3), "capo-seed0": (0.4, 4),
             "capo-seed1": (0.3, 5)}
    return [load_run(_with_verbal(fake_eval_run(tmp_path / n, shift, seed), seed) if n == "capo-seed1"
                     else fake_eval_run(tmp_path / n, shift, seed), name=n) for n, (shift, seed) in specs.items()]


def test_draw_measures_equal_the_eval_metrics_on_all_prompts(tmp_path):
    """The bootstrap recomputes every measure on drawn prompts; drawing each prompt once must reproduce the values
    `capo eval` wrote (an independent code path: capo.evaluation.metrics)."""
    runs = _runs(tmp_path)
    for r in runs:
        seed = cmpmod._load_seed(r.path)
        prompts = sorted(seed.rows_of, key=lambda p: int(p[1:]))
        got = cmpmod._measures_on(seed, prompts)
        want = json.loads((r.path / "metrics.json").read_text())["metrics"]
        verbal = r.name == "capo-seed1"
        for key, _, _ in cmpmod.MEASURES:
            if key.startswith(("stochastic", "answer")):  # these runs have no stochastic outcomes (tests/tasks/)
                assert math.isnan(got[key]) and key not in want, (r.name, key)
                continue
            if not verbal and (key.startswith("verbal") or key == "confidence_weighted_vote"):
                assert math.isnan(got[key]) and (want.get(key) is None or math.isnan(want[key])), (r.name, key)
                continue
            assert got[key] == pytest.approx(want[key], abs=1e-12), (r.name, key)


def test_reference_model_and_seed_grouping(tmp_path):
    runs = _runs(tmp_path)
    c = cmpmod.compare(runs, n_boot=50, reference="grpo")
    assert c.reference == "grpo" and [m.name for m in c.models] == ["base", "grpo", "capo"]
    assert [len(m.runs) for m in c.models] == [1, 2, 2]
    mv = {r.name: json.loads((r.path / "metrics.json").read_text())["metrics"]["majority_vote"] for r in runs}
    d = c.diff("capo", "grpo", "majority_vote")
    assert d[0] == pytest.approx((mv["capo-seed0"] + mv["capo-seed1"]) / 2 - (mv["grpo-seed0"] + mv["grpo-seed1"]) / 2)
    assert d[1] <= d[2]
    assert cmpmod.compare(runs, n_boot=0).reference == "base"
    with pytest.raises(ConfigError, match="'grp0' is not among the compared models.*did you mean 'grpo'"):
        cmpmod.compare(runs, n_boot=0, reference="grp0")


def test_report_reference_flag(tmp_path, capsys):
    runs = _runs(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", *[str(r.path) for r in runs], "--out", str(out), "--reference", "capo"]) == 0
    html = out.read_text()
    assert "Paired differences against capo" in html
    assert "grpo &minus; capo" in html and "majority-vote accuracy" in html
    assert 'alt="paired differences"' in html  # the forest plot, with two models against the reference
    assert main(["report", *[str(r.path) for r in runs], "--out", str(tmp_path / "x.html"), "--reference", "cap"]) == 2
    assert "did you mean 'capo'" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_report_figures_and_tables_write_the_comparison_for_sweep_report(tmp_path, capsys):
    """`capo report --figures DIR --prefix P` writes P-summary.json (model -> measure -> per-seed values), which
    `capo sweep report --compare-summary` pairs by seed, and the two comparison figures; `--tables` prints the
    comparison as Markdown."""
    runs = _runs(tmp_path)
    figs = tmp_path / "figs"
    argv = ["report", *[str(r.path) for r in runs], "--out", str(tmp_path / "r.html"), "--reference", "grpo"]
    assert main([*argv, "--figures", str(figs), "--prefix", "default", "--tables", "--n-boot", "50"]) == 0
    out = capsys.readouterr().out
    assert "| model | seeds | accuracy | AUC-mean |" in out and "Paired difference vs grpo" in out and "50 draws" in out
    assert sorted(p.name for p in figs.iterdir()) == ["default-acc_vs_auc.png", "default-paired_vs_grpo.png",
                                                       "default-summary.json"]
    data = json.loads((figs / "default-summary.json").read_text())
    metrics = {r.name: json.loads((r.path / "metrics.json").read_text())["metrics"] for r in runs}
    assert list(data) == ["base", "grpo", "capo"] and "pass_at_8" in data["grpo"]
    assert data["capo"]["auc_mean"] == [metrics["capo-seed0"]["auc_mean"], metrics["capo-seed1"]["auc_mean"]]
    assert data["base"]["accuracy"] == [metrics["base"]["accuracy"]]
    assert main(["sweep", "report", str(figs / "default-summary.json"), "--compare-summary", "--reference", "grpo"]) == 0
    diff = (metrics["capo-seed0"]["accuracy"] + metrics["capo-seed1"]["accuracy"]
            - metrics["grpo-seed0"]["accuracy"] - metrics["grpo-seed1"]["accuracy"]) / 2
    assert f"| capo | accuracy | 2 | {diff:+.3f} [" in capsys.readouterr().out
    assert main([*argv[:-2], "--figures", str(tmp_path / "none")]) == 2
    assert "--tables, --figures and --split-on need --reference" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_report_split_on_compares_each_run_with_the_reference_on_both_sides_of_the_split(tmp_path, capsys):
    """`capo report --split-on TEXT`: accuracy, AUC-mean and the paired AUC-mean difference vs the reference on all
    prompts, on those containing TEXT and on the others, each computed from that subset's rows alone."""
    import torch

    from capo.core import calibration as cal

    runs = _runs(tmp_path)
    for r in runs:  # prompts p0, p3, ... get the marker; the others lose their question mark
        gen = r.path / "generations.jsonl"
        rows = [json.loads(ln) for ln in gen.read_text().splitlines()]
        for row in rows:
            marked = int(str(row["prompt_id"])[1:]) % 3 == 0
            row["prompt"] = row["prompt"].replace("?", ".") + ("+?" if marked else "")
        gen.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["report", *[str(r.path) for r in runs], "--out", str(tmp_path / "r.html"), "--reference", "base"]
    assert main([*argv, "--split-on", "?", "--n-boot", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("paired AUC-mean diff vs base [95% CI] (prompts) |")
    assert [ln.split(" | ")[:2] for ln in lines[2:5]] == [["| base", "all"], ["| capo-seed0", "all"],
                                                          ["| capo-seed1", "all"]]

    def cols(run, marked):
        rows = [json.loads(ln) for ln in (run.path / "generations.jsonl").read_text().splitlines()]
        rows = [x for x in rows if ("?" in x["prompt"]) == marked]
        ids = {p: i for i, p in enumerate(sorted({x["prompt_id"] for x in rows}))}
        return (torch.tensor([x["mean_logprob"] for x in rows], dtype=torch.float64),
                torch.tensor([x["verdict"] == "correct" for x in rows]), torch.tensor([ids[x["prompt_id"]] for x in rows]))

    by = {r.name: r for r in runs}
    grpo, base = cols(by["grpo-seed0"], False), cols(by["base"], False)
    pd = cal.paired_difference(*grpo, *base, n_boot=300, seed=0)
    want = (f"| grpo-seed0 | without ? | {float(grpo[1].double().mean()):.3f} | {cal.auc_mean(*grpo).value:.3f} | "
            f"{pd.value:+.3f} [{pd.low:+.3f}, {pd.high:+.3f}] ({pd.n_groups_used}) |")
    assert want in lines
    assert sum(" | with ? | " in ln for ln in lines) == len(runs)
    assert main([*argv[:-1], "grpo", "--split-on", "?"]) == 2  # grpo names two runs: no single reference run
    assert "one reference run (e.g. base); 'grpo' has 2 runs" in capsys.readouterr().err


def test_rows_without_answer_ids_get_them_from_the_verifier(tmp_path):
    """`capo eval` computes the answer classes after writing generations.jsonl, so its rows carry no answer_id: the
    comparison recomputes them (same function, same verifier) and its votes equal metrics.json's."""
    r = _runs(tmp_path)[3]  # capo-seed0
    gen = r.path / "generations.jsonl"
    rows = [json.loads(ln) for ln in gen.read_text().splitlines()]
    gen.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "answer_id"}) + "\n" for x in rows))
    seed = cmpmod._load_seed(r.path)
    got = cmpmod._measures_on(seed, sorted(seed.rows_of, key=lambda p: int(p[1:])))
    want = json.loads((r.path / "metrics.json").read_text())["metrics"]
    assert seed.cols.aids.min() >= 0  # every fake row has an answer
    for key in ("majority_vote", "max_confidence_lpm"):
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


def test_the_demo_terminal_pairs_with_the_statistic_of_report_split_on(tmp_path, capsys):
    """One paired per-prompt AUC-mean difference in capo: the demo's terminal line against the base equals the "all"
    row of `capo report --split-on` at the same draws (both read the runs through compare.run_columns)."""
    from capo.cli.demo_cmd import _paired_vs_base

    runs = _runs(tmp_path)
    by = {r.name: r for r in runs}
    argv = ["report", str(by["base"].path), str(by["grpo-seed0"].path), "--out", str(tmp_path / "r.html"),
            "--reference", "base", "--split-on", "?", "--n-boot", "1000"]
    assert main(argv) == 2  # every prompt of these runs holds a "?": nothing to split, said plainly
    assert "--split-on '?': every held-out prompt of base contains it, so there is nothing to split" in \
        capsys.readouterr().err
    assert main([*argv[:-3], "&", "--n-boot", "1000"]) == 2
    assert "--split-on '&': every held-out prompt" in capsys.readouterr().err
    assert main([*argv[:-3], "no such text", "--n-boot", "1000"]) == 2
    assert "--split-on 'no such text': no held-out prompt of base contains it" in capsys.readouterr().err
    for r in (by["base"], by["grpo-seed0"]):  # a split: prompts p0, p3, ... get a marker
        gen = r.path / "generations.jsonl"
        rows = [json.loads(ln) for ln in gen.read_text().splitlines()]
        for row in rows:
            row["prompt"] += " [m]" if int(str(row["prompt_id"])[1:]) % 3 == 0 else ""
        gen.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main([*argv[:-3], "[m]", "--n-boot", "1000"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| grpo-seed0 | all |"))
    d = _paired_vs_base(by["base"].path, by["grpo-seed0"].path)
    assert d["n_prompts"] >= 2 and d["low"] < d["diff"] < d["high"]
    assert row.endswith(f"| {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] ({d['n_prompts']}) |")


def test_two_runs_are_paired_by_prompt_id_on_the_prompts_both_hold(tmp_path):
    """Run A holds p1 (AUC 0.5), p2 (1) and p3 (0); run B p2 (1) and p3 (0): paired on p2 and p3 the difference is
    0. Indexing each run by its own sorted ids paired p1 with p2 and p2 with p3: (-0.5 + 1) / 2 = 0.25."""
    from capo.cli.demo_cmd import _paired_vs_base

    def write(name, prompts):
        d = tmp_path / name
        d.mkdir()
        lpm = {"p1": (-0.5, -0.5), "p2": (-0.1, -0.9), "p3": (-0.9, -0.1)}  # (right, wrong)
        rows = [{"prompt_id": p, "prompt": p, "verdict": v, "mean_logprob": lpm[p][i]}
                for p in prompts for i, v in enumerate(("correct", "incorrect"))]
        (d / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return d

    a, b = write("a", ["p1", "p2", "p3"]), write("b", ["p2", "p3"])
    xa, xb = cmpmod.paired_columns(a, b)
    assert xa[2].tolist() == xb[2].tolist() == [0, 0, 1, 1]  # p2, p3 in both
    pd = cal.paired_difference(*xa, *xb, n_boot=200, seed=0)
    assert (pd.value, pd.n_groups_used) == (0.0, 2)
    assert _paired_vs_base(b, a)["diff"] == 0.0


def test_draw_measures_use_the_runs_own_ece_bins(tmp_path):
    """A run evaluated with --n-bins 3: each bootstrap draw measures ECE with 3 bins too, so drawing every prompt once
    gives metrics.json's ECE (10 bins would give another number)."""
    from capo.evaluation.metrics import compute_metrics
    from capo.evaluation.run import atomic_write_text

    d = fake_eval_run(tmp_path / "grpo-seed0", 0.2, 2)
    rows = [json.loads(ln) for ln in (d / "generations.jsonl").read_text().splitlines()]
    want = compute_metrics(rows, n_bins=3, n_boot=0)["metrics"]
    atomic_write_text(d / "metrics.json", json.dumps({"config": {"model": "m", "k": 4}, "metrics": want}))
    (d / "config.json").write_text(json.dumps({"n_bins": 3, "answer_format": "auto"}))
    seed = cmpmod._load_seed(d)
    got = cmpmod._measures_on(seed, sorted(seed.rows_of, key=lambda p: int(p[1:])))
    assert seed.n_bins == 3 and got["ece"] == pytest.approx(want["ece"], abs=1e-12)
    assert got["ece"] != pytest.approx(compute_metrics(rows, n_boot=0)["metrics"]["ece"], abs=1e-6)


def test_seed_intervals_pair_by_seed_and_never_subtract_one_trained_seed_from_all(tmp_path):
    runs = _runs(tmp_path)
    shuffled = [runs[0], runs[2], runs[1], runs[4], runs[3]]  # grpo-seed1, grpo-seed0, capo-seed1, capo-seed0
    acc = {r.name: r.metrics["accuracy"] for r in runs}
    d = cmpmod.compare(shuffled, n_boot=0, reference="grpo").seed_diff("capo", "grpo", "accuracy")
    per_seed = [acc[f"capo-seed{s}"] - acc[f"grpo-seed{s}"] for s in (0, 1)]
    assert d["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-12) and d["n"] == 2
    # the base (a run without a training seed) is subtracted from every seed ...
    b = cmpmod.compare(runs, n_boot=0).seed_diff("capo", "base", "accuracy")
    assert b["mean"] == pytest.approx((acc["capo-seed0"] + acc["capo-seed1"]) / 2 - acc["base"], abs=1e-12)
    # ... but a trained reference of one seed is not: no seed in common, no seed interval
    lone = load_run(fake_eval_run(tmp_path / "ref-seed5", 0.1, 9), name="ref-seed5")
    assert cmpmod.compare([*runs, lone], n_boot=0, reference="ref").seed_diff("capo", "ref", "accuracy") is None


def test_compare_summary_pairs_by_seed_whatever_the_order_the_runs_were_given_in(tmp_path, capsys):
    runs = _runs(tmp_path)
    shuffled = [runs[0], runs[1], runs[2], runs[4], runs[3]]  # capo's seeds given as 1, 0
    figs = tmp_path / "figs"
    assert main(["report", *[str(r.path) for r in shuffled], "--out", str(tmp_path / "r.html"), "--reference", "grpo",
                 "--figures", str(figs), "--n-boot", "20"]) == 0
    summary = figs / "compare-summary.json"
    data = json.loads(summary.read_text())
    assert data["capo"]["seeds"] == ["1", "0"] and data["grpo"]["seeds"] == ["0", "1"]
    acc = {r.name: r.metrics["accuracy"] for r in runs}
    by_seed = cmpmod.compare(runs, n_boot=0, reference="grpo").seed_diff("capo", "grpo", "accuracy")
    capsys.readouterr()
    assert main(["sweep", "report", str(summary), "--compare-summary", "--reference", "grpo"]) == 0
    out = capsys.readouterr().out
    assert f"| capo | accuracy | 2 | {by_seed['mean']:+.3f} [{by_seed['low']:+.3f}, {by_seed['high']:+.3f}] |" in out
    assert "paired by their position" not in out
    # a file written before the seeds were recorded is paired by position, and the table says so
    for m in data.values():
        del m["seeds"]
    summary.write_text(json.dumps(data))
    assert main(["sweep", "report", str(summary), "--compare-summary", "--reference", "grpo"]) == 0
    out = capsys.readouterr().out
    positional = (acc["capo-seed1"] - acc["grpo-seed0"] + acc["capo-seed0"] - acc["grpo-seed1"]) / 2
    assert f"| capo | accuracy | 2 | {positional:+.3f} [" in out and "paired by their position" in out


def test_figures_of_one_model_against_the_reference_leave_out_the_forest_plot(tmp_path):
    runs = [r for r in _runs(tmp_path) if r.name != "base"][:4]  # grpo and capo: one model against the reference
    figs = tmp_path / "figs"
    assert main(["report", *[str(r.path) for r in runs], "--out", str(tmp_path / "r.html"), "--reference", "grpo",
                 "--figures", str(figs), "--n-boot", "20"]) == 0
    assert sorted(p.name for p in figs.iterdir()) == ["compare-acc_vs_auc.png", "compare-summary.json"]


def test_a_difference_and_its_interval_describe_the_same_prompts(tmp_path):
    """Model b was evaluated on 8 of model a's 12 prompts: the difference's value is taken over those 8, as its
    interval is (it was each run's metrics.json value, over 12 prompts for a and 8 for b); with the same prompts in
    every run the value stays metrics.json's."""
    from capo.evaluation.metrics import compute_metrics
    from capo.evaluation.run import atomic_write_text

    a = fake_eval_run(tmp_path / "a", 0.3, 1)
    b = fake_eval_run(tmp_path / "b", 0.1, 2)
    rows = [json.loads(ln) for ln in (b / "generations.jsonl").read_text().splitlines()]
    rows = [r for r in rows if int(r["prompt_id"][1:]) < 8]
    (b / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(b / "metrics.json", json.dumps({"config": {"model": "m", "k": 4}, **compute_metrics(rows, n_boot=0)}))
    runs = [load_run(a, name="a"), load_run(b, name="b")]
    c = cmpmod.compare(runs, n_boot=50, reference="b")
    shared = [f"p{i}" for i in range(8)]
    for key in ("auroc", "accuracy", "ece"):
        want = (cmpmod._measures_on(cmpmod._load_seed(a), shared)[key]
                - cmpmod._measures_on(cmpmod._load_seed(b), shared)[key])
        got = c.diff("a", "b", key)
        assert c.prompts == 8 and got[0] == pytest.approx(want, abs=1e-12), key
    whole = runs[0].metrics["auroc"] - runs[1].metrics["auroc"]
    assert c.diff("a", "b", "auroc")[0] != pytest.approx(whole, abs=1e-6)  # the old value, over 12 and 8 prompts
    same = cmpmod.compare([runs[0], load_run(fake_eval_run(tmp_path / "c", 0.1, 2), name="c")], n_boot=50)
    assert same.points == {} and same.diff("c", "a", "auroc")[0] == pytest.approx(
        same.models[1].runs[0].metrics["auroc"] - runs[0].metrics["auroc"], abs=1e-12)


def test_the_seed_interval_describes_the_prompts_the_difference_does(tmp_path):
    """Run grpo-seed1 was evaluated on 8 of the 12 prompts: every run's per-seed value in the seed interval is taken
    over those 8, as the difference's value is (it was each run's metrics.json, over 12 prompts for three runs and 8
    for one); a model without generations to recompute from keeps metrics.json on both sides."""
    from capo.evaluation.metrics import compute_metrics
    from capo.evaluation.run import atomic_write_text

    dirs = {f"{m}-seed{s}": fake_eval_run(tmp_path / f"{m}-seed{s}", shift, 10 * s + i)
            for i, (m, shift) in enumerate((("capo", 0.3), ("grpo", 0.1))) for s in (0, 1)}
    cut = dirs["grpo-seed1"]
    rows = [r for r in map(json.loads, (cut / "generations.jsonl").read_text().splitlines())
            if int(r["prompt_id"][1:]) < 8]
    (cut / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(cut / "metrics.json", json.dumps({"config": {"model": "m", "k": 4}, **compute_metrics(rows, n_boot=0)}))
    runs = [load_run(d, name=n) for n, d in dirs.items()]
    shared = [f"p{i}" for i in range(8)]
    on = {n: cmpmod._measures_on(cmpmod._load_seed(d), shared) for n, d in dirs.items()}
    for n_boot in (0, 30):
        c = cmpmod.compare(runs, n_boot=n_boot, reference="grpo")
        for key in ("auroc", "accuracy", "brier"):
            per_seed = [on[f"capo-seed{s}"][key] - on[f"grpo-seed{s}"][key] for s in (0, 1)]
            got = c.seed_diff("capo", "grpo", key)
            assert got["n"] == 2 and got["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-12), key
            assert c.diff("capo", "grpo", key)[0] == pytest.approx(got["mean"], abs=1e-12), key
    whole = [runs[s].metrics["auroc"] - runs[2 + s].metrics["auroc"] for s in (0, 1)]
    assert got["mean"] != pytest.approx(sum(whole) / 2, abs=1e-6)  # the old value, over 12 and 8 prompts
    (dirs["capo-seed0"] / "generations.jsonl").unlink()  # capo cannot be recomputed: metrics.json on both sides
    c = cmpmod.compare([load_run(d, name=n) for n, d in dirs.items()], n_boot=0, reference="grpo")
    assert c.seed_diff("capo", "grpo", "auroc")["mean"] == pytest.approx(sum(whole) / 2, abs=1e-12)


def test_two_evaluations_of_one_training_run_are_one_seed(tmp_path):
    """Two checkpoints of grpo-seed0 (the report labels the second "grpo-seed0 (2)") are one training seed: the
    tables count 1 seed of 2 runs and the headline says they are averaged (it said "2 training seeds", their spread
    "sd over seeds"; found by an audit)."""
    from capo.evaluation.report import markdown_tables

    runs = [load_run(fake_eval_run(tmp_path / "b", 0.0, 1), name="base"),
            load_run(fake_eval_run(tmp_path / "g1", 0.2, 2), name="grpo-seed0"),
            load_run(fake_eval_run(tmp_path / "g2", 0.3, 3), name="grpo-seed0 (2)")]
    c = cmpmod.compare(runs, n_boot=20, reference="base")
    assert cmpmod.training_seeds(c.models[1]) == 1
    assert "grpo: several evaluations of one seed, averaged" in cmpmod.headline(c)[0]
    assert "mean over up to" not in cmpmod.headline(c)[0]
    assert "| grpo | 1 (2 runs) |" in markdown_tables(c)

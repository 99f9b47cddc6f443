"""The table model's report: seed-paired differences against the reference, hand-computed, and bad input."""

from __future__ import annotations

import json
import math

import pytest

from capo.sweep import table


def _write(folder, method, seed, ece, err=0.1, auroc=0.8, acc=0.7):
    rec = {"settings": {"method": method, "seed": seed},
           "final": {"ece": ece, "abs_err_rate": err, "auroc": auroc, "accuracy": acc},
           "curves": [{"step": 0, "ece": 0.13}, {"step": 10, "ece": ece}], "rate": [0.2, 0.7],
           "stated_by_category": [0.1, 0.9]}
    (folder / f"{method}-seed{seed}.json").write_text(json.dumps(rec))


def test_paired_differences_hand_computed(tmp_path):
    for seed, (g, d, r) in enumerate([(0.13, 0.01, 0.02), (0.15, 0.02, 0.02), (0.11, 0.01, 0.03)], start=1):
        _write(tmp_path, "grpo", seed, g)
        _write(tmp_path, "dr_grpo", seed, d)
        _write(tmp_path, "rloo", seed, r)
    s = table.summarize(table.load(tmp_path), "grpo")
    p = s["paired"]["dr_grpo"]["ece"]
    diffs = [0.12, 0.13, 0.10]  # grpo - dr_grpo per seed
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 df)
    assert p["seeds"] == [1, 2, 3] and p["diffs"] == pytest.approx(diffs)
    assert (p["mean"], p["low"], p["high"]) == pytest.approx((mean, mean - half, mean + half), abs=1e-9)
    # Holm over the two compared methods: the smaller p doubled, the larger max(itself, that)
    ps = sorted([s["paired"]["dr_grpo"]["ece"]["p"], s["paired"]["rloo"]["ece"]["p"]])
    holm = sorted([s["paired"]["dr_grpo"]["ece"]["p_holm"], s["paired"]["rloo"]["ece"]["p_holm"]])
    assert holm == pytest.approx([2 * ps[0], max(2 * ps[0], ps[1])])
    assert s["methods"]["grpo"]["ece"] == [0.13, 0.15, 0.11]
    assert "| dr_grpo | +0.117 [" in table.markdown(s)


def test_the_per_seed_table_puts_each_value_under_its_own_seed(tmp_path):
    """GRPO ran seeds 1-3, Dr. GRPO 2-3: the table's columns are seeds 1-3 and Dr. GRPO's seed-1 cell is empty (it
    filled by position: GRPO's seed-1 ECE sat under "seed 2" in a header of Dr. GRPO's seeds)."""
    for seed, ece in ((1, 0.11), (2, 0.22), (3, 0.33)):
        _write(tmp_path, "grpo", seed, ece)
    for seed, ece in ((3, 0.03), (2, 0.02)):
        _write(tmp_path, "dr_grpo", seed, ece)
    md = table.markdown(table.summarize(table.load(tmp_path), "grpo"))
    per_seed = md[md.index("Per seed (ECE):"):].splitlines()
    assert "| method | seed 1 | seed 2 | seed 3 |" in per_seed
    assert "| grpo | 0.110 | 0.220 | 0.330 |" in per_seed and "| dr_grpo | - | 0.020 | 0.030 |" in per_seed


def test_report_writes_data_then_figure_and_refuses_bad_input(tmp_path, capsys):
    recs = tmp_path / "recs"
    recs.mkdir()
    for seed in (1, 2):
        _write(recs, "grpo", seed, 0.1 + seed / 100)
        _write(recs, "dr_grpo", seed, 0.01)
    out = tmp_path / "out"
    assert table.main([str(recs), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"summary.json", "summary.md", "table_model.png"}
    assert table.main([str(tmp_path / "empty")]) == 2
    assert "no table-model records" in capsys.readouterr().err
    assert table.main([str(recs), "--reference", "ppo"]) == 2
    assert "no records of the reference 'ppo'" in capsys.readouterr().err

"""compute_metrics on hand-made rows, `--generations` files (schema + errors), and `capo report`."""

import json
import math

import pytest
import torch

from capo.cli import main
from capo.core import calibration as cal
from capo.core import voting
from capo.evaluation.metrics import compute_metrics, pass_ks


def rows_fixture():
    # 3 prompts x 4 samples; answer ids and verdicts chosen by hand
    spec = [
        ("a", [("4", "correct", -0.1, 0), ("4", "correct", -0.3, 0), ("5", "incorrect", -0.2, 1), ("5", "incorrect", -0.9, 1)]),
        ("b", [("1", "incorrect", -0.5, 0), ("2", "correct", -0.4, 1), (None, "unparsable", -1.5, -1), ("1", "incorrect", -0.6, 0)]),
        ("c", [("7", "incorrect", -0.2, 0), ("7", "incorrect", -0.25, 0), ("8", "incorrect", -0.3, 1), ("9", "incorrect", -0.1, 2)]),
    ]
    rows = []
    for pid, samples in spec:
        for j, (ans, v, lp, aid) in enumerate(samples):
            rows.append({"prompt_id": pid, "sample_idx": j, "text": f"{pid}{j}", "answer": ans, "verdict": v,
                         "mean_logprob": lp, "n_tokens": 10, "answer_id": aid, "confidence": None,
                         "finish_reason": "stop"})
    return rows


def test_compute_metrics_matches_core_functions():
    rows = rows_fixture()
    res = compute_metrics(rows, n_bins=10, n_boot=0)
    m = res["metrics"]
    lpm = torch.tensor([r["mean_logprob"] for r in rows], dtype=torch.float64)
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    g = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    a = torch.tensor([r["answer_id"] for r in rows])
    assert m["accuracy"] == pytest.approx(3 / 12)
    # hand-computed AUC-mean: prompt a: correct {-0.1,-0.3} vs incorrect {-0.2,-0.9}: pairs won 1+1+0+1 = 3/4;
    # prompt b: correct {-0.4} vs incorrect {-0.5,-1.5,-0.6}: 3/3 = 1; prompt c has no correct -> excluded
    assert m["auc_mean"] == pytest.approx((0.75 + 1.0) / 2)
    assert m["auc_mean_groups"] == 2
    assert m["auroc"] == pytest.approx(cal.auroc(lpm, c))
    assert m["ece"] == pytest.approx(cal.ece(torch.exp(lpm), c))
    assert m["brier"] == pytest.approx(cal.brier(torch.exp(lpm), c))
    assert m["mean_at_k"] == pytest.approx((0.5 + 0.25 + 0) / 3)
    assert m["pass_at_1"] == pytest.approx(m["mean_at_k"])
    # pass@4: a and b have a correct sample -> 2/3
    assert m["pass_at_4"] == pytest.approx(2 / 3)
    assert m["pass_at_2"] == pytest.approx((1 - 1 / 6 + 1 - 3 / 6 + 0) / 3)
    # majority: a tie 2-2 -> first occurrence '4' correct; b '1' (x2) wrong; c '7' wrong -> 1/3
    assert m["majority_vote"] == pytest.approx(1 / 3)
    assert m["majority_vote"] == voting.majority_vote(a, c, g).accuracy
    assert m["verdict_unparsable"] == 1 and m["verdict_correct"] == 3
    assert "confidence_weighted_vote" not in m  # no verbal confidence at all
    rel = res["curves"]["reliability"]
    assert sum(rel["count"]) == 12


def test_compute_metrics_verbal_and_empty_response():
    rows = rows_fixture()
    for i, r in enumerate(rows):
        r["confidence"] = [0.9, 0.8, 0.3, 0.1][i % 4]
    rows[3]["mean_logprob"], rows[3]["n_tokens"] = None, 0  # empty response: confidence exp(-inf) = 0
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["empty_responses"] == 1
    assert m["verbal_brier"] == pytest.approx(
        sum((r["confidence"] - (r["verdict"] == "correct")) ** 2 for r in rows) / 12)
    assert math.isfinite(m["brier"])
    # verbal votes by hand (confidences 0.9, 0.8, 0.3, 0.1 per prompt). Weighted vote: a: class 0 (0.9 + 0.8) beats
    # class 1 (0.3 + 0.1), correct; b: class 0 (0.9 + 0.1) beats class 1 (0.8), wrong; c: wrong -> 1/3.
    # Max verbal confidence: the 0.9 row of each prompt: a correct, b wrong, c wrong -> 1/3.
    assert m["confidence_weighted_vote"] == pytest.approx(1 / 3, abs=1e-12)
    assert m["max_confidence_verbal"] == pytest.approx(1 / 3, abs=1e-12)
    # the empty response (row 3: prompt a, class 1, wrong) ranks below every other one: max lpm picks a's -0.1
    # (correct), b's -0.4 (class 1, correct), c's -0.1 (wrong) -> 2/3; ranked first it would pick row 3 (wrong)
    assert m["max_confidence_lpm"] == pytest.approx(2 / 3, abs=1e-12)
    # perplexity consistency: a: class 0 e^-0.1 + e^-0.3 = 1.646 > class 1 e^-0.2 + 0 = 0.819 (correct);
    # b: class 0 e^-0.5 + e^-0.6 = 1.155 > class 1 e^-0.4 = 0.670 (wrong); c: wrong -> 1/3
    assert m["perplexity_consistency"] == pytest.approx(1 / 3, abs=1e-12)


def test_compute_metrics_verbal_votes_disagree():
    # one confidence changed so that the two verbal rules choose differently in prompt b: weighted vote keeps
    # class 0 (0.9 + 0.1 = 1.0 > 0.95, wrong), max confidence takes the 0.95 row (class 1, correct)
    rows = rows_fixture()
    for i, r in enumerate(rows):
        r["confidence"] = [0.9, 0.8, 0.3, 0.1][i % 4]
    rows[5]["confidence"] = 0.95
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["confidence_weighted_vote"] == pytest.approx(1 / 3, abs=1e-12)
    assert m["max_confidence_verbal"] == pytest.approx(2 / 3, abs=1e-12)


def test_timeout_verdicts_count_as_wrong_in_accuracy():
    # 2 prompts x 3 samples with two TIMEOUT verdicts: they stay in every denominator and never count as correct
    spec = [("p", "correct", -0.1, 0), ("p", "timeout", -0.2, -1), ("p", "incorrect", -0.3, 1),
            ("q", "timeout", -0.4, -1), ("q", "correct", -0.5, 0), ("q", "unparsable", -0.6, -1)]
    rows = [{"prompt_id": pid, "text": f"t{j}", "answer": None, "verdict": v, "mean_logprob": lp,
             "n_tokens": [4, 0, 6, 8, 2, 4][j], "answer_id": aid, "confidence": None,
             "finish_reason": ["stop", "length", "stop", "length", "stop", "stop"][j]}
            for j, (pid, v, lp, aid) in enumerate(spec)]
    rows[1]["mean_logprob"] = None  # the 0-token response
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["accuracy"] == pytest.approx(2 / 6, abs=1e-12)
    assert m["mean_at_k"] == pytest.approx(1 / 3, abs=1e-12) and m["pass_at_3"] == pytest.approx(1.0)
    assert (m["verdict_correct"], m["verdict_incorrect"], m["verdict_unparsable"], m["verdict_timeout"]) == (2, 1, 1, 2)
    assert m["finish_length_frac"] == pytest.approx(2 / 6, abs=1e-12)
    assert m["mean_tokens"] == pytest.approx(24 / 6, abs=1e-12) and m["empty_responses"] == 1
    # AUC-mean: p: correct -0.1 vs wrong {-inf, -0.3} -> 1; q: correct -0.5 vs wrong {-0.4, -0.6} -> 1/2
    assert m["auc_mean"] == pytest.approx(0.75, abs=1e-12) and m["auc_mean_groups"] == 2
    # majority: each prompt's only answer class 0 wins (class 1 of p ties it, first occurrence) -> both correct
    assert m["majority_vote"] == pytest.approx(1.0)


def test_empty_response_ranks_last_in_the_precision_coverage_curve():
    # one prompt: wrong at lpm -0.2, correct at -0.5, an empty response (no answer); by descending confidence the
    # curve is (1/3, 0), (2/3, 1/2), (1, 1/3); ranked first the empty response would make it (1/3, 0), (2/3, 0), ...
    rows = [{"prompt_id": "p", "text": t, "answer": a, "verdict": v, "mean_logprob": lp, "n_tokens": n,
             "answer_id": aid, "confidence": None}
            for t, a, v, lp, n, aid in [("x", "2", "incorrect", -0.2, 3, 0), ("y", "1", "correct", -0.5, 3, 1),
                                        ("", None, "unparsable", None, 0, -1)]]
    res = compute_metrics(rows, n_boot=0)
    sel = res["curves"]["selective"]
    assert sel["x"] == pytest.approx([1 / 3, 2 / 3, 1.0], abs=1e-12)
    assert sel["y"] == pytest.approx([0.0, 0.5, 1 / 3], abs=1e-12)
    hist = res["curves"]["hist"]
    assert hist["correct"] == pytest.approx([math.exp(-0.5)]) and hist["incorrect"] == pytest.approx([math.exp(-0.2), 0.0])
    m = res["metrics"]
    assert m["max_confidence_lpm"] == 0.0 and m["perplexity_consistency"] == 0.0  # the wrong -0.2 answer wins
    assert m["mean_confidence"] == pytest.approx((math.exp(-0.2) + math.exp(-0.5)) / 3, abs=1e-12)


def bootstrap_rows():
    # 10 questions x 4 samples with varied per-question AUCs, so that interval ends move with the seed and n_boot
    gen = torch.Generator().manual_seed(11)
    lp = -torch.rand(40, generator=gen, dtype=torch.float64)
    ok = torch.rand(40, generator=gen) < 0.5
    return [{"prompt_id": f"q{i // 4}", "text": f"t{i}", "answer": None, "verdict": "correct" if bool(ok[i]) else
             "incorrect", "mean_logprob": float(lp[i]), "n_tokens": 3, "answer_id": -1, "confidence": None}
            for i in range(40)]


def test_bootstrap_interval_ends_in_order_and_match_the_core():
    rows = bootstrap_rows()
    m = compute_metrics(rows, n_boot=200, seed=3)["metrics"]
    assert m["accuracy_ci_low"] < m["accuracy"] < m["accuracy_ci_high"]
    assert m["auc_mean_ci_low"] <= m["auc_mean"] <= m["auc_mean_ci_high"]
    lpm = torch.tensor([r["mean_logprob"] for r in rows], dtype=torch.float64)
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    g = torch.arange(40) // 4
    lo, hi = cal.bootstrap_ci(lambda cc: float(cc.to(torch.float64).mean()), c, group_ids=g, n_boot=200, seed=3)
    assert (m["accuracy_ci_low"], m["accuracy_ci_high"]) == (lo, hi)
    lo, hi = cal.bootstrap_ci(lambda s, cc, gg: cal.auc_mean(s, cc, gg).value, lpm, c, group_ids=g, n_boot=200, seed=3,
                              pass_group_ids=True)
    assert (m["auc_mean_ci_low"], m["auc_mean_ci_high"]) == (lo, hi)
    for other in [dict(n_boot=200, seed=4), dict(n_boot=100, seed=3)]:  # the seed and n_boot reach both intervals
        o = compute_metrics(rows, **other)["metrics"]
        assert (o["auc_mean_ci_low"], o["auc_mean_ci_high"]) != (lo, hi), other
        assert (o["accuracy_ci_low"], o["accuracy_ci_high"]) != (m["accuracy_ci_low"], m["accuracy_ci_high"]), other
    one = compute_metrics(rows[:4], n_boot=200)["metrics"]  # one question: no interval over questions
    assert "accuracy_ci_low" not in one and "auc_mean_ci_low" not in one


def test_pass_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(6) == [1, 2, 4, 6]


def write_gen(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_generations_file_end_to_end(tmp_path):
    rows = [
        {"prompt_id": "p1", "text": "so \\boxed{1/2}", "gold": "0.5", "mean_logprob": -0.2, "n_tokens": 5},
        {"prompt_id": "p1", "text": "so \\boxed{0.50}", "gold": "0.5", "token_logprobs": [-0.1, -0.3]},
        {"prompt_id": "p1", "text": "so \\boxed{3}", "gold": "0.5", "sum_logprob": -4.0, "n_tokens": 4},
        {"prompt_id": "p2", "text": "<answer>7</answer><confidence>0.9</confidence>", "gold": "7", "mean_logprob": -0.5},
        {"prompt_id": "p2", "text": "", "gold": "7", "n_tokens": 0},
    ]
    gen = write_gen(tmp_path / "g.jsonl", rows)
    out = tmp_path / "run"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1", "--n-boot", "0",
                 "--no-progress"]) == 0
    got = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["verdict"] for r in got] == ["correct", "correct", "incorrect", "correct", "unparsable"]
    assert got[1]["mean_logprob"] == pytest.approx(-0.2) and got[1]["n_tokens"] == 2
    assert got[2]["mean_logprob"] == pytest.approx(-1.0)
    assert got[3]["confidence"] == 0.9
    assert got[4]["mean_logprob"] is None
    m = json.loads((out / "metrics.json").read_text())["metrics"]
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["majority_vote"] == pytest.approx(1.0)  # '1/2' and '0.50' form one class in p1


@pytest.mark.parametrize(
    "row, match",
    [
        ({"prompt_id": "p", "text": "x", "gold": "1"}, r"g.jsonl line 2: missing log-probs"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": 0.5}, r"line 2: 'mean_logprob' must be a number <= 0"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "token_logprobs": [-1, "a"]}, r"line 2: 'token_logprobs' must be"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": -1, "n_tokens": -1},
         r"line 2: 'n_tokens' must be a whole number >= 0, got -1"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": -1, "n_tokens": 2.5},
         r"line 2: 'n_tokens' must be a whole number >= 0, got 2.5"),
        ({"prompt_id": "p", "text": "x", "mean_logprob": -1}, r"line 2: missing field 'gold'"),
        ({"text": "x", "gold": "1", "mean_logprob": -1}, r"line 2: missing field 'prompt_id'"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": -1, "confidence": 2}, r"line 2: 'confidence' must be"),
        ({"prompt_id": "q", "sample_idx": 0, "text": "x", "gold": "1", "mean_logprob": -1}, r"line 2: duplicate"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "token_logprobs": [-1, -1, -1], "n_tokens": 10},
         r"line 2: 'n_tokens' is 10 but 'token_logprobs' has 3 entries"),  # was replaced by 3 silently
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": -1, "token_entropy": [1, 1, 1],
          "token_kl_uniform": [1, 1, 1, 9, 9]},  # read through the entropy list's mask, silently
         r"line 2: 'token_kl_uniform' has 5 entries but 'token_entropy' has 3"),
    ],
)
def test_generations_file_errors(tmp_path, capsys, row, match):
    import re

    first = {"prompt_id": "q", "sample_idx": 0, "text": "x", "gold": "1", "mean_logprob": -1.0}
    gen = write_gen(tmp_path / "g.jsonl", [first, row])
    out = tmp_path / "run"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not (out / "metrics.json").exists()


def test_rows_are_scored_in_sampling_order_wherever_they_stand_in_the_file(tmp_path, capsys):
    """Each prompt: sample 0 right, sample 1 wrong, equally confident (a tie). The votes go to the earlier sample
    whatever the file's order (they went to the earlier line: 1.0 one way, 0.0 the other; found by an audit); and
    --limit / -k, which select nothing here, are refused, as is every other flag that only chooses what is generated."""
    rows = [{"prompt_id": f"p{p}", "sample_idx": j, "text": f"\\boxed{{{3 if j == 0 else 7}}}", "gold": "3",
             "mean_logprob": -0.5, "n_tokens": 4} for p in range(6) for j in (0, 1)]
    flipped = [r for p in range(6) for r in (rows[2 * p + 1], rows[2 * p])]
    got = []
    for name, rs in (("fwd", rows), ("rev", flipped)):
        out = tmp_path / name
        assert main(["eval", "--generations", str(write_gen(tmp_path / f"{name}.jsonl", rs)), "--out", str(out),
                     "--verify-workers", "1", "--n-boot", "0", "--no-progress"]) == 0
        m = json.loads((out / "metrics.json").read_text())["metrics"]
        got.append({k: m[k] for k in ("accuracy", "majority_vote", "perplexity_consistency", "max_confidence_lpm")})
    assert got[0] == got[1] == {"accuracy": 0.5, "majority_vote": 1.0, "perplexity_consistency": 1.0,
                                "max_confidence_lpm": 1.0}
    capsys.readouterr()
    for flags in (["--limit", "2"], ["-k", "1"], ["--temperature", "1.0"], ["--dataset", "math500"],
                  ["--max-new-tokens", "9"], ["--system-prompt", "x"], ["--no-token-stats"]):
        assert main(["eval", "--generations", str(tmp_path / "fwd.jsonl"), "--out", str(tmp_path / "x"), *flags]) == 2
        assert f"{flags[0]} chooses what is generated; --generations generates nothing" in capsys.readouterr().err
    assert main(["eval", "--generations", str(tmp_path / "fwd.jsonl"), "--out", str(tmp_path / "x"), "-k", "2",
                 "--top-p", "0.9"]) == 2
    assert "-k, --top-p choose what is generated" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["eval", "--model", "default", "--dataset", str(tmp_path / "fwd.jsonl"), "--split", "test", "--out",
                 str(tmp_path / "x")]) == 2  # a file has no splits: even the default value, given, is refused
    assert "--split 'test' chooses a split of a built-in dataset; the file" in capsys.readouterr().err


def test_a_bad_token_list_is_named_and_valid_ones_pass_row_by_row(tmp_path, capsys):
    """With one bad list in the file the field is checked row by row: an empty list (an empty response) and a list
    with integers pass, the bad one's line is named."""
    rows = [{"prompt_id": "q", "text": "", "gold": "1", "token_logprobs": []},
            {"prompt_id": "q", "text": "x", "gold": "1", "token_logprobs": [-1, -0.5]},
            {"prompt_id": "q", "text": "y", "gold": "1", "token_logprobs": [-1.0, True]}]
    gen = write_gen(tmp_path / "g.jsonl", rows)
    assert main(["eval", "--generations", str(gen), "--out", str(tmp_path / "run"), "--verify-workers", "1"]) == 2
    assert "g.jsonl line 3: 'token_logprobs' must be a list of numbers <= 0" in capsys.readouterr().err


def test_generations_malformed_and_missing(tmp_path, capsys):
    gen = tmp_path / "g.jsonl"
    gen.write_text('{"prompt_id": 1}\n{oops\n')
    assert main(["eval", "--generations", str(gen), "--out", str(tmp_path / "r")]) == 2
    assert "g.jsonl line 2: malformed JSON" in capsys.readouterr().err
    assert main(["eval", "--generations", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err


def curve_rows():
    # prompt p: confidences exp(lpm) 0.15 (right), 0.35 (wrong), 0.85 (right), an empty response; prompt q: 0.55 and
    # 0.05, both wrong. Verbal confidences on three rows only.
    spec = [("p", "correct", 0.15, 0.9), ("p", "incorrect", 0.35, 0.6), ("p", "correct", 0.85, None),
            ("p", "unparsable", None, None), ("q", "incorrect", 0.55, None), ("q", "incorrect", 0.05, 0.3)]
    return [{"prompt_id": pid, "text": f"r{j}", "answer": None, "verdict": v,
             "mean_logprob": None if q is None else math.log(q), "n_tokens": 0 if q is None else 5,
             "answer_id": -1 if v == "unparsable" else j, "confidence": vq}
            for j, (pid, v, q, vq) in enumerate(spec)]


def test_curves_hand_computed():
    res = compute_metrics(curve_rows(), n_bins=2, n_boot=0)
    cv, m = res["curves"], res["metrics"]
    # bins [0, .5), [.5, 1), [1, 1]: {.15 R, .35 W, 0 W, .05 W}, {.85 R, .55 W}, {}
    rel = cv["reliability"]
    assert rel["bin_edges"] == [0.0, 0.5, 1.0, 1.0] and rel["count"] == [4, 2, 0]
    assert rel["confidence"][:2] == pytest.approx([0.55 / 4, 0.7], abs=1e-12) and rel["confidence"][2] is None
    assert rel["accuracy"][:2] == pytest.approx([0.25, 0.5], abs=1e-12) and rel["accuracy"][2] is None
    assert cv["hist"]["correct"] == pytest.approx([0.15, 0.85], abs=1e-12)
    assert cv["hist"]["incorrect"] == pytest.approx([0.35, 0.0, 0.55, 0.05], abs=1e-12)
    # precision-coverage by descending lpm: .85 R, .55 W, .35 W, .15 R, .05 W, empty
    assert cv["selective"]["x"] == pytest.approx([k / 6 for k in range(1, 7)], abs=1e-12)
    assert cv["selective"]["y"] == pytest.approx([1, 1 / 2, 1 / 3, 2 / 4, 2 / 5, 2 / 6], abs=1e-12)
    # verbal: only the three rows that have one (.9 R, .6 W, .3 W)
    rv = cv["reliability_verbal"]
    assert rv["count"] == [1, 2, 0] and rv["confidence"][:2] == pytest.approx([0.3, 0.75], abs=1e-12)
    assert rv["accuracy"][:2] == pytest.approx([0.0, 0.5], abs=1e-12) and rv["accuracy"][2] is None
    assert cv["selective_verbal"]["x"] == pytest.approx([1 / 3, 2 / 3, 1.0], abs=1e-12)
    assert cv["selective_verbal"]["y"] == pytest.approx([1.0, 0.5, 1 / 3], abs=1e-12)
    assert cv["per_prompt_accuracy"] == {"p": 0.5, "q": 0.0}
    # prompts of 4 and 2 samples: k_min = 2; mean@k is the mean of per-prompt accuracies, not the pooled 2/6
    assert m["k_min"] == 2 and m["mean_at_k"] == pytest.approx(0.25, abs=1e-12)
    assert m["pass_at_2"] == pytest.approx((1 - 1 / 6) / 2, abs=1e-12) and "pass_at_4" not in m
    assert m["verbal_missing"] == 3 and m["empty_responses"] == 1 and m["mean_tokens"] == pytest.approx(25 / 6)
    # AUC-mean: p only (q has no right answer): right {.15, .85} vs wrong {.35, empty}: 3 of 4 pairs
    assert m["auc_mean"] == pytest.approx(0.75, abs=1e-12) and m["auc_mean_groups"] == 1
    # ECE over the n_bins = 2 bins above: 4/6 |0.25 - 0.1375| + 2/6 |0.5 - 0.7|
    assert m["ece"] == pytest.approx(4 / 6 * 0.1125 + 2 / 6 * 0.2, abs=1e-12)


def glue_rows():
    # rows_fixture with verbal confidences on some rows and three tokens' log-probs and top-k confidences each
    rows = rows_fixture()
    for i, r in enumerate(rows):
        r["confidence"] = None if i % 3 == 0 else [0.9, 0.8, 0.3, 0.1][i % 4]
        r["token_logprobs"] = [-0.05 * (i % 5), -0.3 * ((i * 7) % 4), -0.1 * (i % 3)]
        r["token_topk_conf"] = [1.0 + 0.5 * ((i * 5) % 7), 2.0 + (i % 4), 0.5 + 0.25 * ((i * 3) % 5)]
    return rows


@pytest.mark.parametrize("verbal", [False, True])
def test_estimator_table_glue(verbal):
    """compute_metrics hands its rows and every setting to the estimator table (each one changes the table here)."""
    from capo.evaluation.estimators import estimator_table, unavailable_estimators

    rows = glue_rows()
    if not verbal:
        for r in rows:
            r["confidence"] = None
    knobs = {"conf_window": 2, "conf_tail": 2}
    res = compute_metrics(rows, n_bins=5, n_boot=20, seed=4, keep_fraction=0.5, conf_knobs=knobs)
    m = res["metrics"]
    assert any(k.startswith("verbal_") for k in m) is verbal  # no verbal confidence: no verbal metric at all
    g = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    a = torch.tensor([r["answer_id"] for r in rows])
    v = torch.tensor([math.nan if r["confidence"] is None else r["confidence"] for r in rows], dtype=torch.float64)
    kw = dict(group_ids=g, correct=c, answer_ids=a, verbal=v if verbal else None)
    want = estimator_table(rows, **kw, knobs=knobs, keep_fraction=0.5, n_bins=5, n_boot=20, seed=4)
    assert res["curves"]["estimators"] == want and ("verbal" in want) is verbal
    for other in [dict(knobs=None, keep_fraction=0.5, n_bins=5, n_boot=20, seed=4),
                  dict(knobs=knobs, keep_fraction=0.25, n_bins=5, n_boot=20, seed=4),
                  dict(knobs=knobs, keep_fraction=0.5, n_bins=10, n_boot=20, seed=4),
                  dict(knobs=knobs, keep_fraction=0.5, n_bins=5, n_boot=20, seed=5),
                  dict(knobs=knobs, keep_fraction=0.5, n_bins=5, n_boot=0, seed=4)]:
        assert estimator_table(rows, **kw, **other) != want, other
    assert res["curves"]["estimators_unavailable"] == unavailable_estimators(rows, verbal)
    assert ("verbal" in res["curves"]["estimators_unavailable"]) is not verbal


def test_defaults_and_absent_counts():
    rows = bootstrap_rows()  # 10 questions: the bootstrap interval ends move with n_boot and the seed
    got = compute_metrics(rows)
    assert got == compute_metrics(rows, n_bins=10, n_boot=1000, seed=0)
    assert compute_metrics(rows, seed=1)["metrics"] != got["metrics"]  # the default seed is 0
    assert len(got["curves"]["reliability"]["bin_edges"]) == 12  # 10 bins and the [1, 1] bin
    m = compute_metrics(rows_fixture(), n_boot=0)["metrics"]
    assert m["verdict_timeout"] == 0 and m["finish_length_frac"] == 0.0  # absent values count 0


def test_bootstrap_needs_one_draw_and_two_questions():
    two = compute_metrics(rows_fixture()[:8], n_boot=1)["metrics"]  # two questions, a single draw
    assert two["accuracy_ci_low"] == two["accuracy_ci_high"] and "auc_mean_ci_low" in two


def test_missing_verbal_confidence_votes_as_zero():
    # one prompt: class 0 (right, verbal 0.9) against class 1 (two wrong rows without a verbal confidence): missing
    # counts 0 in the weighted vote and ranks last for max confidence -> both right
    rows = [{"prompt_id": "p", "text": f"t{i}", "answer": None, "verdict": v, "mean_logprob": -0.5, "n_tokens": 2,
             "answer_id": aid, "confidence": q} for i, (v, aid, q) in
            enumerate([("correct", 0, 0.9), ("incorrect", 1, None), ("incorrect", 1, None)])]
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["confidence_weighted_vote"] == 1.0 and m["max_confidence_verbal"] == 1.0
    # a missing confidence ranks below a stated 0, not level with it (a tie that the earlier row won)
    rows = [{"prompt_id": "p", "text": f"t{i}", "answer": None, "verdict": v, "mean_logprob": -0.5, "n_tokens": 2,
             "answer_id": aid, "confidence": q} for i, (v, aid, q) in
            enumerate([("incorrect", 1, None), ("correct", 0, 0.0)])]
    assert compute_metrics(rows, n_boot=0)["metrics"]["max_confidence_verbal"] == 1.0


def test_non_finite_metrics_are_none_and_missing_lengths_are_skipped():
    rows = curve_rows()[4:]  # prompt q alone: no right answer -> AUC-mean has no question
    for r in rows:
        r["n_tokens"] = None
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["auc_mean"] is None and m["auc_mean_groups"] == 0 and m["accuracy"] == 0.0
    assert m["mean_tokens"] is None and m["empty_responses"] == 0


def test_long_curves_are_thinned_to_200_points():
    n = 250  # one prompt, distinct confidences: 250 selective points, thinned to 200 (rounded linspace indices)
    rows = [{"prompt_id": "p", "text": f"t{i}", "answer": None, "verdict": "correct" if i % 2 else "incorrect",
             "mean_logprob": -0.001 * (i + 1), "n_tokens": 3, "answer_id": -1, "confidence": None} for i in range(n)]
    sel = compute_metrics(rows, n_boot=0)["curves"]["selective"]
    assert len(sel["x"]) == len(sel["y"]) == 200
    assert sel["x"][0] == pytest.approx(1 / n) and sel["x"][-1] == 1.0
    assert sel["x"][100] == pytest.approx(126 / n)  # index round(249 * 100 / 199) = 125 -> coverage 126 / 250
    assert sel["y"][0] == 0.0 and sel["y"][-1] == 0.5


def test_assign_answer_ids_groups_by_prompt():
    from capo.evaluation.metrics import assign_answer_ids
    from capo.verify import Verifier

    rows = [{"prompt_id": pid, "answer": a} for pid, a in
            [("a", "3"), ("b", "4"), ("a", "03"), ("a", None), ("b", "4"), ("a", "4"), (7, "5")]]
    with Verifier(workers=1) as v:  # integer literals only: judged without starting a worker
        assign_answer_ids(rows, v)
    assert [r["answer_id"] for r in rows] == [0, 0, 0, -1, 0, 1, 0]


def test_perplexity_consistency_counts_identical_texts_once():
    # prompt p: the text "A" (class 0, wrong) three times at lpm -0.1, and two distinct texts of class 1 (right) at
    # -0.2 and -0.3. Unique paths: class 0 weighs e^-0.1 = 0.905 < class 1 e^-0.2 + e^-0.3 = 1.560 -> right. Counting
    # every copy (3 e^-0.1 = 2.71) would pick class 0. Prompt q reuses the text "A" (right): a path of its own prompt.
    spec = [("p", "A", 0, "incorrect", -0.1)] * 3 + [("p", "B", 1, "correct", -0.2), ("p", "C", 1, "correct", -0.3),
                                                    ("q", "A", 0, "correct", -0.5), ("q", "D", 1, "incorrect", -0.6)]
    rows = [{"prompt_id": pid, "text": text, "answer": None, "verdict": v, "mean_logprob": lp, "n_tokens": 2,
             "answer_id": aid, "confidence": None} for pid, text, aid, v, lp in spec]
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["perplexity_consistency"] == 1.0
    assert m["majority_vote"] == 0.5  # p: class 0 has 3 of 5 votes (wrong); q: 1-1 tie, first occurrence (right)


def test_metrics_by_group_are_each_groups_own_summary():
    """Rows with a ``group`` (facts: the relation) get one summary per group, equal to the metrics of that group's
    rows alone; rows without one give no breakdown."""
    rows = rows_fixture()
    assert compute_metrics(rows, n_boot=0)["curves"]["by_group"] == {}
    for r in rows:
        r["group"] = "x" if r["prompt_id"] == "a" else "y"
    by = compute_metrics(rows, n_boot=0)["curves"]["by_group"]
    assert list(by) == ["x", "y"]
    # group x = prompt a alone: AUC-mean 3/4 (hand-computed above), accuracy 2/4
    assert by["x"]["accuracy"] == pytest.approx(0.5) and by["x"]["auc_mean"] == pytest.approx(0.75)
    assert by["x"]["n_groups"] == 1 and by["x"]["n"] == 4
    # group y = prompts b and c: b's AUC 1, c has no correct answer (excluded); accuracy 1/8
    assert by["y"]["accuracy"] == pytest.approx(1 / 8) and by["y"]["auc_mean"] == pytest.approx(1.0)
    assert by["y"]["auc_mean_groups"] == 1 and by["y"]["n_groups"] == 2
    y = [r for r in rows if r["group"] == "y"]
    lpm = torch.tensor([r["mean_logprob"] for r in y], dtype=torch.float64)
    c = torch.tensor([r["verdict"] == "correct" for r in y])
    assert by["y"]["ece"] == pytest.approx(cal.ece(torch.exp(lpm), c))
    assert by["y"]["auroc"] == pytest.approx(cal.auroc(lpm, c))
    whole = compute_metrics([r for r in rows if r["group"] == "y"], n_boot=0)["metrics"]
    assert by["y"]["ece"] == pytest.approx(whole["ece"]) and by["y"]["brier"] == pytest.approx(whole["brier"])


def test_short_answers_are_classed_by_their_normal_form_without_the_verifier():
    """Facts' free-text answers: "Paris", "paris." and "PARIS" are one class, "Lyon" another, no answer -1; the
    math verifier is not asked (it would parse city names as products of symbols)."""
    from capo.evaluation.metrics import assign_answer_ids

    class NoVerifier:
        def equivalence_classes_batch(self, groups):
            raise AssertionError("the math verifier was asked about short answers")

    rows = [{"prompt_id": "p", "answer": a} for a in ("Paris", "paris.", "Lyon", None, "PARIS")]
    rows += [{"prompt_id": "q", "answer": "Lyon"}]
    assign_answer_ids(rows, NoVerifier(), "short")
    assert [r["answer_id"] for r in rows] == [0, 0, 1, -1, 0, 0]


def test_a_token_count_written_as_a_whole_float_reads_as_an_int(tmp_path):
    rows = [{"prompt_id": "q", "text": "1", "gold": "1", "mean_logprob": -0.5, "n_tokens": 3.0},
            {"prompt_id": "q", "text": "2", "gold": "1", "mean_logprob": -0.2, "n_tokens": 4}]
    gen = write_gen(tmp_path / "g.jsonl", rows)
    out = tmp_path / "run"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1", "--n-boot", "0",
                 "--no-progress"]) == 0
    got = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["n_tokens"] for r in got] == [3, 4] and isinstance(got[0]["n_tokens"], int)
    assert json.loads((out / "metrics.json").read_text())["curves"]["lengths"]["len_sd_within"] == pytest.approx(
        math.sqrt(0.5))

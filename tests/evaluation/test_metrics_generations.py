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
    assert m["confidence_weighted_vote"] is not None and m["max_confidence_verbal"] is not None
    assert math.isfinite(m["brier"])


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
        ({"prompt_id": "p", "text": "x", "mean_logprob": -1}, r"line 2: missing field 'gold'"),
        ({"text": "x", "gold": "1", "mean_logprob": -1}, r"line 2: missing field 'prompt_id'"),
        ({"prompt_id": "p", "text": "x", "gold": "1", "mean_logprob": -1, "confidence": 2}, r"line 2: 'confidence' must be"),
        ({"prompt_id": "q", "sample_idx": 0, "text": "x", "gold": "1", "mean_logprob": -1}, r"line 2: duplicate"),
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


def test_generations_malformed_and_missing(tmp_path, capsys):
    gen = tmp_path / "g.jsonl"
    gen.write_text('{"prompt_id": 1}\n{oops\n')
    assert main(["eval", "--generations", str(gen), "--out", str(tmp_path / "r")]) == 2
    assert "g.jsonl line 2: malformed JSON" in capsys.readouterr().err
    assert main(["eval", "--generations", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err

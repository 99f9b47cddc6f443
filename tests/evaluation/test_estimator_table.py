"""The confidence-estimator table of `capo eval`: hand-computed entries, agreement with the eval's own metrics and
the core's, the registry as the one list, `--generations` round trip and bad per-token fields."""

import json
import math

import pytest
import torch
from eval_cli_helpers import eval_argv

from capo.cli import main
from capo.core import calibration as cal
from capo.core import voting
from capo.core.registry import CONFIDENCES
from capo.evaluation.estimators import ESTIMATORS, estimator_table
from capo.evaluation.metrics import compute_metrics
from capo.rundir import read_jsonl_rows

# 2 prompts x 3 responses: (verdict, answer_id, per-token log-probs, per-token entropy, verbal confidence)
SPEC = [
    ("p", [("correct", 0, [-0.1, -0.2], [0.5, 0.7], 0.9), ("incorrect", 1, [-1.0, -0.4, -0.1], [1.5, 0.2, 0.1], 0.3),
           ("correct", 0, [-0.3], [0.4], None)]),
    ("q", [("incorrect", 0, [-0.05, -0.05], [0.1, 0.2], 0.8), ("correct", 1, [-0.5, -0.6], [0.9, 1.1], 0.6),
           ("incorrect", 0, [], [], 0.2)]),
]


def rows_fixture():
    rows = []
    for pid, samples in SPEC:
        for j, (v, aid, lp, ent, q) in enumerate(samples):
            rows.append({"prompt_id": pid, "sample_idx": j, "text": f"{pid}{j}", "answer": str(aid), "verdict": v,
                         "mean_logprob": sum(lp) / len(lp) if lp else None, "n_tokens": len(lp), "answer_id": aid,
                         "confidence": q, "finish_reason": "stop", "token_logprobs": lp, "token_entropy": ent,
                         "token_kl_uniform": [1.0] * len(lp), "token_topk_conf": [2.0 - x for x in ent]})
    return rows


def test_every_registered_estimator_has_a_table_entry():
    assert set(ESTIMATORS) == set(CONFIDENCES.names())


def test_hand_computed_entries_and_agreement_with_eval_metrics():
    rows = rows_fixture()
    res = compute_metrics(rows, n_boot=0, keep_fraction=1.0)
    t, m = res["curves"]["estimators"], res["metrics"]
    assert set(t) == set(ESTIMATORS)  # every field present: every estimator
    # lpm row == the eval's own perplexity metrics (empty response ranked lowest, probability 0)
    assert t["lpm"]["auroc"] == pytest.approx(m["auroc"], abs=1e-12)
    assert t["lpm"]["auc_mean"] == pytest.approx(m["auc_mean"], abs=1e-12)
    assert t["lpm"]["ece"] == pytest.approx(m["ece"], abs=1e-12)
    assert t["lpm"]["brier"] == pytest.approx(m["brier"], abs=1e-12)
    # hand: prompt p lpm: correct {-0.15, -0.3} vs incorrect {-0.5}: AUC 1; prompt q: correct {-0.55} vs incorrect
    # {-0.05, empty=-inf}: 1/2 -> AUC-mean 0.75
    assert t["lpm"]["auc_mean"] == pytest.approx(0.75)
    # neg_entropy: p: correct {-0.6, -0.4} vs incorrect {-0.6}: (0.5 + 1)/2; q: correct {-1.0} vs {-0.15, -inf}: 1/2
    assert t["neg_entropy"]["auc_mean"] == pytest.approx((0.75 + 0.5) / 2)
    # self_certainty is 1 for every non-empty response: all ties except the empty one (ranked lowest)
    assert t["self_certainty"]["auc_mean"] == pytest.approx((0.5 + 0.75) / 2)
    # min_token_prob is a probability: ECE / Brier defined; sum_logprob is not
    assert t["min_token_prob"]["brier"] is not None and t["sum_logprob"]["ece"] is None
    # verbal: the missing confidence is left out, as the verbal_* metrics do
    assert t["verbal"]["n"] == 5 and t["verbal"]["auroc"] == pytest.approx(m["verbal_auroc"], abs=1e-12)
    # consistency: p answers (0, 1, 0) -> 2/3, 1/3, 2/3; q (0, 1, 0) the same
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    cons = torch.tensor([2 / 3, 1 / 3, 2 / 3] * 2, dtype=torch.float64)
    assert t["consistency"]["brier"] == pytest.approx(cal.brier(cons, c))
    # keep_fraction = 1 keeps every response: the filtered vote is the majority vote
    assert t["lpm"]["filtered_vote"] == pytest.approx(m["majority_vote"])


def test_filtered_and_weighted_votes_by_hand():
    rows = rows_fixture()
    t = compute_metrics(rows, n_boot=0, keep_fraction=0.1)["curves"]["estimators"]
    # keep the top 10% -> the single most confident response of each question (max-confidence selection)
    # lpm: p -> row 0 (-0.15, answer 0 correct); q -> row 3 (-0.05, answer 0 incorrect): 1/2
    assert t["lpm"]["filtered_vote"] == pytest.approx(0.5)
    # weighted vote with exp(lpm - max): p: answer 0: e^0 + e^-0.15, answer 1: e^-0.35 -> 0 (correct);
    # q: answer 0: e^0 + 0 (empty), answer 1: e^-0.5 -> 0 (incorrect) -> 1/2
    assert t["lpm"]["weighted_vote"] == pytest.approx(0.5)
    # verbal (scores >= 0, weights = q): p: answer 0: 0.9 (missing q weighs 0) vs 0.3 -> correct; q: answer 0:
    # 0.8 + 0.2 = 1.0 vs 0.6 -> incorrect
    assert t["verbal"]["weighted_vote"] == pytest.approx(0.5)
    a = torch.tensor([r["answer_id"] for r in rows])
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    q = torch.tensor([r["confidence"] if r["confidence"] is not None else math.nan for r in rows], dtype=torch.float64)
    assert t["verbal"]["weighted_vote"] == voting.weighted_vote(a, c, g, q).accuracy


def test_knobs_reach_the_estimators():
    rows = rows_fixture()
    t1 = estimator_table(rows, group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
                         correct=torch.tensor([r["verdict"] == "correct" for r in rows]),
                         answer_ids=torch.tensor([r["answer_id"] for r in rows]), verbal=None,
                         knobs={"conf_tail": 1}, n_boot=0)
    # tail over the last token of topk_conf (2 - entropy): p: correct {1.3, 1.6} vs incorrect {1.9} -> 0;
    # q: correct {0.9} vs incorrect {1.8, empty} -> 1/2
    assert t1["tail"]["auc_mean"] == pytest.approx(0.25)
    assert "verbal" not in t1


def test_eval_writes_token_fields_and_the_table_round_trips(tiny_model_dir, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, out, "--limit", "3", "--conf-window", "2")) == 0
    rows = read_jsonl_rows(out / "generations.jsonl")
    for r in rows:
        for f in ("token_logprobs", "token_entropy", "token_kl_uniform", "token_topk_conf"):
            assert len(r[f]) == r["n_tokens"], f
        assert sum(r["token_logprobs"]) == pytest.approx(r["sum_logprob"], abs=1e-9)
    m = json.loads((out / "metrics.json").read_text())
    table = m["curves"]["estimators"]
    assert {"lpm", "neg_entropy", "self_certainty", "tail", "bottom_group", "consistency"} <= set(table)
    assert table["lpm"]["auroc"] == m["metrics"]["auroc"] or (table["lpm"]["auroc"] is None
                                                              and m["metrics"]["auroc"] is None)
    html = (out / "report.html").read_text()
    assert "Confidence estimators" in html and "self_certainty" in html
    # fed back as --generations: the same table
    back = tmp_path / "back"
    assert main(["eval", "--generations", str(out / "generations.jsonl"), "--out", str(back), "--verify-workers", "1",
                 "--n-boot", "20", "--conf-window", "2"]) == 0
    assert json.loads((back / "metrics.json").read_text())["curves"]["estimators"] == table
    # without token statistics only the log-prob and per-response estimators remain
    lean = tmp_path / "lean"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, lean, "--limit", "3", "--no-token-stats")) == 0
    assert "token_entropy" not in read_jsonl_rows(lean / "generations.jsonl")[0]
    assert "neg_entropy" not in json.loads((lean / "metrics.json").read_text())["curves"]["estimators"]


@pytest.mark.parametrize("field,value,match", [
    ("token_entropy", [0.1, -1.0], r"'token_entropy' must be a list of finite numbers >= 0"),
    ("token_topk_conf", [0.1], r"'token_topk_conf' has 1 entries but the response has 2 tokens"),
])
def test_bad_token_fields_are_refused(tmp_path, capsys, field, value, match):
    import re

    row = {"prompt_id": "q", "text": "x", "gold": "1", "token_logprobs": [-0.1, -0.2], field: value}
    gen = tmp_path / "g.jsonl"
    gen.write_text(json.dumps(row) + "\n")
    out = tmp_path / "run"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1"]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (out / "metrics.json").exists()


def test_bad_estimator_settings_exit_2(tmp_path, capsys):
    gen = tmp_path / "g.jsonl"
    gen.write_text(json.dumps({"prompt_id": "q", "text": "x", "gold": "1", "mean_logprob": -1}) + "\n")
    for flag, v, msg in (("--conf-window", "0", "--conf-window: must be an integer >= 1"),
                         ("--keep-fraction", "0", "--keep-fraction: must be in (0, 1]")):
        assert main(["eval", "--generations", str(gen), "--out", str(tmp_path / "r"), flag, v]) == 2
        assert msg in capsys.readouterr().err


def test_rows_with_topk_conf_but_no_entropy_give_the_topk_estimators_only(tmp_path):
    """What a vLLM run writes (token_logprobs and token_topk_conf, no token_entropy / token_kl_uniform): the log-prob
    and DeepConf estimators are scored, with the same values as on the full rows; the entropy ones are listed as not
    available (metrics.json and the report), without an error."""
    full = rows_fixture()
    vllm_like = [{k: v for k, v in r.items() if k not in ("token_entropy", "token_kl_uniform")} for r in full]
    knobs = {"conf_window": 2, "conf_tail": 1}
    t_full = compute_metrics(full, n_boot=0, conf_knobs=knobs)["curves"]["estimators"]
    res = compute_metrics(vllm_like, n_boot=0, conf_knobs=knobs)
    t = res["curves"]["estimators"]
    assert set(t) == set(ESTIMATORS) - {"neg_entropy", "self_certainty"}
    for name in ("tail", "bottom_group", "lowest_group", "lpm", "consistency"):
        assert t[name] == t_full[name], name
    assert res["curves"]["estimators_unavailable"] == {
        "neg_entropy": "needs the per-token field(s) token_entropy in every row",
        "self_certainty": "needs the per-token field(s) token_kl_uniform in every row"}
    assert compute_metrics(full, n_boot=0)["curves"]["estimators_unavailable"] == {}
    # the same through `capo eval --generations` (a vLLM run's generations.jsonl fed back)
    gen = tmp_path / "g.jsonl"
    gen.write_text("".join(json.dumps({**r, "gold": "0"}) + "\n" for r in vllm_like))
    out = tmp_path / "run"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1", "--n-boot", "0",
                 "--conf-window", "2"]) == 0
    curves = json.loads((out / "metrics.json").read_text())["curves"]
    assert {"tail", "bottom_group", "lowest_group"} <= set(curves["estimators"])
    assert not {"neg_entropy", "self_certainty"} & set(curves["estimators"])
    assert set(curves["estimators_unavailable"]) == {"neg_entropy", "self_certainty"}
    html = (out / "report.html").read_text()
    assert "Not available for" in html and "token_kl_uniform" in html and "lowest_group" in html


def test_an_empty_response_weighs_nothing_in_a_probabilitys_weighted_vote():
    """min_token_prob is a probability, so its vote weights are the probabilities themselves; an empty response
    (score -inf) weighs 0 and leaves every other question's weights alone. Question p: 0.9 for answer 0 (right)
    against 0.3 + 0.3 for answer 1: answer 0 by the probabilities (0.9 > 0.6), answer 1 had one empty response
    elsewhere switched the weights to exp(s - max) (1 < 2 e^-0.6 = 1.098). Question q: 0.5 (right) against an empty
    response."""
    spec = [("p", [("correct", 0, [math.log(0.9)]), ("incorrect", 1, [math.log(0.3)]),
                   ("incorrect", 1, [math.log(0.3)])]),
            ("q", [("correct", 0, [math.log(0.5)]), ("incorrect", 1, [])])]
    rows = [{"prompt_id": pid, "sample_idx": j, "text": f"{pid}{j}", "answer": str(aid), "verdict": v,
             "mean_logprob": sum(lp) / len(lp) if lp else None, "n_tokens": len(lp), "answer_id": aid,
             "confidence": None, "finish_reason": "stop", "token_logprobs": lp, "token_entropy": [0.1] * len(lp),
             "token_kl_uniform": [1.0] * len(lp), "token_topk_conf": [1.0] * len(lp)}
            for pid, samples in spec for j, (v, aid, lp) in enumerate(samples)]
    t = compute_metrics(rows, n_boot=0)["curves"]["estimators"]
    assert t["min_token_prob"]["weighted_vote"] == 1.0
    without_empty = compute_metrics(rows[:4], n_boot=0)["curves"]["estimators"]
    assert without_empty["min_token_prob"]["weighted_vote"] == 1.0


@pytest.mark.parametrize("field,value,match", [
    ("sample_idx", "a", "'sample_idx' must be an integer >= 0, got 'a'"),
    ("sample_idx", -1, "'sample_idx' must be an integer >= 0, got -1"),
    ("sample_idx", 0.5, "'sample_idx' must be an integer >= 0, got 0.5"),
    ("rate", 2, "'rate' must be a number in [0, 1] or null, got 2"),
    ("rate", "x", "'rate' must be a number in [0, 1] or null, got 'x'"),
    ("confidence", True, "'confidence' must be a number in [0, 1] or null, got True"),
    ("group", 5, "'group' must be a string, got 5"),
    ("gold", [1], "field 'gold' must be a string or a number, got [1]"),
    ("prompt_id", ["q"], "field 'prompt_id' must be a string or a number, got ['q']"),
])
def test_bad_row_fields_are_refused_naming_them(tmp_path, capsys, field, value, match):
    row = {"prompt_id": "q", "text": "x", "gold": "1", "mean_logprob": -1, field: value}
    gen = tmp_path / "g.jsonl"
    gen.write_text(json.dumps(row) + "\n")
    assert main(["eval", "--generations", str(gen), "--out", str(tmp_path / "r"), "--verify-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{gen} line 1: {match}" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "metrics.json").exists()


def test_rate_and_group_of_a_generations_file_reach_the_metrics(tmp_path):
    """docs/generations-schema.md: rows with `rate` get the stochastic_* metrics, rows with `group` a per-group
    summary. Rescoring a file dropped both (no stochastic_* metric, an empty by_group)."""
    rows = [{"prompt_id": f"q{p}", "sample_idx": j, "text": f"<answer>{a}</answer>", "gold": "1", "mean_logprob": lp,
             "confidence": 0.7, "rate": rate, "group": grp}
            for p, (rate, grp) in enumerate(((0.9, "a"), (0.2, "b"), (0.6, "a")))
            for j, (a, lp) in enumerate(((1, -0.1), (0, -0.9), (1, -0.3), (1, -0.2)))]
    gen = tmp_path / "g.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r"
    assert main(["eval", "--generations", str(gen), "--out", str(out), "--verify-workers", "1", "--n-boot", "0"]) == 0
    got = json.loads((out / "metrics.json").read_text())
    assert got["metrics"].get("stochastic_ece") is not None
    assert sorted(got["curves"]["by_group"]) == ["a", "b"]
    written = [json.loads(ln) for ln in (out / "generations.jsonl").read_text().splitlines()]
    assert [(r["rate"], r["group"]) for r in written[::4]] == [(0.9, "a"), (0.2, "b"), (0.6, "a")]

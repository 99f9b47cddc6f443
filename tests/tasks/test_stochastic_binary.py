"""The stochastic task's binary variant ``stochastic_binary``: the strict ``D NN`` parser, the ``outcome`` grading
(correct = the prediction matches the fixed outcome, confidence = the stated P(correct)), the rewards on it, the
questions, the exact answer distribution, and the per-question measures of the predicted outcome's frequency
(``answer_*``) and of the stated probability of a = 1 (``stochastic_*``) against independent recomputations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from capo.core import REWARDS
from capo.evaluation.metrics import compute_metrics
from capo.rollout import grade
from capo.tasks import stochastic as st
from capo.verify import Verdict, extract_answer, extract_outcome


@pytest.mark.parametrize("text, want", [
    ("1 73", ("1", "73")), ("0 01", ("0", "01")), (" 1 99\n", ("1", "99")), ("x <answer>0 50</answer>", ("0", "50")),
    ("<answer>1 10</answer> then <answer>0 20</answer>", ("0", "20")),
])
def test_outcome_parses_a_digit_a_space_and_two_digits(text, want):
    assert extract_outcome(text) == want
    assert extract_answer(text, "outcome") == want[0]


@pytest.mark.parametrize("text", ["173", "1 7", "2 50", "1 00", "1  73", "1 100", "1 0.7", "1 73%", "10 73", "", None,
                                  "<answer>1 73", "1\t73", "the answer is 1 73"])
def test_outcome_refuses_anything_else(text):
    assert extract_outcome(text) is None
    assert extract_answer(text, "outcome") is None


class _NoVerifier:
    def verify_batch(self, *a, **k):  # the outcome format never calls the verifier
        raise AssertionError("verifier called")


def test_outcome_grading_hand_computed():
    g = grade(["1 73", "0 20", "2 50", "1 73", "<answer>0 99</answer>"], ["1", "1", "0", "0", "0"], _NoVerifier(),
              answer_format="outcome")
    assert g.answers == ["1", "0", None, "1", "0"]
    assert g.verdicts == [Verdict.CORRECT, Verdict.INCORRECT, Verdict.UNPARSABLE, Verdict.INCORRECT, Verdict.CORRECT]
    assert g.correct.tolist() == [True, False, False, False, True]
    assert g.format_ok.tolist() == [True, True, False, True, True]
    nan = float("nan")
    assert torch.allclose(g.confidence, torch.tensor([0.73, 0.20, nan, 0.73, 0.99]), equal_nan=True)
    assert g.outcome.tolist() == [True, True, False, False, False]
    # the stated probability of a = 1: NN for D = 1, 100 - NN for D = 0
    assert torch.allclose(g.stated, torch.tensor([0.73, 0.80, nan, 0.73, 0.01], dtype=torch.float64), equal_nan=True)
    assert torch.allclose(g.chosen, torch.tensor([1.0, 0.0, nan, 1.0, 0.0], dtype=torch.float64), equal_nan=True)
    with pytest.raises(ValueError, match="'outcome' grades against a fixed outcome.*got '7'"):
        grade(["1 73"], ["7"], _NoVerifier(), answer_format="outcome")


def test_percent_grading_carries_the_same_columns():
    g = grade(["37", "x"], ["1", "0"], _NoVerifier(), answer_format="percent")
    assert g.outcome.tolist() == [True, False] and g.chosen is None
    assert torch.allclose(g.stated, torch.tensor([0.37, float("nan")], dtype=torch.float64), equal_nan=True)


def test_rewards_on_the_outcome_format_hand_computed():
    """correctness pays the matching prediction; RLCR's reward is c - (q - c)^2 and -1 for an unparsed response."""
    g = grade(["1 73", "0 20", "2 50", "1 73"], ["1", "1", "0", "0"], _NoVerifier(), answer_format="outcome")
    corr = REWARDS.get("correctness")(g.correct, confidence=g.confidence, format_ok=g.format_ok)
    assert corr.tolist() == [1.0, 0.0, 0.0, 0.0]
    rlcr = REWARDS.get("rlcr")(g.correct, confidence=g.confidence, format_ok=g.format_ok)
    want = [1 - 0.27 ** 2, -(0.2 ** 2), -1.0, -(0.73 ** 2)]
    assert rlcr.tolist() == pytest.approx(want, abs=1e-6)


def test_binary_questions_are_the_stochastic_draws_asked_another_way():
    a = st.stochastic_problems("train", 40, seed=5)
    b = st.binary_problems("train", 40, seed=5)
    assert [p.answer for p in a] == [p.answer for p in b] and [p.meta for p in a] == [p.meta for p in b]
    assert all(q.prompt == "B" + p.prompt[1:] and q.prompt.startswith("B(") for p, q in zip(a, b))
    assert b[0].id == "stochastic_binary-train-5-0"


def test_summary_hand_computed():
    """Two questions: q0 (a = 0, p = 0.2) answered 1, 0, 0, 0 with stated P(a=1) 0.6, 0.3, 0.1, 0.2;
    q1 (a = 1, p = 0.9) answered 1, 1, invalid, 0 with 0.9, 0.7, -, 0.4."""
    nan = math.nan
    stated = torch.tensor([0.6, 0.3, 0.1, 0.2, 0.9, 0.7, nan, 0.4], dtype=torch.float64)
    chosen = torch.tensor([1, 0, 0, 0, 1, 1, nan, 0], dtype=torch.float64)
    outcome = torch.tensor([False] * 4 + [True] * 4)
    gid = torch.tensor([0] * 4 + [1] * 4)
    rate = torch.tensor([0.2] * 4 + [0.9] * 4, dtype=torch.float64)
    s = st.stochastic_summary(stated, outcome, gid, rate, chosen=chosen)
    # stated means 0.3 (a=0) and 2/3 (a=1); answer frequencies 0.25 (a=0) and 2/3 (a=1)
    assert s["stochastic_ece"] == pytest.approx((0.3 + 1 / 3) / 2)
    assert s["stochastic_rate_error"] == pytest.approx((0.1 + (0.9 - 2 / 3)) / 2)
    assert s["answer_questions"] == 2 and s["answer_ece"] == pytest.approx((0.25 + 1 / 3) / 2)
    assert s["answer_rate_error"] == pytest.approx((0.05 + (0.9 - 2 / 3)) / 2)
    assert s["answer_auroc"] == 1.0 and s["answer_mean_stated"] == pytest.approx((0.25 + 2 / 3) / 2)
    assert "answer_ece" not in st.stochastic_summary(stated, outcome, gid, rate)


def _binary_rows(responses: list[list[str]], outcome: list[int], rate: list[float]) -> list[dict]:
    """Generation rows as ``capo eval`` writes them for the outcome format (make_row's stochastic fields)."""
    from capo.evaluation.run import make_row

    rows = []
    for i, (texts, a, p) in enumerate(zip(responses, outcome, rate)):
        g = grade(texts, [str(a)] * len(texts), _NoVerifier(), answer_format="outcome")
        for j, t in enumerate(texts):
            r = make_row(prompt_id=f"q{i}", prompt_idx=i, sample_idx=j, prompt="B(A)=", gold=str(a), text=t,
                         graded=g, i=j, n_tokens=5, sum_logprob=-2.0, mean_logprob=-0.4, finish_reason="stop", rate=p)
            rows.append(json.loads(json.dumps(r)) | {"answer_id": 0})
    return rows


def test_eval_measures_equal_independent_recomputations():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(2)
    n_q, k = 200, 6
    rate = rng.uniform(0, 1, n_q)
    outcome = (rng.uniform(0, 1, n_q) < rate).astype(int)
    responses = [["junk" if rng.uniform() < 0.1 else f"{rng.integers(0, 2)} {rng.integers(1, 100):02d}"
                  for _ in range(k)] for _ in range(n_q)]
    rows = _binary_rows(responses, outcome.tolist(), rate.tolist())
    assert all(set(r) >= {"outcome", "stated", "chosen", "rate"} for r in rows)
    m = compute_metrics(rows, n_boot=0, n_bins=10)["metrics"]

    def ece(mean, a):
        out = 0.0
        for b in range(10):
            sel = (mean >= b / 10) & ((mean < (b + 1) / 10) if b < 9 else (mean <= 1))
            if sel.any():
                out += sel.mean() * abs(mean[sel].mean() - a[sel].mean())
        return out

    def parsed(t):
        return None if t == "junk" else (int(t[0]), int(t[2:]) / 100)

    keep = [i for i in range(n_q) if any(parsed(t) for t in responses[i])]
    valid = [[parsed(t) for t in responses[i] if parsed(t)] for i in range(n_q)]
    said = np.array([np.mean([q if dd == 1 else 1 - q for dd, q in valid[i]]) for i in keep])
    freq = np.array([np.mean([dd for dd, _ in valid[i]]) for i in keep])
    a = outcome[keep]
    assert m["answer_questions"] == len(keep) == m["stochastic_questions"]
    assert m["answer_ece"] == pytest.approx(ece(freq, a), abs=1e-12)
    assert m["answer_rate_error"] == pytest.approx(np.abs(freq - rate[keep]).mean(), abs=1e-12)
    assert m["answer_auroc"] == pytest.approx(roc_auc_score(a, freq), abs=1e-12)
    assert m["stochastic_ece"] == pytest.approx(ece(said, a), abs=1e-12)
    assert m["stochastic_auroc"] == pytest.approx(roc_auc_score(a, said), abs=1e-12)
    # the verbal confidence is the stated P(correct): its ECE is against the verdicts, over valid responses
    conf = np.array([parsed(t)[1] for i in range(n_q) for t in responses[i] if parsed(t)])
    right = np.array([parsed(t)[0] == outcome[i] for i in range(n_q) for t in responses[i] if parsed(t)])
    assert m["verbal_ece"] == pytest.approx(ece(conf, right.astype(float)), abs=1e-9)


def test_binary_distribution_equals_whole_sequence_logprobs():
    from transformers import Qwen2ForCausalLM

    from capo.tasks import model_builder as mb

    torch.manual_seed(0)
    tok = mb.build_tokenizer(model_max_length=32)
    model = Qwen2ForCausalLM(mb.model_config(tok, 32, 1, 2, 64, max_positions=32)).float().eval()
    dist = st.binary_distribution(model, tok, n_categories=2)
    assert dist.shape == (2, 2, 99) and dist.dtype == torch.float64
    for c in range(2):
        prompt = tok(f"B({'AB'[c]})=")["input_ids"]
        for dgt, v in ((0, 1), (1, 57), (1, 99)):
            seq = prompt + tok(f"{dgt} {v:02d}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].double(), -1)
            want = sum(lp[t - 1, seq[t]].item() for t in range(len(prompt), len(seq)))
            assert dist[c, dgt, v - 1].item() == pytest.approx(math.exp(want), rel=1e-9)
    assert bool((dist.flatten(1).sum(1) < 1).all())


def test_shipped_model_predicts_and_states_uniformly():
    """The shipped base model: about half its predictions are 1 in every category, every confidence about equally
    likely, almost every response valid."""
    from capo.tasks.default import load_default
    from capo.tasks.generated import generated_task

    spec = generated_task("stochastic_binary")
    assert spec.answer_format == "outcome" and spec.max_new_tokens == st.BINARY_MAX_NEW_TOKENS
    model, tok = load_default(model_dir=spec.model_dir)
    dist = st.binary_distribution(model, tok, 20).flatten(1)
    valid = dist.sum(1)
    assert float(valid.min()) > 0.95
    p1 = dist[:, 99:].sum(1) / valid
    assert float((p1 - 0.5).abs().max()) < 0.05
    assert float((0.5 * (dist / valid[:, None] - 1 / 198).abs().sum(1)).max()) < 0.1


def test_eval_and_training_config_use_the_outcome_format(tmp_path, capsys):
    """capo eval picks the outcome format for the task and writes the measures of both readings; the preset trains
    with it and refuses another format."""
    from capo.cli import main
    from capo.errors import ConfigError
    from capo.trainer.config import load_config

    out = tmp_path / "ev"
    assert main(["eval", "--model", "stochastic_binary", "--dataset", "stochastic_binary", "--limit", "8", "-k", "4",
                 "--out", str(out), "--no-progress", "--n-boot", "0", "--verify-workers", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["answer_format"] == "outcome"
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert {"answer_ece", "answer_rate_error", "stochastic_ece", "verbal_ece", "auc_mean"} <= set(metrics)
    curves = json.loads((out / "metrics.json").read_text())["curves"]
    assert "reliability_answer" in curves and "reliability_stated" in curves
    assert "frequency of the predicted outcome 1" in capsys.readouterr().out
    cfg = load_config("stochastic_binary")
    assert cfg.data.answer_format == "outcome" and cfg.rollout.max_new_tokens == 6
    with pytest.raises(ConfigError, match="graded with 'outcome'"):
        load_config("stochastic_binary", {"data.answer_format": "percent"})


def test_comparison_resamples_the_predicted_outcome_measures(tmp_path):
    """The comparison's bootstrap recomputes answer_* on the drawn questions: drawing every question once gives the
    metric capo eval wrote, and a paired difference is the difference of the full-data metrics."""
    from capo.evaluation import compare as cmpmod
    from capo.evaluation.report import RunInfo

    rng = np.random.default_rng(4)
    runs = []
    for name, p_one in (("base", 0.5), ("grpo-seed0", 0.9)):
        outcome = [int(x) for x in rng.integers(0, 2, 25)]
        responses = [[f"{int(rng.uniform() < p_one)} {rng.integers(1, 100):02d}" for _ in range(4)] for _ in outcome]
        rows = _binary_rows(responses, outcome, rng.uniform(0, 1, 25).tolist())
        d = tmp_path / name
        d.mkdir()
        (d / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(RunInfo(name, d, "eval", compute_metrics(rows, n_boot=0)["metrics"], {}, {}, []))
        seed = cmpmod._load_seed(d)
        got = cmpmod._measures_on(seed, sorted(seed.rows_of, key=lambda p: int(p[1:])))
        for key in ("answer_ece", "answer_rate_error", "stochastic_ece", "verbal_ece"):
            assert got[key] == pytest.approx(runs[-1].metrics[key], abs=1e-12), (name, key)
    cmp = cmpmod.compare(runs, n_boot=40, seed=0)
    v, lo, hi = cmp.diff("grpo", "base", "answer_ece")
    assert v == pytest.approx(runs[1].metrics["answer_ece"] - runs[0].metrics["answer_ece"])
    assert lo <= v <= hi and not math.isnan(lo)


def test_binary_build_is_deterministic_and_its_record_is_the_exact_distributions(tmp_path):
    from safetensors.torch import load_file

    from capo.tasks.default import load_default

    a = st.build_binary_model(tmp_path / "a", seed=2, steps=3, batch_size=8)
    st.build_binary_model(tmp_path / "b", seed=2, steps=3, batch_size=8)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["task"] == "capo:stochastic_binary" and a["uniform_loss"] == pytest.approx(math.log(198) / 5, abs=1e-4)
    model, tok = load_default(model_dir=tmp_path / "a")
    dist = st.binary_distribution(model, tok, 20).flatten(1)
    valid = dist.sum(1)
    p1 = dist[:, 99:].sum(1) / valid
    assert a["p_predict_1_range"] == pytest.approx([float(p1.min()), float(p1.max())], abs=1e-4)
    assert a["valid_mass_min"] == pytest.approx(float(valid.min()), abs=1e-4)
    with pytest.raises(ValueError, match="variant must be one of percent, outcome"):
        st.build_stochastic_model(tmp_path / "c", variant="binary")

"""The ``stochastic`` task on a language model: the strict two-digit parser, the log / Brier rewards, the ``percent``
grading, the questions, the exact stated distribution and ``capo eval``'s measures against independent
recomputations (hand-computed values, numpy loops, scikit-learn)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from capo.core import REWARDS
from capo.errors import ConfigError
from capo.evaluation.metrics import compute_metrics
from capo.rollout import grade
from capo.tasks import stochastic as st
from capo.verify import Verdict, extract_answer, extract_percent


@pytest.mark.parametrize("text, want", [
    ("37", "37"), (" 05\n", "05"), ("99", "99"), ("01", "01"), ("<answer>42</answer>", "42"),
    ("think... <answer> 08 </answer>", "08"), ("<answer>1</answer><answer>63</answer>", "63"),
])
def test_percent_parses_exactly_two_digits(text, want):
    assert extract_percent(text) == want
    assert extract_answer(text, "percent") == want


@pytest.mark.parametrize("text", [
    "00", "7", "100", "0.37", "37%", "37 percent", "3 7", "x37", "37x", "", None, "<answer>37", "<answer></answer>",
    "<answer>5</answer>37",  # a tag present: its content is the answer, not the rest
    "٣٧",  # Arabic-Indic digits are not ASCII digits
])
def test_percent_refuses_anything_else(text):
    assert extract_percent(text) is None
    assert extract_answer(text, "percent", fallback_last_number=True) is None  # strict: no fallback


def test_log_and_brier_rewards_hand_computed():
    a = torch.tensor([True, False, True, False, True, True])
    q = torch.tensor([0.8, 0.8, 0.01, 0.5, float("nan"), 0.3])
    ok = torch.tensor([True, True, True, True, True, False])
    log = REWARDS.get("log_score")(a, confidence=q, format_ok=ok)
    want = [math.log(0.8), math.log(0.2), math.log(0.01), math.log(0.5), math.log(0.01), math.log(0.01)]
    assert log.dtype == torch.float32
    assert torch.allclose(log, torch.tensor(want), atol=1e-6)
    brier = REWARDS.get("brier_score")(a, confidence=q, format_ok=ok)
    assert torch.allclose(brier, torch.tensor([-0.04, -0.64, -0.9801, -0.25, -0.9801, -0.9801]), atol=1e-6)
    # q = 0 or 1 is a valid Brier statement but an infinite log score: the log rule treats it as invalid
    edge = torch.tensor([0.0, 1.0])
    assert REWARDS.get("log_score")(torch.tensor([True, True]), confidence=edge).tolist() == pytest.approx(
        [math.log(0.01), math.log(0.01)])
    assert REWARDS.get("brier_score")(torch.tensor([True, True]), confidence=edge).tolist() == [-1.0, 0.0]
    got = REWARDS.get("log_score")(a[:1], confidence=q[:1], format_failure_reward=-9.0)
    assert got.tolist() == pytest.approx([math.log(0.8)])
    assert REWARDS.get("log_score")(a[4:5], confidence=q[4:5], format_failure_reward=-9.0).tolist() == [-9.0]
    with pytest.raises(ValueError, match="confidence"):
        REWARDS.get("log_score")(a)


def test_log_score_is_proper_on_the_two_digit_grid():
    """The expected reward of stating q when P(a = 1) = p peaks at q = p on the grid (what makes the task fair)."""
    q = torch.arange(1, 100, dtype=torch.float32) / 100
    for p in (0.13, 0.5, 0.77):
        for name in ("log_score", "brier_score"):
            fn = REWARDS.get(name)
            r = p * fn(torch.ones(99, dtype=torch.bool), confidence=q) + (1 - p) * fn(
                torch.zeros(99, dtype=torch.bool), confidence=q)
            assert q[int(r.argmax())].item() == pytest.approx(p)


class _NoVerifier:
    def verify_batch(self, *a, **k):  # the percent format never calls the verifier
        raise AssertionError("verifier called")


def test_percent_grading_uses_the_outcome_and_the_stated_probability():
    g = grade(["37", "37", "abc", "<answer>90</answer>"], ["1", "0", "1", "0"], _NoVerifier(),
              answer_format="percent")
    assert g.correct.tolist() == [True, False, True, False]  # the outcome, whatever the response says
    assert g.verdicts == [Verdict.CORRECT, Verdict.INCORRECT, Verdict.CORRECT, Verdict.INCORRECT]
    assert g.answers == ["37", "37", None, "90"]
    assert g.format_ok.tolist() == [True, True, False, True]
    assert torch.allclose(g.confidence, torch.tensor([0.37, 0.37, float("nan"), 0.9]), equal_nan=True)
    assert [p.confidence for p in g.parses] == [0.37, 0.37, None, 0.9]
    with pytest.raises(ValueError, match="must be '1' or '0'; got '42'"):
        grade(["37"], ["42"], _NoVerifier(), answer_format="percent")


def test_questions_are_seeded_prefix_stable_and_follow_the_rates():
    a = st.stochastic_problems("train", 30, seed=3)
    assert [(p.id, p.prompt, p.answer) for p in a] == [(p.id, p.prompt, p.answer)
                                                        for p in st.stochastic_problems("train", 60, seed=3)[:30]]
    rates = st.category_rates(20, 0)
    assert torch.allclose(rates, torch.from_numpy(np.random.default_rng(0).uniform(0, 1, size=(20,))))
    for p in a:
        c = p.meta["category"]
        assert p.prompt == f"P({'ABCDEFGHIJKLMNOPQRST'[c]})=" and p.meta["rate"] == rates[c].item()
        assert p.answer in ("0", "1")
    big = st.stochastic_problems("train", 20_000, seed=0, options={"n_categories": 2, "rate_seed": 5})
    r5 = st.category_rates(2, 5)
    for c in range(2):
        out = [int(p.answer) for p in big if p.meta["category"] == c]
        assert abs(np.mean(out) - r5[c].item()) < 0.02 and abs(len(out) / 20_000 - 0.5) < 0.02
    ev = st.stochastic_problems("eval", 2000, seed=0)
    tr = st.stochastic_problems("train", 2000, seed=0)
    same_cat = [(e, t) for e, t in zip(ev, tr) if e.meta["category"] == t.meta["category"]]
    assert 0 < sum(e.answer != t.answer for e, t in same_cat)  # the splits draw their own outcomes
    assert {p.meta["rate"] for p in ev} == {p.meta["rate"] for p in tr}  # ... from the same rates


@pytest.mark.parametrize("opts, msg", [
    ({"n_categories": 27}, r"n_categories must be an integer in \[1, 26\]"), ({"n_categories": 0}, "n_categories"),
    ({"n_categories": 2.0}, "n_categories"), ({"rate_seed": -1}, "rate_seed"), ({"p_one": 0.5}, "unknown key 'p_one'"),
])
def test_bad_options_are_named(opts, msg):
    with pytest.raises(ConfigError, match=msg):
        st.check_options(opts)


def _rows(stated: list[list[float | None]], outcome: list[int], rate: list[float]) -> list[dict]:
    rows = []
    for i, (qs, a, p) in enumerate(zip(stated, outcome, rate)):
        for j, q in enumerate(qs):
            rows.append({"prompt_id": f"q{i}", "sample_idx": j, "verdict": "correct" if a else "incorrect",
                         "mean_logprob": -0.5, "answer_id": 0, "text": "x", "answer": "x", "confidence": q,
                         "rate": p})
    return rows


def test_eval_measures_hand_computed():
    """Three questions: means 0.2 (a=0), 0.6 (a=1; the invalid response is left out), 0.95 (a=1)."""
    rows = _rows([[0.1, 0.3], [0.6, None], [0.9, 0.99, 0.96]], [0, 1, 1], [0.25, 0.5, 0.9])
    m = compute_metrics(rows, n_boot=0)["metrics"]
    assert m["stochastic_questions"] == 3
    # bins [0.2,0.3): |0.2-0| ; [0.6,0.7): |0.6-1| ; [0.9,1]: |0.95-1|, weights 1/3 each
    assert m["stochastic_ece"] == pytest.approx((0.2 + 0.4 + 0.05) / 3)
    assert m["stochastic_rate_error"] == pytest.approx((0.05 + 0.1 + 0.05) / 3)
    assert m["stochastic_auroc"] == pytest.approx(1.0)
    assert m["stochastic_mean_stated"] == pytest.approx((0.2 + 0.6 + 0.95) / 3)
    assert "stochastic_ece" not in compute_metrics([{k: v for k, v in r.items() if k != "rate"} for r in rows],
                                                   n_boot=0)["metrics"]
    none = compute_metrics(_rows([[None]], [1], [0.5]), n_boot=0)["metrics"]
    assert none["stochastic_questions"] == 0 and none["stochastic_ece"] is None


def test_eval_measures_equal_independent_recomputations():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    n_q, k = 300, 5
    rate = rng.uniform(0, 1, n_q)
    outcome = (rng.uniform(0, 1, n_q) < rate).astype(int)
    stated = [[None if rng.uniform() < 0.1 else round(float(rng.integers(1, 100)) / 100, 2) for _ in range(k)]
              for _ in range(n_q)]
    m = compute_metrics(_rows(stated, outcome.tolist(), rate.tolist()), n_boot=0, n_bins=10)["metrics"]
    keep = [i for i in range(n_q) if any(q is not None for q in stated[i])]
    mean = np.array([np.mean([q for q in stated[i] if q is not None]) for i in keep])
    a = outcome[keep]
    ece = 0.0
    for b in range(10):  # equal-width bins, the last one closed: [b/10, (b+1)/10)
        sel = (mean >= b / 10) & ((mean < (b + 1) / 10) if b < 9 else (mean <= 1))
        if sel.any():
            ece += sel.mean() * abs(mean[sel].mean() - a[sel].mean())
    assert m["stochastic_questions"] == len(keep)
    assert m["stochastic_ece"] == pytest.approx(ece, abs=1e-12)
    assert m["stochastic_rate_error"] == pytest.approx(np.abs(mean - rate[keep]).mean(), abs=1e-12)
    assert m["stochastic_auroc"] == pytest.approx(roc_auc_score(a, mean), abs=1e-12)


def _tiny(seed: int = 0):
    from transformers import Qwen2ForCausalLM

    from capo.tasks import model_builder as mb

    torch.manual_seed(seed)
    tok = mb.build_tokenizer(model_max_length=32)
    model = Qwen2ForCausalLM(mb.model_config(tok, 32, 1, 2, 64, max_positions=32)).float().eval()
    return model, tok


def test_stated_distribution_equals_the_chain_rule_on_whole_sequences():
    model, tok = _tiny()
    dist = st.stated_distribution(model, tok, n_categories=3)
    assert dist.shape == (3, 99) and dist.dtype == torch.float64
    for c in range(3):
        prompt = tok(f"P({'ABC'[c]})=")["input_ids"]
        for v in (1, 9, 10, 57, 99):
            seq = prompt + tok(f"{v:02d}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].double(), -1)
            want = sum(lp[t - 1, seq[t]].item() for t in range(len(prompt), len(seq)))
            assert dist[c, v - 1].item() == pytest.approx(math.exp(want), rel=1e-9)
    assert bool((dist.sum(1) < 1).all())


def test_eval_on_the_stochastic_task_end_to_end(tmp_path, capsys):
    """capo eval picks the task's answer format by itself, writes each question's rate and the measures."""
    from capo.cli import main
    from capo.tasks.model_builder import save_model

    model, tok = _tiny()
    save_model(model, tok, tmp_path / "m")
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(tmp_path / "m"), "--dataset", "stochastic", "--limit", "6", "-k", "3",
                 "--out", str(out), "--no-progress", "--n-boot", "0", "--verify-workers", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["answer_format"] == "percent"
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    rows = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    probs = {p.id: p for p in st.stochastic_problems("eval", 6, seed=0)}
    assert len(rows) == 18 and all(r["rate"] == probs[r["prompt_id"]].meta["rate"] for r in rows)
    assert all((r["verdict"] == "correct") == (probs[r["prompt_id"]].answer == "1") for r in rows)
    assert "stochastic_ece" in metrics and "stochastic_rate_error" in metrics
    assert main(["eval", "--model", str(tmp_path / "m"), "--dataset", "stochastic", "--answer-format", "rlcr",
                 "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "graded with 'percent'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_training_config_requires_the_percent_format():
    from capo.trainer.config import load_config

    cfg = load_config("stochastic")
    assert cfg.data.answer_format == "percent" and cfg.algo.reward == "log_score"
    with pytest.raises(ConfigError, match="graded with 'percent'"):
        load_config("stochastic", {"data.answer_format": "rlcr"})


def test_core_summary_with_gapped_question_ids_and_input_errors():
    """The trainer's ids have gaps (question i of rank r is i * world + r): a missing id is no question."""

    q = torch.tensor([0.2, 0.4, 0.9, float("nan")], dtype=torch.float64)
    got = st.stated_probability_summary(q, torch.tensor([False, False, True, True]), torch.tensor([0, 0, 4, 4]),
                                     torch.tensor([0.3, 0.3, 0.8, 0.8]))
    assert got["stochastic_questions"] == 2
    assert got["stochastic_ece"] == pytest.approx((0.3 + 0.1) / 2)
    assert got["stochastic_rate_error"] == pytest.approx((0.0 + 0.1) / 2)
    assert got["stochastic_auroc"] == 1.0 and got["stochastic_mean_stated"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="stated"):
        st.stated_probability_summary(torch.tensor([1.5]), torch.tensor([True]), torch.tensor([0]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="rate"):
        st.stated_probability_summary(q, torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.long),
                                   torch.ones(3))


def test_demo_compares_grpo_and_dr_grpo_on_stated_probabilities(tmp_path, capsys):
    """`capo demo --task stochastic`: GRPO vs Dr. GRPO, the per-question stated-probability measures in the summary
    and the terminal, their reliability diagram in the report, a conclusion about them (not about AUC-mean)."""
    from capo.cli import main

    out = tmp_path / "demo"
    tiny = ["data.n_train=8", "rollout.prompts_per_step=8", "rollout.group_size=2", "data.n_eval=4",
            "run.eval_samples=2", "run.threads=1", "run.progress=false", "run.eval_every=0"]
    assert main(["demo", "--task", "stochastic", "--out", str(out), "--steps", "1", "--eval-problems", "12",
                 "--eval-k", "3", *[x for kv in tiny for x in ("--set", kv)]]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["per_run"]) == {"base", "grpo-seed0", "dr_grpo-seed0"}
    assert set(summary["per_run"]["base"]) == {"stochastic_ece", "stochastic_rate_error", "stochastic_auroc",
                                               "stochastic_mean_stated"}
    base = json.loads((out / "eval" / "base" / "metrics.json").read_text())
    assert summary["per_run"]["base"]["stochastic_ece"] == base["metrics"]["stochastic_ece"]
    assert "reliability_stated" in base["curves"] and (out / "eval" / "base" / "plots" / "reliability_stated.png").is_file()
    printed = capsys.readouterr().out
    assert "2 algorithms (grpo, dr_grpo)" in printed
    conclusion = printed.split("conclusion")[1]
    assert "ECE of the per-question stated probability" in conclusion and "AUC-mean" not in conclusion
    report = (out / "report.html").read_text()
    assert "reliability diagrams stated probability" in report and "ECE of the per-question stated probability" in report


def test_comparison_resamples_the_stated_measures(tmp_path):
    """The comparison's bootstrap recomputes the per-question measures on the drawn questions: its draws for a
    model equal the core summary on those questions, and a model's value is the full-data metric."""
    from capo.evaluation.compare import compare
    from capo.evaluation.report import RunInfo

    rng = np.random.default_rng(1)
    runs = []
    for name, shift in (("base", 0.0), ("grpo-seed0", 0.3)):
        stated = [[min(0.99, round(float(rng.integers(1, 60)) / 100 + shift, 2)) for _ in range(4)] for _ in range(30)]
        rows = _rows(stated, [int(x) for x in rng.integers(0, 2, 30)], rng.uniform(0, 1, 30).tolist())
        d = tmp_path / name
        d.mkdir()
        (d / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        m = compute_metrics(rows, n_boot=0)["metrics"]
        runs.append(RunInfo(name, d, "eval", m, {}, {}, []))
    cmp = compare(runs, n_boot=50, seed=0)
    v, lo, hi = cmp.diff("grpo", "base", "stochastic_ece")
    assert v == pytest.approx(runs[1].metrics["stochastic_ece"] - runs[0].metrics["stochastic_ece"])
    assert lo < v < hi and not math.isnan(lo)
    draws = cmp.draws["base"]["stochastic_ece"]
    assert draws.shape == (50,) and bool(torch.isfinite(draws).all()) and float(draws.std()) > 0


def test_build_is_deterministic_and_close_to_uniform(tmp_path):
    """Two short builds with one seed are bit-identical; the record's distance from uniform is the exact
    distribution's (recomputed here)."""
    from safetensors.torch import load_file

    from capo.tasks.default import load_default

    a = st.build_stochastic_model(tmp_path / "a", seed=3, steps=3, batch_size=8)
    st.build_stochastic_model(tmp_path / "b", seed=3, steps=3, batch_size=8)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    model, tok = load_default(model_dir=tmp_path / "a")
    dist = st.stated_distribution(model, tok, 20)
    tv = 0.5 * (dist - 1 / 99).abs().sum(1) + 0.5 * (1 - dist.sum(1))
    assert a["tv_from_uniform_max"] == pytest.approx(float(tv.max()), abs=1e-4)
    assert a["valid_mass_min"] == pytest.approx(float(dist.sum(1).min()), abs=1e-4)


def test_shipped_model_states_every_value_about_equally():
    """The shipped base model starts where the paper's policies start: near-uniform answers for every category."""
    from capo.tasks.default import load_default
    from capo.tasks.generated import generated_task

    model, tok = load_default(model_dir=generated_task("stochastic").model_dir)
    dist = st.stated_distribution(model, tok, 20)
    assert float(dist.sum(1).min()) > 0.95  # almost every response is a valid two-digit answer
    assert float((0.5 * (dist / dist.sum(1, keepdim=True) - 1 / 99).abs().sum(1)).max()) < 0.1

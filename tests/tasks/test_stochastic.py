"""Stochastic outcomes (arXiv 2508.11800's synthetic setting) and the table model trained with capo's advantages:
hand-computed scores and measures, the sampler against its softmax, and the data draw's order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from capo.tasks.stochastic import score, stochastic_data
from capo.trainer.table_model import TableSettings, answer_values, evaluate, sample_answers, train_table


def test_log_and_brier_scores_hand_computed():
    q = torch.tensor([0.8, 0.8, 0.01, 0.5], dtype=torch.float64)
    a = torch.tensor([1, 0, 1, 0])
    assert torch.allclose(score(q, a, "log"), torch.tensor([math.log(0.8), math.log(0.2), math.log(0.01),
                                                            math.log(0.5)], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(score(q, a, "brier"), torch.tensor([-0.04, -0.64, -0.9801, -0.25], dtype=torch.float64),
                          atol=1e-12)
    with pytest.raises(ValueError, match="rule"):
        score(q, a, "spherical")


def test_data_draw_follows_the_papers_order():
    d = stochastic_data(n_questions=50, n_categories=4, seed=2)
    rng = np.random.default_rng(2)  # the notebook's order: categories, then rates, then outcomes
    cat = rng.choice(4, size=(50,))
    rate = rng.uniform(0, 1, size=(4,))
    assert d.category.tolist() == cat.tolist() and np.allclose(d.rate.numpy(), rate)
    assert d.outcome.tolist() == rng.binomial(n=1, p=rate[cat]).tolist()
    assert torch.equal(d.question_rate, d.rate[d.category])
    big = stochastic_data(n_questions=40_000, n_categories=2, seed=0)  # outcomes follow their category's rate
    for c in range(2):
        freq = big.outcome[big.category == c].double().mean().item()
        assert abs(freq - big.rate[c].item()) < 0.02
    with pytest.raises(ValueError, match="n_questions"):
        stochastic_data(n_questions=0)


def test_sampler_draws_from_each_categorys_softmax():
    logits = torch.zeros(2, 99, dtype=torch.float64)
    logits[0, 5] = 50.0  # category 0 states answer 5 (0.06) with probability ~1
    logits[1, :3] = torch.log(torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)) + 40.0  # 1:2:1 over answers 0-2
    cat = torch.tensor([0, 1] * 2000)
    draws = sample_answers(logits, cat, 10, torch.Generator().manual_seed(0))  # [4000, 10]
    assert draws.shape == (4000, 10)
    assert (draws[cat == 0] == 5).all()
    freq = torch.bincount(draws[cat == 1].reshape(-1), minlength=99)[:3].double() / 20_000
    assert torch.allclose(freq, torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64), atol=0.015)
    assert answer_values(99)[[0, 5, 98]].tolist() == pytest.approx([0.01, 0.06, 0.99])


def test_final_measures_hand_computed():
    from capo.tasks.stochastic import StochasticData

    data = StochasticData(category=torch.tensor([0, 0, 1, 1]), rate=torch.tensor([0.7, 0.2], dtype=torch.float64),
                          outcome=torch.tensor([1, 0, 0, 0]))
    logits = torch.full((2, 99), -100.0, dtype=torch.float64)
    logits[0, 98], logits[1, 0] = 0.0, 0.0  # category 0 always states 0.99, category 1 always 0.01
    m = evaluate(logits, data, TableSettings(n_answers=99, eval_samples=7), torch.Generator().manual_seed(0))
    # bins: 0.99 holds 2 questions with 1 outcome (|0.5 - 0.99| * 2/4); 0.01 holds 2 with none (|0 - 0.01| * 2/4)
    assert m["ece"] == pytest.approx(0.245 + 0.005, abs=1e-12)
    assert m["auroc"] == pytest.approx((0.5 + 1 + 1) / 3, abs=1e-12)  # the positive ties one negative
    assert m["accuracy"] == pytest.approx(0.75) and m["mean_stated"] == pytest.approx(0.5)
    assert m["abs_err_rate"] == pytest.approx((0.29 * 2 + 0.19 * 2) / 4, abs=1e-12)


def test_table_training_is_seeded_and_moves_toward_the_rate():
    s = TableSettings(method="dr_grpo", n_questions=300, n_categories=1, steps=150, lr=0.05, eval_samples=20,
                      log_every=50, seed=3)
    a, b = train_table(s), train_table(s)
    assert a["final"] == b["final"] and a["stated_by_category"] == b["stated_by_category"]
    rate = a["rate"][0]
    start = a["curves"][0]["mean_stated"]
    assert start == pytest.approx(0.5, abs=0.02)  # uniform answers at the start (5 standard errors of 6000 draws)
    assert abs(a["stated_by_category"][0] - rate) < abs(0.5 - rate) / 2  # halfway to the rate at least
    c = train_table(TableSettings(**{**s.__dict__, "seed": 4}))
    assert c["rate"] != a["rate"]  # the seed draws the data too


def test_step_questions_all_or_a_uniform_batch():
    from capo.trainer.table_model import _step_questions

    data = stochastic_data(n_questions=50, n_categories=3, seed=0)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(_step_questions(data, TableSettings(), gen), torch.arange(50))  # the paper: every question
    q = _step_questions(data, TableSettings(batch_questions=16), gen)
    assert q.numel() == 16 and q.unique().numel() == 16 and int(q.max()) < 50
    seen = torch.cat([_step_questions(data, TableSettings(batch_questions=16), gen) for _ in range(200)])
    assert torch.bincount(seen, minlength=50).min() > 20  # every question drawn (expected 64 times each)


def test_eps_reaches_every_estimator_that_takes_one(tmp_path, monkeypatch):
    """`--eps` is the std epsilon of every estimator with one (it reached GRPO only, by name: NGRPO or ACE ran at
    their own 1e-6); an estimator without one (Dr. GRPO) gets none."""
    from capo.trainer import table_model

    seen = {}

    def fake(s):
        seen[s.method] = dict(s.estimator_kwargs)
        return {"final": {"ece": 0.0, "auroc": 0.5, "abs_err_rate": 0.0}, "wall_s": 0.0}

    monkeypatch.setattr(table_model, "train_table", fake)
    table_model.main(["--methods", "grpo", "ngrpo", "dr_grpo", "--seeds", "0", "--eps", "0.001", "--out",
                      str(tmp_path)])
    assert seen == {"grpo": {"eps": 0.001}, "ngrpo": {"eps": 0.001}, "dr_grpo": {}}

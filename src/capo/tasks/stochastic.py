"""Stochastic outcomes: questions whose answer is a coin flip with a rate set by the question's category.

The setting of Bereket & Leskovec, "Uncalibrated Reasoning: GRPO Induces Overconfidence for Stochastic Outcomes"
(arXiv 2508.11800, Sec. 3, the synthetic experiment): ``n_questions`` questions, each in one of ``n_categories``
categories drawn uniformly; each category has a true rate p_c ~ U(0, 1); each question's outcome a ~ Bernoulli(p_c)
is drawn once and fixed. A policy states a probability for a = 1 and is rewarded by a proper scoring rule of the
fixed outcome (:func:`score`). The best a policy can state for a question is its category's rate, which it can only
learn from the other questions of the category: the setting where GRPO's per-group std normalisation makes the
stated probabilities overconfident while Dr. GRPO / RLOO stay calibrated (the paper's Table 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from capo.core import checks

SCORING_RULES = ("log", "brier")


@dataclass(frozen=True)
class StochasticData:
    """One draw of the setting. ``category``: [Q] int64 category of each question; ``rate``: [C] float64 true rate
    p_c of each category; ``outcome``: [Q] int64 fixed outcome a of each question (0/1)."""

    category: torch.Tensor
    rate: torch.Tensor
    outcome: torch.Tensor

    @property
    def question_rate(self) -> torch.Tensor:
        """[Q] p_c of each question's category."""
        return self.rate[self.category]


def stochastic_data(n_questions: int = 10_000, n_categories: int = 20, seed: int = 0) -> StochasticData:
    """Draw categories, rates and outcomes with numpy's ``default_rng(seed)`` in the paper's order (category of
    each question, then the rates, then the outcomes; the paper's notebook uses seed 2)."""
    if n_questions < 1 or n_categories < 1:
        raise ValueError(f"n_questions and n_categories must be >= 1, got {n_questions} and {n_categories}")
    rng = np.random.default_rng(seed)
    category = rng.choice(n_categories, size=(n_questions,))
    rate = rng.uniform(0, 1, size=(n_categories,))
    outcome = rng.binomial(n=1, p=rate[category])
    return StochasticData(torch.from_numpy(category).long(), torch.from_numpy(rate), torch.from_numpy(outcome).long())


def score(stated: torch.Tensor, outcome: torch.Tensor, rule: str = "log") -> torch.Tensor:
    """Reward of stating probability q for an outcome a in {0, 1} (a proper scoring rule, maximised in expectation
    by the true rate): "log" a log q + (1 - a) log(1 - q) (the paper's); "brier" -(q - a)^2. Shapes broadcast."""
    checks.choice("rule", rule, SCORING_RULES)
    a = outcome.to(stated.dtype)
    if rule == "log":
        return a * torch.log(stated) + (1 - a) * torch.log1p(-stated)
    return -(stated - a) ** 2

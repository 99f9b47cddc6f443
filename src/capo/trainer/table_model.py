"""The stochastic-outcome table model: a language model reduced to one softmax per category, trained with capo's
advantage estimators. No LM, no tokens: it checks that capo's advantages reproduce a published calibration effect.

Bereket & Leskovec (arXiv 2508.11800, Sec. 3 and their ``synthetic/prediction.ipynb``): the policy states a
probability for each question by sampling one of 99 answers 0.01, ..., 0.99 from logits that depend only on the
question's category (one [C, 99] parameter table, initialised to zero: uniform answers). Every step samples G answers
for every question (all questions, every step), scores them against the question's fixed outcome
(:func:`capo.tasks.stochastic.score`), computes the advantage over each question's group with a registered estimator
(``capo.core.ADVANTAGES``: grpo, dr_grpo, rloo, ...), and takes one AdamW step on
-mean_{i}(A_i * log pi(answer_i)) -- the gradient of the paper's surrogate with one update per rollout (ratio 1).
The paper: GRPO (std) ends at ECE 0.239; GRPO without std, RLOO, PPO and REINFORCE at 0.002-0.005.

Measured at the end, as the paper does: each question's mean stated probability over ``eval_samples`` samples,
against its outcome: 10-bin ECE, AUROC, accuracy of (mean > 0.5); and mean |mean - p_c|.

    python -m capo.trainer.table_model --methods grpo dr_grpo rloo --seeds 0 1 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from capo.core import compute_advantages
from capo.core.step import hyperparameters
from capo.core.calibration import auroc, ece
from capo.core.rewards import SCORING_RULES
from capo.tasks.stochastic import StochasticData, score, stochastic_data


@dataclass(frozen=True)
class TableSettings:
    """One run. Defaults are the paper's online setting (its notebook's ``total_steps``, ``lr``, ``n_rollouts``)."""

    method: str = "grpo"  # advantage estimator (capo.core.ADVANTAGES)
    estimator_kwargs: dict = field(default_factory=dict)  # e.g. {"eps": 1e-5} (the notebook's GRPO eps)
    seed: int = 0  # training seed: the sampling RNG and, with data_seed None, the data draw
    data_seed: int | None = None  # None: the training seed (each seed an independent replicate)
    n_questions: int = 10_000
    batch_questions: int | None = None  # questions per step, drawn uniformly without replacement; None: all (paper)
    n_categories: int = 20
    group_size: int = 10  # G answers per question per step
    steps: int = 50_000
    lr: float = 3e-3  # AdamW, torch defaults otherwise
    n_answers: int = 99  # stated probabilities linspace(0.01, 0.99, n_answers)
    rule: str = "log"  # scoring rule (capo.tasks.stochastic.SCORING_RULES)
    eval_samples: int = 100  # samples per question for the final mean stated probability
    log_every: int = 1000  # steps between curve points


def answer_values(n_answers: int) -> torch.Tensor:
    """[K] the stated probability of each answer."""
    return torch.linspace(0.01, 0.99, n_answers, dtype=torch.float64)


def sample_answers(logits: torch.Tensor, category: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """[Q, n] answer indices, n per question from its category's softmax (inverse CDF of one uniform draw each).
    logits: [C, K]; category: [Q]."""
    cdf = torch.cumsum(torch.softmax(logits.detach().double(), dim=-1), dim=-1)  # [C, K]
    u = torch.rand(category.numel(), n, generator=gen, dtype=torch.float64)  # [Q, n]
    return torch.searchsorted(cdf[category], u).clamp_(max=logits.size(1) - 1)  # [Q, n]


def evaluate(logits: torch.Tensor, data: StochasticData, s: TableSettings, gen: torch.Generator) -> dict:
    """The paper's final measures of each question's mean stated probability (``eval_samples`` samples)."""
    values = answer_values(s.n_answers)
    mean = values[sample_answers(logits, data.category, s.eval_samples, gen)].mean(1)  # [Q]
    outcome = data.outcome.bool()
    return {"ece": ece(mean, outcome, n_bins=10), "auroc": auroc(mean, outcome),
            "accuracy": float(((mean > 0.5) == outcome).double().mean()),
            "abs_err_rate": float((mean - data.question_rate).abs().mean()),
            "mean_stated": float(mean.mean())}


def _step_questions(data: StochasticData, s: TableSettings, gen: torch.Generator) -> torch.Tensor:
    """The questions of one step: all of them (the paper), or ``batch_questions`` drawn without replacement."""
    n = data.category.numel()
    if s.batch_questions is None or s.batch_questions >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=gen)[:s.batch_questions]


def train_table(s: TableSettings) -> dict:
    """Train one table model; returns the settings, the final measures and the curves."""
    data = stochastic_data(s.n_questions, s.n_categories, s.seed if s.data_seed is None else s.data_seed)
    gen = torch.Generator().manual_seed(s.seed)
    torch.manual_seed(s.seed)
    logits = torch.zeros(s.n_categories, s.n_answers, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([logits], lr=s.lr)
    values, g = answer_values(s.n_answers), s.group_size
    curves, t0 = [], time.perf_counter()
    for step in range(s.steps):
        if step % s.log_every == 0:
            curves.append({"step": step, **evaluate(logits, data, s, gen)})
        q = _step_questions(data, s, gen)  # [B] question indices of this step
        answers = sample_answers(logits, data.category[q], g, gen).reshape(-1)  # [N], N = B * G, grouped by question
        rewards = score(values[answers], data.outcome[q].repeat_interleave(g), s.rule)  # [N]
        adv = compute_advantages(s.method, rewards, g, **s.estimator_kwargs)  # [N]
        logp = torch.log_softmax(logits, -1)[data.category[q].repeat_interleave(g), answers]  # [N]
        loss = -(adv * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = evaluate(logits, data, s, gen)
    curves.append({"step": s.steps, **final})
    return {"settings": asdict(s), "final": final, "curves": curves, "wall_s": round(time.perf_counter() - t0, 1),
            "rate": data.rate.tolist(),
            "stated_by_category": (torch.softmax(logits.detach(), -1) @ values).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=["grpo", "dr_grpo", "rloo"], help="advantage estimators")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds (each also draws its data)")
    ap.add_argument("--steps", type=int, default=TableSettings.steps, help="optimizer steps per run")
    ap.add_argument("--rule", choices=SCORING_RULES, default="log", help="scoring rule of the reward")
    ap.add_argument("--group-size", type=int, default=TableSettings.group_size, help="answers per question per step")
    ap.add_argument("--questions", type=int, default=TableSettings.n_questions, help="questions (all used every step)")
    ap.add_argument("--batch-questions", type=int, default=None,
                    help="questions per step, drawn uniformly (default: all, as the paper)")
    ap.add_argument("--curve-points", type=int, default=50, help="evaluations along the run (the curves)")
    ap.add_argument("--eps", type=float, default=1e-5, help="the std epsilon of every estimator that takes one (GRPO, "
                    "NGRPO, ACE, ...; the notebook's 1e-5 for GRPO)")
    ap.add_argument("--out", type=Path, required=True, help="folder for one JSON record per (method, seed)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:
        for m in a.methods:
            path = a.out / f"{m}-seed{seed}.json"
            if path.exists():
                continue
            kw = {"eps": a.eps} if "eps" in hyperparameters(m) else {}
            rec = train_table(TableSettings(method=m, estimator_kwargs=kw, seed=seed, steps=a.steps, rule=a.rule,
                                            group_size=a.group_size, n_questions=a.questions,
                                            batch_questions=a.batch_questions,
                                            log_every=max(1, a.steps // a.curve_points)))
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(rec, indent=1))
            tmp.replace(path)
            f = rec["final"]
            print(f"{m:8} seed {seed}: ECE {f['ece']:.3f} AUROC {f['auroc']:.3f} |q-p_c| {f['abs_err_rate']:.3f} "
                  f"({rec['wall_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

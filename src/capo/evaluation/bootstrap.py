"""The cluster bootstrap over questions of ``capo eval``'s intervals, computed from per-question sums.

The same resampling and interval as :func:`capo.core.calibration.bootstrap_ci` (replicate b draws G question
indices with :func:`capo.core.calibration.bootstrap_draws` from the same seed, the interval is
:func:`capo.core.calibration.percentile_interval` of the replicate values), without re-running the metric on each
replicate's rows. A replicate only decides how many copies ``w[b, q]`` of each question it holds, so

- accuracy_b = sum_q w[b, q] n1_q / sum_q w[b, q] n_q;
- AUC-mean_b = ``sum_q w[b, q] AUC_q / sum_q w[b, q] [q mixed]`` (a question drawn twice counts twice; its AUC is the
  same in each copy): one matrix-vector product;
- pooled AUROC_b = U_b / (W1_b W0_b), U_b = sum over (correct i, incorrect j) of w_i w_j ([s_i > s_j] + [s_i = s_j]/2),
  the Mann-Whitney U of the rows weighted by their question's copies: one sort of the scores, then per replicate
  a cumulative sum over the tie blocks.

Equal to the replicate-by-replicate computation up to float rounding (``tests/evaluation/test_fast_bootstrap.py``);
``benchmarks/eval_generations.py`` measures the difference in speed (docs/performance.md, "`capo eval --generations`
at scale").
"""

from __future__ import annotations

import math

import torch

from capo.core import calibration as cal

__all__ = ["QuestionBootstrap"]

F64 = torch.float64
CHUNK_CELLS = 100_000  # replicate x row cells per step of the AUROC (800 kB of float64: stays in cache)


class QuestionBootstrap:
    """The replicates of a cluster bootstrap over the questions of ``group_ids`` [N] (``n_boot`` >= 1 draws from
    ``seed``): each replicate's copies of each question, ``weights`` [n_boot, G] (questions in sorted label order, as
    :func:`capo.core.calibration.group_index` numbers them)."""

    def __init__(self, group_ids: torch.Tensor, n_boot: int, seed: int, alpha: float = 0.05):
        labels, self.inv = cal.group_index(group_ids.cpu())
        self.n_groups, self.alpha = labels.numel(), alpha
        draws = cal.bootstrap_draws(self.n_groups, n_boot, seed)  # [n_boot, G]
        self.weights = torch.zeros(n_boot, self.n_groups, dtype=F64).scatter_add_(
            1, draws, torch.ones(draws.shape, dtype=F64))

    def _per_group(self, x: torch.Tensor) -> torch.Tensor:
        """[G] sum of the row values x [N] of each question."""
        return torch.zeros(self.n_groups, dtype=F64).index_add_(0, self.inv, x.to(F64))

    def _interval(self, values: torch.Tensor) -> tuple[float, float]:
        return cal.percentile_interval(values, self.alpha)

    def mean_ci(self, x: torch.Tensor) -> tuple[float, float]:
        """Interval of the mean of the row values x [N] (e.g. correctness: accuracy)."""
        n = self._per_group(torch.ones_like(x, dtype=F64))
        return self._interval((self.weights @ self._per_group(x)) / (self.weights @ n))

    def auc_mean_ci(self, scores: torch.Tensor, correct: torch.Tensor) -> tuple[float, float]:
        """Interval of :func:`capo.core.calibration.auc_mean` of scores [N] against correct [N] (bool)."""
        per_group = cal.auc_mean(scores, correct, self.inv).per_group  # [G], NaN: not mixed
        used = ~torch.isnan(per_group)
        num = self.weights @ torch.where(used, per_group, torch.zeros_like(per_group))
        return self._interval(num / (self.weights @ used.to(F64)))  # 0 / 0 = NaN: dropped

    def auroc_ci(self, scores: torch.Tensor, correct: torch.Tensor) -> tuple[float, float]:
        """Interval of :func:`capo.core.calibration.auroc` (pooled) of scores [N] (+-inf allowed) against correct
        [N]."""
        s = scores.to(F64).cpu()
        order = torch.argsort(s, stable=True)
        s, c, g = s[order], correct.cpu()[order].bool(), self.inv[order]  # [N] each, ascending score
        new_block = torch.ones(s.numel(), dtype=torch.bool)
        new_block[1:] = s[1:] != s[:-1]  # `!=`, not diff: -inf == -inf is a tie
        block = torch.cumsum(new_block.to(torch.int64), 0) - 1  # [N] tie-block id
        n_blocks = int(block[-1]) + 1
        (bp, gp), (bn, gn) = (block[c], g[c]), (block[~c], g[~c])  # tie block and question of each (in)correct row
        values = []
        for w in self.weights.split(max(1, CHUNK_CELLS // max(s.numel(), 1))):  # [b, G] copies of each question
            pos = torch.zeros(w.shape[0], n_blocks, dtype=F64).index_add_(1, bp, w[:, gp])  # [b, K] correct weight
            neg = torch.zeros(w.shape[0], n_blocks, dtype=F64).index_add_(1, bn, w[:, gn])  # [b, K] incorrect weight
            below = torch.cumsum(neg, 1) - neg  # [b, K] incorrect weight strictly below each block
            u = (pos * (below + 0.5 * neg)).sum(1)  # [b]
            w1, w0 = pos.sum(1), neg.sum(1)
            values.append(torch.where((w1 > 0) & (w0 > 0), u / (w1 * w0), torch.full_like(u, math.nan)))
        return self._interval(torch.cat(values))

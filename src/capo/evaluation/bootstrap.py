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
  a cumulative sum of the incorrect rows' weights, read at each correct row's tie block (U_b = sum over correct i
  of w_i (B_i + T_i) / 2, B_i the incorrect weight strictly below s_i, T_i the incorrect weight at or below it).
  Every sum in U_b, W1_b, W0_b is of integers or halves below 2^53, so exact in float64 in any order.

Equal to the replicate-by-replicate computation up to float rounding (``tests/evaluation/test_fast_bootstrap.py``);
``benchmarks/eval_generations.py`` measures the difference in speed (docs/performance.md, "`capo eval --generations`
at scale").
"""

from __future__ import annotations

import math

import numpy as np
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
        s, c = scores.to(F64).cpu(), correct.cpu().bool()
        n1, n0 = self.weights @ self._per_group(c), self.weights @ self._per_group(~c)  # [n_boot] each: W1_b, W0_b
        order = torch.argsort(s, stable=True)
        s, c, g = s[order], c[order], self.inv[order]  # [N] each, ascending score
        below, through = _incorrect_before_ties(s, c)  # [N1] each, indices into the incorrect rows' prefix sums
        ties = not torch.equal(below, through)
        g1, g0, below, through = g[c].numpy(), g[~c].numpy(), below.numpy(), through.numpy()  # [N1], [N0], [N1], [N1]
        u = torch.empty(n1.shape, dtype=F64)  # [n_boot] Mann-Whitney U of each replicate
        weights, u_np = self.weights.numpy(), u.numpy()  # numpy's take: 2x torch's indexing here
        step = max(1, CHUNK_CELLS // max(s.numel(), 1))
        for b in range(0, weights.shape[0], step):
            w = weights[b : b + step]  # [b, G] copies of each question
            neg = np.zeros((w.shape[0], g0.size + 1))  # [b, N0 + 1]: incorrect weight of the first j incorrect rows
            np.cumsum(np.take(w, g0, axis=1), axis=1, out=neg[:, 1:])
            at = np.take(neg, below, axis=1)  # [b, N1]: B_i (= T_i without ties)
            if ties:
                at = 0.5 * (at + np.take(neg, through, axis=1))  # (B_i + T_i) / 2
            u_np[b : b + step] = np.einsum("ij,ij->i", np.take(w, g1, axis=1), at)  # sum_i w_i (B_i + T_i) / 2
        return self._interval(torch.where((n1 > 0) & (n0 > 0), u / (n1 * n0), torch.full_like(u, math.nan)))


def _incorrect_before_ties(s: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each correct row of ascending scores s [N] (correct c [N] bool): how many incorrect rows score strictly
    below it, and how many score at most as much (below + tied); [N1] int64 each."""
    n = s.numel()
    new_block = torch.ones(n, dtype=torch.bool)
    new_block[1:] = s[1:] != s[:-1]  # `!=`, not diff: -inf == -inf is a tie
    starts = torch.nonzero(new_block).flatten()  # [K] first row of each tie block
    ends = torch.cat([starts[1:], torch.tensor([n])])  # [K] one past its last row
    block = torch.cumsum(new_block.to(torch.int64), 0) - 1  # [N] tie-block id
    n0_before = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum((~c).to(torch.int64), 0)])  # [N + 1]
    return n0_before[starts[block[c]]], n0_before[ends[block[c]]]

"""Calibration-aware and negative-enhanced GRPO variants, behind ``ADVANTAGES`` with the uniform signature of
:mod:`capo.core.advantages` (``estimator(rewards, group_size, *, scores=None, keep=None, **advantage_kwargs) -> [N]``).

Each method's extra per-response input is a keyword argument that only it reads (shapes [N], or [N, K]):

- ``ace``           ``confidence_shift`` [N]: c_i = sum_t (log pi_old - log pi_ref), the rollout policy's sequence
                    log-ratio to the reference model (a stop-gradient constant).
- ``seed_grpo``     ``cluster_ids`` [N] int: the answer's equivalence class within its prompt (-1 = no answer).
- ``gdpo``          ``components`` [N, K] floating: the K reward terms before they are combined.
- ``unlikeliness``  ``scores`` [N] (mean token log-prob of the rollout policy, as CAPO).
- ``ngrpo``         nothing beyond the rewards.

Rows n*G..(n+1)*G-1 are the G responses of prompt n (N = B*G). Every estimator returns ``A_i * keep_i``.
"""

from __future__ import annotations

import math

import torch

from capo.core import checks
from capo.core.advantages import apply_keep, prepare_rewards, grpo_advantage
from capo.core.registry import ADVANTAGES


def _shaped(name: str, x, rewards: torch.Tensor, *, floating: bool) -> torch.Tensor:
    """Check a per-response keyword input: a tensor with N rows (the same N as ``rewards``)."""
    if x is None:
        raise ValueError(f"{name} is required by this estimator (see its docstring for the shape)")
    checks.tensor(name, x, floating=floating)
    if x.dim() == 0 or x.shape[0] != rewards.shape[0]:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but rewards has N={rewards.shape[0]} rows; they must match")
    if floating and not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    if not floating and (x.is_floating_point() or x.dtype == torch.bool or x.is_complex()):
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    return x


@ADVANTAGES.register("ace", reads=("confidence_shift",))
def ace_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    confidence_shift: torch.Tensor | None = None,
    alpha: float = 1.0,
    eps: float = 1e-6,
    std_ddof: int = 1,
    scale: str = "group",
) -> torch.Tensor:
    """ACE, Asymmetric Confidence-aware Error penalty (Xu et al., arXiv 2602.21420, Sec. 3; reconstructed from the
    abstract: the confidence shift and softplus modulation of negative advantages are the paper's, the exact form
    1 + alpha * softplus(c) is our reading):

        c_i = sg[log pi_old(y_i|x) - log pi_ref(y_i|x)]            (sequence log-ratio, a constant)
        A_i = A_i^GRPO                                 if A_i^GRPO >= 0
        A_i = A_i^GRPO * (1 + alpha * softplus(c_i))   if A_i^GRPO < 0

    An error the policy has become more sure of than the reference (c_i > 0) is pushed down harder; an
    exploratory error (c_i << 0) keeps about the GRPO penalty. ``alpha=0`` is GRPO exactly. ``eps``, ``std_ddof``,
    ``scale`` are :func:`grpo_advantage`'s. Shapes: rewards, confidence_shift, keep [N] -> [N].
    """
    checks.non_negative("alpha", alpha)
    prepare_rewards(rewards, group_size, scores, keep)
    c = _shaped("confidence_shift", confidence_shift, rewards, floating=True)
    checks.tensor("confidence_shift", c, ndim=1)
    base = grpo_advantage(rewards, group_size, eps=eps, std_ddof=std_ddof, scale=scale)  # [N]
    weight = 1 + alpha * torch.nn.functional.softplus(c.to(base.dtype))
    return apply_keep(torch.where(base < 0, base * weight, base), keep)


def semantic_entropy(cluster_ids: torch.Tensor, group_size: int, *, estimator: str = "plugin",
                     unanswered: str = "singleton") -> torch.Tensor:
    """Per-prompt semantic entropy from answer equivalence classes (Kuhn et al. 2023; Farquhar et al. 2024,
    discrete form: cluster probabilities are frequencies p_k = |C_k| / G):

        "plugin":    SE = -sum_k p_k log p_k
        "mean_log":  SE = -(1/K) sum_k log p_k       (the Monte-Carlo form SEED-GRPO writes, arXiv 2505.12346 Sec. 3)

    Both lie in [0, log G]: 0 when every answer agrees, log G when all G differ. ``unanswered``: "singleton"
    (each response with id -1 is its own cluster) or "cluster" (all -1 responses form one cluster).
    Shapes: cluster_ids [N] int -> [B] float64.
    """
    checks.choice("estimator", estimator, ("plugin", "mean_log"))
    checks.choice("unanswered", unanswered, ("singleton", "cluster"))
    g = checks.group_size(cluster_ids.shape[0], group_size, min_size=2)
    ids = cluster_ids.view(-1, g)  # [B, G]
    same = ids[:, :, None] == ids[:, None, :]  # [B, G, G]
    if unanswered == "singleton":
        same = same & ((ids[:, :, None] >= 0) | torch.eye(g, dtype=torch.bool, device=ids.device))
    count = same.sum(dim=2).to(torch.float64)  # [B, G]: size of response i's cluster
    log_p = torch.log(count / g)
    if estimator == "plugin":  # sum_k p_k log p_k = (1/G) sum_i log p_{k(i)}
        return -log_p.mean(dim=1)
    k = (1.0 / count).sum(dim=1)  # number of clusters: each cluster's members sum to 1
    return -(log_p / count).sum(dim=1) / k


@ADVANTAGES.register("seed_grpo", reads=("cluster_ids",))
def seed_grpo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    cluster_ids: torch.Tensor | None = None,
    alpha: float = 1.0,
    modulation: str = "linear",
    estimator: str = "plugin",
    unanswered: str = "singleton",
    eps: float = 1e-6,
    std_ddof: int = 1,
    scale: str = "group",
) -> torch.Tensor:
    """SEED-GRPO (Chen et al., arXiv 2505.12346, Sec. 3, the uncertainty-aware advantage):

        A_i = A_i^GRPO * f(alpha * SE(q) / SE_max(q)),   SE_max = log G

    with SE from :func:`semantic_entropy` over the answers' equivalence classes (``cluster_ids``, unique within a
    prompt; -1 = no answer). ``modulation`` f: "linear" f(x) = 1 - x (needs alpha <= 1 so f >= 0) or "exp"
    f(x) = exp(-x) (reconstructed: the paper names linear, exponential and focal forms; we give the first two).
    Confident prompts (one answer, SE = 0) keep the GRPO advantage; ``alpha=0`` is GRPO exactly.
    Shapes: rewards, cluster_ids, keep [N] -> [N].
    """
    checks.non_negative("alpha", alpha)
    checks.choice("modulation", modulation, ("linear", "exp"))
    if modulation == "linear" and alpha > 1:
        raise ValueError(f"alpha must be <= 1 with modulation='linear' (f = 1 - x must stay >= 0), got {alpha!r}")
    prepare_rewards(rewards, group_size, scores, keep)
    ids = _shaped("cluster_ids", cluster_ids, rewards, floating=False)
    checks.tensor("cluster_ids", ids, ndim=1)
    x = alpha * semantic_entropy(ids, group_size, estimator=estimator, unanswered=unanswered) / math.log(group_size)
    f = 1 - x if modulation == "linear" else torch.exp(-x)  # [B]
    base = grpo_advantage(rewards, group_size, eps=eps, std_ddof=std_ddof, scale=scale).view(-1, group_size)
    return apply_keep((base * f[:, None].to(base.device, base.dtype)).reshape(-1), keep)


@ADVANTAGES.register("gdpo", reads=("components",))
def gdpo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    components: torch.Tensor | None = None,
    weights: list[float] | tuple[float, ...] | None = None,
    batch_norm: bool = True,
    eps: float = 1e-6,
    std_ddof: int = 1,
) -> torch.Tensor:
    """GDPO, group reward-decoupled normalisation (Liu et al., arXiv 2601.05242, Sec. 3; the authors' TRL and verl
    code): each reward component is group-normalised on its own, the results are summed, then normalised over the
    batch:

        A_i^(k) = (r_i^(k) - mean_g r^(k)) / (std_g r^(k) + eps)          per component k (GRPO's z-score)
        S_i     = sum_k w_k A_i^(k)
        A_i     = (S_i - mean_batch S) / (std_batch S + eps)              (``batch_norm``)

    ``components`` [N, K]: the K reward terms (for RLCR: correctness and the negative Brier term,
    :func:`capo.core.rewards.rlcr_components`); ``rewards`` is only checked (its shape fixes N). ``weights``: w_k
    (default all 1). Batch statistics run over the rows ``keep`` leaves in (all rows without it); with K = 1 and
    ``batch_norm=False`` this is GRPO. Shapes: components [N, K], keep [N] -> [N].
    """
    prepare_rewards(rewards, group_size, scores, keep)
    comp = _shaped("components", components, rewards, floating=True)
    checks.tensor("components", comp, ndim=2)
    k = comp.shape[1]
    w = [1.0] * k if weights is None else list(weights)
    if len(w) != k or not all(checks.is_real(v) for v in w):
        raise ValueError(f"weights must be {k} numbers (one per reward component), got {weights!r}")
    s = sum(w[j] * grpo_advantage(comp[:, j].to(rewards.dtype).contiguous(), group_size, eps=eps,
                                  std_ddof=std_ddof) for j in range(k))  # [N]
    if batch_norm:
        m = torch.ones_like(s) if keep is None else keep.to(s.dtype)
        n = m.sum()
        mean = (s * m).sum() / n.clamp(min=1)
        var = ((s - mean).square() * m).sum() / (n - std_ddof).clamp(min=1)
        s = (s - mean) / (var.sqrt() + eps)
    return apply_keep(s, keep)


@ADVANTAGES.register("unlikeliness", reads=("scores",))
def unlikeliness_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor,
    keep: torch.Tensor | None = None,
    beta: float = 0.25,
    eps: float = 1e-6,
    std_ddof: int = 1,
    scale: str = "group",
) -> torch.Tensor:
    """Unlikeliness reward (He, Fried & Welleck, arXiv 2506.02355, Sec. 4; the authors' released code), then GRPO:

        R'_i = R_i * (1 - beta * (G - rank_i) / G),     A_i = GRPO(R')_i

    rank_i in 1..G orders the group by sequence likelihood, 1 = most likely: the most likely response's reward is
    scaled by 1 - beta (G-1)/G, the least likely's is kept, so rare correct solutions are worth more. Likelihood is
    ``scores`` = mean token log-prob under the rollout policy (a constant), as in the released code; ties are
    ranked by row order (stable sort). ``beta=0`` is GRPO exactly. Shapes: rewards, scores, keep [N] -> [N].
    """
    checks.non_negative("beta", beta)
    r, g = prepare_rewards(rewards, group_size, scores, keep, need_scores=True)  # [B, G]
    s = scores.view(-1, g)
    order = torch.sort(s, dim=1, stable=True).indices  # ascending: least likely first
    below = torch.empty_like(order)
    below.scatter_(1, order, torch.arange(g, device=s.device).expand_as(order))  # G - rank_i (0 = least likely)
    shaped = r * (1 - beta * below.to(r.dtype) / g)
    return apply_keep(grpo_advantage(shaped.reshape(-1), g, eps=eps, std_ddof=std_ddof, scale=scale), keep)


@ADVANTAGES.register("ngrpo")
def ngrpo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    max_reward: float = 1.0,
    n_virtual: int = 1,
    eps: float = 1e-6,
    std_ddof: int = 1,
) -> torch.Tensor:
    """NGRPO advantage calibration (Nan et al., arXiv 2509.18851, Sec. 3.1; the authors' verl code): the group
    statistics include ``n_virtual`` virtual samples of reward r_max that are never trained on:

        R+ = {R_1, ..., R_G} u {r_max} x m,   A_i = (R_i - mean(R+)) / (std(R+) + eps)

    An all-wrong group now gets a negative advantage instead of 0; an all-r_max group still gets 0. Pair it with
    NGRPO's asymmetric clipping (``ppo_clip`` eps_low 0.16, eps_high 0.24; the ``ngrpo`` preset).
    Shapes: rewards, keep [N] -> [N].
    """
    if not checks.is_int(n_virtual) or n_virtual < 1:
        raise ValueError(f"n_virtual must be an int >= 1, got {n_virtual!r}")
    checks.positive("eps", eps)  # an all-r_max group's augmented std is 0
    checks.choice("std_ddof", std_ddof, (0, 1))
    r, g = prepare_rewards(rewards, group_size, scores, keep)  # [B, G]
    virtual = torch.full((r.shape[0], n_virtual), float(max_reward), dtype=r.dtype, device=r.device)
    aug = torch.cat([r, virtual], dim=1)  # [B, G + m]
    adv = (r - aug.mean(dim=1, keepdim=True)) / (aug.std(dim=1, keepdim=True, correction=std_ddof) + eps)
    return apply_keep(adv.reshape(-1), keep)

"""DAPO's dynamic-sampling group filter and overlong reward shaping (arXiv 2503.14476)."""

from __future__ import annotations

import torch

from capo.core import checks


# What DAPO's group filter compares within a group (``algo.group_filter_by``): the verdicts, as the paper's eq. 11
# (0 < |{correct}| < G), or the rewards after shaping (an overlong penalty alone then keeps an all-wrong group).
GROUP_FILTER_BY = ("correct", "reward")


def informative_groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dynamic sampling (DAPO Sec. 3.2, eq. 11): keep groups whose ``values`` are not all equal. With the verdicts
    as 0/1 this is the paper's constraint 0 < |{correct}| < G; with the rewards, groups whose rewards differ.
    Shapes: values [N] floating -> keep [B] bool. Use ``keep.repeat_interleave(G)`` for a per-response mask."""
    checks.tensor("values", values, ndim=1, floating=True)
    g = checks.group_size(values.shape[0], group_size, min_size=2)
    r = values.view(-1, g)
    return (r != r[:, :1]).any(dim=1)


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """Soft overlong punishment (DAPO Sec. 3.4, eq. 13), added to the task reward:

        R_len(y) = 0                                  if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                 = -1                                 if |y| > L_max

    Shapes: lengths [N] (integer or float token counts) -> [N] float32.
    """
    checks.tensor("lengths", lengths, ndim=1)
    if not (checks.is_int(max_len) and checks.is_int(cache_len) and 0 < cache_len <= max_len):
        raise ValueError(f"need integers 0 < cache_len <= max_len, got cache_len={cache_len!r}, max_len={max_len!r}")
    y = lengths.to(torch.float32)
    start = max_len - cache_len
    pen = (start - y) / cache_len
    pen = torch.where(y <= start, torch.zeros_like(y), pen)
    return torch.where(y > max_len, torch.full_like(y, -1.0), pen)

"""Algorithm presets: each ``algo.name`` -> the component choices it implies (registry names and flat
hyperparameters). The one list of algorithm names, read by the trainer's config, ``capo demo`` and the adapters.
Pure data; docs/papers.md maps each paper to its preset."""

from __future__ import annotations

from typing import Any

__all__ = ["ALGORITHMS"]

ALGORITHMS: dict[str, dict[str, Any]] = {
    # name -> the component choices it implies; see docs/papers.md for each paper's mapping.
    "grpo": dict(advantage="grpo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="correctness"),
    "dr_grpo": dict(advantage="dr_grpo", loss="ppo_clip", aggregation="seq-mean-token-sum-norm",
                    reward="correctness"),
    "rloo": dict(advantage="rloo", loss="ppo_clip", aggregation="token-mean", reward="correctness"),
    "dapo": dict(advantage="grpo", loss="ppo_clip", loss_kwargs={"eps_low": 0.2, "eps_high": 0.28},
                 aggregation="token-mean", reward="correctness", group_filter=True, overlong_cache=4),
    "gspo": dict(advantage="grpo", loss="gspo", aggregation="seq-mean-token-mean", reward="correctness"),
    "cispo": dict(advantage="grpo", loss="cispo", aggregation="token-mean", reward="correctness"),
    "capo": dict(advantage="capo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="correctness",
                 advantage_kwargs={"tau": 0.6}, noise_mask="quantile"),
    # capo's variant (not in any paper; docs/papers.md, "CAPO's fixed point on a stochastic outcome, in general"):
    # whole-sequence log-prob scores at tau 1, whose fixed point on a stochastic outcome is the outcome's rate when
    # nothing removes correct and incorrect responses at different rates; it keeps CAPO's quantile mask (the paper's
    # method with only the score changed), which pulls that fixed point towards 1/2 (item 4 there). For responses of
    # one length only: on reasoning traces of varying length it gained no accuracy on average and collapsed on 7 of
    # 20 seeds (docs/results/fixed-point.md, the registered `word_capo_sum`)
    "capo_sum": dict(advantage="capo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="correctness",
                     advantage_kwargs={"tau": 1.0, "score": "sum"}, noise_mask="quantile"),
    "rlcr": dict(advantage="grpo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="rlcr"),
    # calibration-aware methods and GRPO variants; extra inputs noted where the method reads one
    "ace": dict(advantage="ace", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="correctness",
                advantage_kwargs={"alpha": 1.0}),  # reads confidence_shift (needs the reference model)
    "seed_grpo": dict(advantage="seed_grpo", loss="ppo_clip", aggregation="seq-mean-token-mean",
                      reward="correctness", advantage_kwargs={"alpha": 1.0}),  # reads cluster_ids
    "gdpo": dict(advantage="gdpo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="rlcr"),  # components
    "unlikeliness": dict(advantage="unlikeliness", loss="ppo_clip", aggregation="seq-mean-token-mean",
                         reward="correctness", advantage_kwargs={"beta": 0.25}),
    "ngrpo": dict(advantage="ngrpo", loss="ppo_clip", loss_kwargs={"eps_low": 0.16, "eps_high": 0.24},
                  aggregation="token-mean", reward="correctness"),
    "c2gspg": dict(advantage="grpo", loss="c2gspg", aggregation="seq-mean-token-mean", reward="correctness",
                   loss_kwargs={"lam": 1.0}),  # the loss reads rewards
    "clip_cov": dict(advantage="grpo", loss="clip_cov", aggregation="token-mean", reward="correctness"),
    "kl_cov": dict(advantage="grpo", loss="kl_cov", aggregation="token-mean", reward="correctness"),
    "ppo_c": dict(advantage="grpo", loss="ppo_clip", aggregation="seq-mean-token-mean", reward="ppo_c"),
}

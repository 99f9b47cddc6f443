"""The embedded default's quick measurement (``capo build-default`` and its tests): accuracy, RLCR format rate,
termination, the mix of outcomes per prompt and the AUROC of the mean token log-prob, with capo's one sampler
(:class:`capo.rollout.sampling.HFEngine`: raw temperature-1 log-probs), one grader (:func:`capo.rollout.grade`,
math-verify against the gold integer) and the core's calibration metrics."""

from __future__ import annotations

import math

import torch

from capo.core import calibration as cal
from capo.core import sequence_logprob_mean
from capo.rollout import HFEngine, grade
from capo.tasks.problem import Problem
from capo.tasks.prompts import render_problem
from capo.verify import Verifier

__all__ = ["evaluate_default"]


@torch.no_grad()
def evaluate_default(model, tokenizer, problems: list[Problem], *, group_size: int = 8, temperature: float = 1.0,
                     max_new_tokens: int = 64, seed: int = 0, batch_prompts: int = 64,
                     dataset: str = "default", answer_format: str = "rlcr") -> dict:
    """Sample ``group_size`` responses per problem and measure accuracy, format rate, the fraction of prompts with
    mixed outcomes, and the AUROC of lpm (pooled, and per prompt averaged: AUC-mean). Returns a dict of numbers
    (``n_prompts`` ... ``mean_confidence``) and ``samples`` (one record per response). ``answer_format``: the
    grader's (``percent`` for the stochastic task: "accuracy" is then the rate of outcome 1, ``format_rate`` the
    rate of valid stated probabilities and ``mean_confidence`` their mean)."""
    engine = HFEngine(model.eval(), tokenizer, autocast="off")
    torch.manual_seed(seed)
    recs = []
    with Verifier(workers=1) as verifier:
        for b in range(0, len(problems), batch_prompts):
            chunk = problems[b : b + batch_prompts]
            prompts = [render_problem(tokenizer, p, dataset=dataset) for p in chunk]
            ro = engine.sample(prompts, k=group_size, max_new_tokens=max_new_tokens, temperature=temperature)
            g = grade(ro.texts, [p.answer for p in chunk for _ in range(group_size)], verifier,
                      answer_format=answer_format)
            lpm = sequence_logprob_mean(ro.gen_logp, ro.response_mask).tolist()
            for i, text in enumerate(ro.texts):
                recs.append({"id": chunk[i // group_size].id, "text": text, "format_ok": bool(g.format_ok[i]),
                             "correct": bool(g.correct[i]), "confidence": g.parses[i].confidence, "lpm": lpm[i],
                             "length": int(ro.lengths[i]), "terminated": not bool(ro.truncated[i])})
    return _summary(recs, group_size, temperature, seed)


def _summary(recs: list[dict], group_size: int, temperature: float, seed: int) -> dict:
    ids = {r["id"]: i for i, r in enumerate({r["id"]: r for r in recs}.values())}
    gid = torch.tensor([ids[r["id"]] for r in recs])
    correct = torch.tensor([r["correct"] for r in recs])
    lpm = torch.tensor([r["lpm"] for r in recs], dtype=torch.float64)
    per_prompt = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, gid, correct.double()) / group_size
    conf = [r["confidence"] for r in recs if r["confidence"] is not None]
    n = len(recs)
    return {
        "n_prompts": len(ids), "group_size": group_size, "temperature": temperature, "seed": seed,
        "accuracy": float(correct.double().mean()),
        "format_rate": sum(r["format_ok"] for r in recs) / n,
        "terminated_rate": sum(r["terminated"] for r in recs) / n,
        "mixed_fraction": float(((per_prompt > 0) & (per_prompt < 1)).double().mean()),
        "all_correct_fraction": float((per_prompt == 1).double().mean()),
        "all_wrong_fraction": float((per_prompt == 0).double().mean()),
        "lpm_auroc_pooled": cal.auroc(lpm, correct),
        "lpm_auc_mean": cal.auc_mean(lpm, correct, gid).value,
        "mean_response_tokens": sum(r["length"] for r in recs) / n,
        "mean_confidence": sum(conf) / len(conf) if conf else math.nan,
        "samples": recs,
    }

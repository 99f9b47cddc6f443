"""Pilot of the facts task's prompt format on SmolLM2-135M-Instruct as shipped, before any training.

Samples k responses per question at temperature 1 from the *train* split (the held-out split is not looked at) for
each prompt format below and prints, per format: accuracy, the share of responses with no answer (refusals, long
or cut sentences: UNPARSABLE), the share cut by the token budget, the mean response length, the share of questions
the model half-knows (some but not all of its k answers right: where a group's advantages are not all zero), the
pooled AUROC and the per-question AUC-mean of the mean token log-prob (lpm), and accuracy per relation. The format
chosen, and why, is written in docs/results/real-model.md ("Facts: the prompt pilot").

    python sweeps/pilots/facts_prompt.py --per-relation 16 -k 8 --out runs/pilots/facts_prompt.json
    python sweeps/pilots/facts_prompt.py --per-relation 16 -k 8 --max-new-tokens 24 \
        --formats chat+rlcr+prefill chat+rlcr-example+prefill     # RLCR's opening tag written for the model
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from capo.core.calibration import auc_mean, auroc
from capo.rollout.grading import grade
from capo.rollout.models import load_model
from capo.rollout.sampling import HFEngine
from capo.tasks.facts import RELATIONS, facts_problems, relation_of
from capo.tasks.prompts import SYSTEM_RLCR_SHORT, render_prompt

OWN_SYSTEM = "Answer each question with the answer alone: a name, a symbol or a number. Never write a sentence."
RLCR_EXAMPLE = (SYSTEM_RLCR_SHORT + " For example, to 'What is the capital of Italy?' reply exactly: "
                "<answer>Rome</answer> <confidence>0.9</confidence>")
ONE_SHOT = "What is the capital of Italy? Answer with the name only.\nRome\n\n"
# name -> (chat template, system (None: the template's own), prefix of the user turn, answer format, prefill: the
# start of the assistant's turn written into the prompt, graded as the response's start)
FORMATS = {
    "chat": (True, None, "", "short", ""),
    "chat+system": (True, OWN_SYSTEM, "", "short", ""),
    "chat+one-shot": (True, None, ONE_SHOT, "short", ""),
    "plain": (False, None, "", "short", ""),
    "chat+rlcr": (True, SYSTEM_RLCR_SHORT, "", "rlcr_short", ""),
    "chat+rlcr-example": (True, RLCR_EXAMPLE, "", "rlcr_short", ""),
    "chat+rlcr+prefill": (True, SYSTEM_RLCR_SHORT, "", "rlcr_short", "<answer>"),
    "chat+rlcr-example+prefill": (True, RLCR_EXAMPLE, "", "rlcr_short", "<answer>"),
}


def _questions(per_relation: int):
    train = facts_problems("train")
    return [p for r in RELATIONS for p in [q for q in train if relation_of(q) == r][:per_relation]]


def _measure(engine, problems, fmt, k, max_new, seed, temperature) -> dict:
    chat, system, prefix, answer_format, prefill = FORMATS[fmt]
    prompts = [render_prompt(engine.tokenizer, prefix + p.prompt, chat_template=chat, system=system) + prefill
               for p in problems]
    ro = engine.sample(prompts, k=k, max_new_tokens=max_new, seed=seed, temperature=temperature)
    golds = [p.answer for p in problems for _ in range(k)]
    texts = [prefill + t for t in ro.texts]
    g = grade(texts, golds, None, answer_format=answer_format)
    lpm = ro.gen_logp.sum(-1) / ro.lengths.clamp(min=1)
    correct = g.correct.float()
    per_q = correct.view(len(problems), k).mean(-1)
    groups = torch.arange(len(problems)).repeat_interleave(k)
    am = auc_mean(lpm, g.correct, groups)
    rel = {r: round(float(per_q[[i for i, p in enumerate(problems) if relation_of(p) == r]].mean()), 3)
           for r in RELATIONS}
    out = {"format": fmt, "temperature": temperature, "accuracy": round(float(correct.mean()), 4),
           "no_answer": round(sum(a is None for a in g.answers) / len(g.answers), 4),
           "truncated": round(float(ro.truncated.float().mean()), 4),
           "mean_tokens": round(float(ro.lengths.float().mean()), 2),
           "half_known": round(float(((per_q > 0) & (per_q < 1)).float().mean()), 4),
           "auroc_lpm": round(auroc(lpm, g.correct), 4), "auc_mean_lpm": round(float(am.value), 4),
           "auc_mean_prompts": int(am.n_groups_used), "per_relation": rel,
           "examples": texts[:: k * 8][:6]}
    if answer_format == "rlcr_short":
        out["format_ok"] = round(float(g.format_ok.float().mean()), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-relation", type=int, default=16, help="train questions per relation")
    ap.add_argument("-k", type=int, default=8, help="samples per question")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="0: greedy")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model("smollm2")
    engine = HFEngine(model, tok, autocast="auto")
    problems = _questions(a.per_relation)
    results = []
    for fmt, temp in [(f, t) for f in a.formats for t in a.temperatures]:
        t0 = time.perf_counter()
        r = _measure(engine, problems, fmt, a.k if temp > 0 else 1, a.max_new_tokens, a.seed, temp)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        print(json.dumps(r, ensure_ascii=False), flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results},
                                    ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()

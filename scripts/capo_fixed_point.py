"""Predicted sizes for `capo_sum` vs CAPO vs GRPO on `stochastic_binary`, from the fixed point of docs/papers.md
("CAPO's fixed point on a stochastic outcome, in general"), and the check of that theory on the records.

    python scripts/capo_fixed_point.py [--records sweeps/records/stochastic_binary] [--draws 100]
    python scripts/capo_fixed_point.py --traces RUN/generations.jsonl    # 3. only
    python scripts/capo_fixed_point.py --mask RUN_OR_RECORD [...] [--records FOLDER]   # 4. only

1. Prediction: a prompt names only the category, and a run trains on its own 256 questions every step, so the rate
   the policy meets is the training questions' outcome frequency q_c of category c (seed-specific; q_c != p_c by
   ~0.1). At each method's fixed point category c predicts 1 with probability pi_c, logit(pi_c) = k logit(q_c):
   k = L tau (CAPO: lpm over L = 5 tokens, tau 0.6 -> 3), k = 1 (capo_sum), or pi_c = 1[q_c > 1/2] (GRPO, k = inf).
   For each training seed the final evaluation's 500 questions (eval split, seed 0, graded against their own
   outcomes, rates p_c) x 16 samples are drawn `--draws` times from pi and measured with capo's own functions
   (`stated_means_summary`, `majority_vote`), so the prediction carries the 16-sample noise and the q_c - p_c gap
   that the measured values carry; the table is the mean over seeds.
2. Check: each record's per-category frequency of predicting 1 f_c (reconstructed from the verdicts and the
   questions' outcomes) and the k whose fixed point fits it best (least squares in probability, over q_c).
3. The price where lengths vary (`--traces`: a `capo eval` generations.jsonl, e.g. of the word_problems base model,
   `capo eval --model word_problems --dataset word_problems --limit 24 -k 8`): the spread of lpm and of the sum
   within groups, the pairs whose sum gap saturates the logistic weight, each score's AUC-mean, and the mean |A| and
   the length-weighted advantage sum_i A_i (|o_i| - mean_g |o|) per mixed group for CAPO (tau 0.6) and capo_sum.
4. The mask's keep-rate ratio (`--mask`: `capo train` run folders or sweep records of `stochastic_binary` with the
   mask on, trained after `train/masked_frac_correct` was logged): rho =
   (1 - masked_frac_incorrect) / (1 - masked_frac_correct) over the last TAIL steps of each run's metrics.jsonl, the
   k whose fixed point best fits the balance of docs/papers.md item 4 at that rho over the run's q_c (k0 = L tau: 3
   for CAPO, 1 for capo_sum, from the run's config), and beside it the k measured on the run's record in --records
   (METHOD-seedS.json; a record given to --mask is its own) when there is one, and the prediction times item 3's
   sharpening by the rest of the response (:func:`rest_factor`, read from that record's final responses).
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from capo.tasks.stochastic import stated_means_summary
from capo.core.voting import majority_vote
from capo.tasks.stochastic import binary_problems

# method -> k. Without the noise mask (or a mask that keeps correct and incorrect responses alike, rho = 1): CAPO
# L tau = 3, capo_sum 1. With a mask keeping incorrect responses at rho = 0.2 times the rate of correct ones (what
# CAPO's measured k ~1.05 implies if the mask alone holds it there; docs/papers.md) the fixed points move to the k
# that fits them: CAPO 1.10, capo_sum 0.61.
L = 5  # tokens of a stochastic_binary answer (outcome, space, two confidence digits, end): lpm's mean is over them
K = {"grpo": math.inf, "capo_nomask": L * 0.6, "capo_sum_nomask": 1.0, "capo (rho 0.2)": 1.10,
     "capo_sum (rho 0.2)": 0.61}
EVAL = {"problems": 500, "k": 16, "seed": 0}
TAIL = 30  # the last steps of a run whose mask rates are averaged (its curves are flat from step ~80 of 150)
N_TRAIN, N_CAT, SEEDS = 256, 20, range(1, 9)


def fixed_point(q: np.ndarray, k: float) -> np.ndarray:
    """pi with logit(pi) = k logit(q); k = inf is the majority outcome (1/2 at q = 1/2)."""
    q = np.clip(q, 1e-9, 1 - 1e-9)
    if math.isinf(k):
        return (q > 0.5) + 0.5 * (q == 0.5)
    return 1.0 / (1.0 + ((1.0 - q) / q) ** k)


def train_rates(seed: int) -> np.ndarray:
    """q_c [C]: the outcome frequency of category c among the run's training questions (train split, its seed)."""
    ones, tot = np.zeros(N_CAT), np.zeros(N_CAT)
    for q in binary_problems("train", N_TRAIN, seed):
        ones[q.meta["category"]] += int(q.answer)
        tot[q.meta["category"]] += 1
    return ones / np.maximum(tot, 1)


def predict(k: float, seed: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """[5] mean over draws of answer_rate_error, answer_ece, answer_auroc, accuracy, majority_vote."""
    probs = binary_problems("eval", EVAL["problems"], EVAL["seed"])
    p = np.array([q.meta["rate"] for q in probs])
    a = np.array([int(q.answer) for q in probs])
    pi = fixed_point(train_rates(seed), k)[[q.meta["category"] for q in probs]]
    n, s = len(probs), EVAL["k"]
    gid = torch.arange(n).repeat_interleave(s)
    rows = []
    for _ in range(draws):
        d = rng.random((n, s)) < pi[:, None]  # [Q, k] predicted outcome D = 1
        correct = d == a[:, None].astype(bool)
        m = stated_means_summary(torch.from_numpy(d.mean(1)), torch.from_numpy(a.astype(bool)), torch.from_numpy(p),
                                 prefix="answer")
        mv = majority_vote(torch.from_numpy(d.reshape(-1).astype(np.int64)), torch.from_numpy(correct.reshape(-1)),
                           gid).accuracy
        rows.append([m["answer_rate_error"], m["answer_ece"], m["answer_auroc"], correct.mean(), mv])
    return np.mean(rows, axis=0)


def measured_k(path: Path) -> float:
    """The k whose fixed point over the run's q_c best fits (least squares) its per-category frequencies f_c."""
    rec = json.loads(path.read_text())
    probs = {q.id: q for q in binary_problems("eval", EVAL["problems"], EVAL["seed"])}
    ones, tot = np.zeros(N_CAT), np.zeros(N_CAT)
    for pid, verdict, _ in rec["responses"]:
        if verdict not in (0, 1):  # unparsable: no prediction
            continue
        q = probs[pid]
        ones[q.meta["category"]] += int(q.answer) if verdict == 1 else 1 - int(q.answer)
        tot[q.meta["category"]] += 1
    f, q = ones / np.maximum(tot, 1), train_rates(rec["seed"])
    grid = np.linspace(0.1, 6, 591)
    return float(grid[np.argmin([((f - fixed_point(q, k)) ** 2).sum() for k in grid])])


def masked_pi(q: np.ndarray, k0: float, rho: float) -> np.ndarray:
    """pi at the balance of docs/papers.md item 4: logit(pi) / k0 + log((pi + rho (1 - pi)) / ((1 - pi) + rho pi))
    = logit(q) (increasing in logit(pi), solved by bisection); q in (0, 1)."""
    q = np.clip(q, 1e-6, 1 - 1e-6)
    target, lo, hi = np.log(q / (1 - q)), np.full(q.shape, -40.0), np.full(q.shape, 40.0)
    for _ in range(100):
        mid = (lo + hi) / 2
        pi = 1 / (1 + np.exp(-mid))
        below = mid / k0 + np.log((pi + rho * (1 - pi)) / ((1 - pi) + rho * pi)) < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 1 / (1 + np.exp(-lo))


def fit_k(pi: np.ndarray, q: np.ndarray) -> float:
    """The k of logit(pi) = k logit(q) that fits ``pi`` best (least squares in probability, the grid of measured_k)."""
    grid = np.linspace(0.1, 6, 591)
    return float(grid[np.argmin([((pi - fixed_point(q, k)) ** 2).sum() for k in grid])])


def _mask_inputs(path: Path) -> tuple[dict, list[dict]]:
    """(resolved training config as a dict, training rows) of a `capo train` run folder or a sweep record."""
    from capo.rundir import read_jsonl_rows

    if path.is_dir():
        import yaml

        return yaml.safe_load((path / "config.yaml").read_text()), read_jsonl_rows(path / "metrics.jsonl")
    rec = json.loads(path.read_text())
    return rec["config"], rec["curves"]["train"]


def mask_ratio(paths: list[Path], records: Path) -> None:
    """4.: each run's measured rho, the k the balance predicts at it, and the k measured on its record."""
    for path in paths:
        cfg, rows = _mask_inputs(path)
        kw, name, seed = cfg["algo"]["advantage_kwargs"], cfg["algo"]["name"], cfg["run"]["seed"]
        k0 = float(kw.get("tau", 0.6)) * (1.0 if kw.get("score") == "sum" else L)
        rows = [r for r in rows if "train/masked_frac_correct" in r][-TAIL:]
        mc = np.nanmean([r["train/masked_frac_correct"] for r in rows])
        mi = np.nanmean([r["train/masked_frac_incorrect"] for r in rows])
        rho, q = (1 - mi) / (1 - mc), train_rates(seed)
        rec = path if path.is_file() else records / f"{name}-seed{seed}.json"
        k_rho = fit_k(masked_pi(q, k0, rho), q)
        measured = "no record"
        if rec.exists():
            # item 3's spread divides the pair's gap term (k0 -> k0 x rest) and leaves the mask's factor as it is
            rest = rest_factor(rec, kw)
            both = fit_k(masked_pi(q, k0 * rest, rho), q)
            measured = f"measured k {measured_k(rec):.2f}; with the rest's spread x{rest:.3f}: {both:.3f}"
        print(f"{path}: masked correct {mc:.3f}, incorrect {mi:.3f} -> rho {rho:.2f}; predicted k {k_rho:.2f} "
              f"(k0 {k0:g}); {measured}")


def rest_factor(record: Path, kw: dict) -> float:
    """Item 3's sharpening of k by the rest of the response, sqrt(1 + pi v / 8) (probit approximation), v the
    variance of a score gap / tau between two responses with the same answer: twice the within-(question, answer)
    variance of the ranking score over the record's final responses (its lpm x L tokens for the sum)."""
    from collections import defaultdict

    by = defaultdict(list)
    for pid, verdict, lpm in json.loads(record.read_text())["responses"]:
        if lpm is not None and verdict in (0, 1):  # one answer per (question, verdict)
            by[(pid, verdict)].append(lpm * (L if kw.get("score") == "sum" else 1))
    groups = [np.array(xs) for xs in by.values() if len(xs) >= 2]
    var = sum(((x - x.mean()) ** 2).sum() for x in groups) / sum(len(x) - 1 for x in groups)
    return math.sqrt(1 + math.pi * (2 * var / float(kw.get("tau", 0.6)) ** 2) / 8)


def trace_price(path: Path, g: int = 8) -> None:
    """3.: the library's lengths check (:func:`capo.evaluation.lengths.length_check`, what `capo eval` stores in
    curves.lengths) and, beside it, the spread of each score, the median sum gap, each score's AUC-mean and the mean
    |A| of CAPO's two forms in mixed groups."""
    from capo.core import capo_advantage
    from capo.core.calibration import summarize
    from capo.evaluation.lengths import length_check
    from capo.rundir import read_jsonl

    rows = sorted(read_jsonl(path), key=lambda r: (r["prompt_idx"], r["sample_idx"]))
    n = torch.tensor([r["n_tokens"] for r in rows], dtype=torch.float64)
    lpm = torch.tensor([r["mean_logprob"] for r in rows], dtype=torch.float64)
    c = torch.tensor([r["verdict"] == "correct" for r in rows])
    gid, sums = torch.arange(len(rows)) // g, lpm * n
    check = length_check(gid, c, lpm, n)
    sd = {k: float(v.view(-1, g).std(1).mean()) for k, v in (("lpm", lpm), ("sum", sums))}
    pair = c.view(-1, g)[:, :, None] & ~c.view(-1, g)[:, None, :]  # [B, G_i, G_j] correct i, incorrect j
    gap = (sums.view(-1, g)[:, :, None] - sums.view(-1, g)[:, None, :])[pair]
    print(f"{len(rows)} traces, {check['mean_tokens']:.1f} tokens; within-group sd: length "
          f"{check['len_sd_within']:.1f}, lpm {sd['lpm']:.3f}, sum {sd['sum']:.2f}; corr(sum, length) "
          f"{check['sum_len_corr'] or 0:+.2f}; (correct, incorrect) pairs {check['capo_sum']['pairs']}: median "
          f"|sum gap| {gap.abs().median():.2f}, share > 3 nats {check['capo_sum']['saturated']:.2f}")
    for name, x in (("lpm", lpm), ("sum", sums), ("-length", -n)):
        print(f"  AUC-mean of {name}: {summarize(x, c, gid)['auc_mean']:.3f}")
    mixed = (c.view(-1, g).any(1) & ~c.view(-1, g).all(1)).repeat_interleave(g)
    for name, kw in (("capo", {"tau": 0.6}), ("capo_sum", {"tau": 1.0, "score": "sum"})):
        a = capo_advantage(c.double(), g, scores=lpm, lengths=n, **kw)
        print(f"  {name}: mean |A| in mixed groups {a[mixed].abs().mean():.3f}; length push sum_i A_i (|o_i| - "
              f"mean |o|) / sum_i |A_i| {check[name]['length_push'] or 0:+.2f} tokens per unit |A|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, default=Path("sweeps/records/stochastic_binary"))
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--traces", type=Path, help="a capo eval generations.jsonl: measure 3. only")
    ap.add_argument("--mask", type=Path, nargs="+", help="capo train run folders or records: measure 4. only")
    args = ap.parse_args()
    if args.traces:
        return trace_price(args.traces)
    if args.mask:
        return mask_ratio(args.mask, args.records)
    rng = np.random.default_rng(0)
    keys = ["answer_rate_error", "answer_ece", "answer_auroc", "accuracy", "majority_vote"]
    print(f"predicted at the fixed point, mean over seeds {SEEDS.start}-{SEEDS.stop - 1} "
          f"(500 questions x 16 samples, {args.draws} draws each):")
    for name, k in K.items():
        v = np.mean([predict(k, s, args.draws, rng) for s in SEEDS], axis=0)
        print(f"  {name:18s} k={k:<4}", " ".join(f"{m} {x:.3f}" for m, x in zip(keys, v)))
    for method in sorted({f.name.rsplit("-seed", 1)[0] for f in args.records.glob("*-seed*.json")}):
        ks = [measured_k(f) for f in sorted(args.records.glob(f"{method}-seed*.json"))]
        if ks:
            print(f"measured {method}: best-fitting k per seed {[round(k, 2) for k in ks]}, mean {np.mean(ks):.2f}")


if __name__ == "__main__":
    main()

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

import math
from dataclasses import dataclass

import numpy as np
import torch

from capo.core import checks
from capo.core.calibration import auroc, ece
from capo.core.rewards import scoring_rule


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
    """Reward of stating probability q for an outcome a in {0, 1}: :func:`capo.core.rewards.scoring_rule` ("log":
    a log q + (1 - a) log(1 - q), the paper's; "brier": -(q - a)^2). Shapes broadcast."""
    return scoring_rule(stated, outcome, rule)


# ---------------------------------------------------------------------------------- the task's own measures
# The per-question calibration of stated probabilities of stochastic outcomes (arXiv 2508.11800, Sec. 3, Table 1's
# measures), built on the core's general measures (capo.core.calibration.ece, auroc). capo eval's metrics, model
# comparisons and the trainer's eval/ call stochastic_summary when a batch carries the stochastic-outcome columns
# (outcome, stated, chosen: capo.rollout.grade with the "percent" or "outcome" answer format); docs/metrics.md
# defines each key.

# (metrics key, readable name, +1 = higher is better / -1 = lower is better): the task's measures as capo eval's
# report, model comparisons and their conclusion show them (PAIRED: the ones a comparison pairs across models)
MEASURES = (("stochastic_ece", "ECE of the per-question stated probability", -1),
            ("stochastic_rate_error", "mean |stated - true rate|", -1),
            ("stochastic_auroc", "AUROC of the per-question stated probability", 1),
            ("answer_ece", "ECE of the per-question frequency of predicting 1", -1),  # the binary variant only
            ("answer_rate_error", "mean |frequency of predicting 1 - true rate|", -1),
            ("answer_auroc", "AUROC of the per-question frequency of predicting 1", 1))
PAIRED = ("stochastic_ece", "stochastic_rate_error", "answer_ece", "answer_rate_error")

STATED_KEYS = ("stochastic_questions", "stochastic_ece", "stochastic_rate_error", "stochastic_auroc",
               "stochastic_mean_stated")
# the same measures of the predicted outcome's frequency (the binary variant, answer format "outcome")
ANSWER_KEYS = tuple(k.replace("stochastic_", "answer_") for k in STATED_KEYS)


def stated_question_means(stated, outcome, group_ids, rate) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per question with at least one valid stated probability: (m [Q'] float64 the mean of its valid stated
    probabilities, a [Q'] bool its outcome, p [Q'] float64 its true rate), questions in id order. Shapes: stated [N]
    floating in [0, 1], NaN = invalid (left out); outcome [N] bool (the same within a question); group_ids [N] int
    question ids (gaps allowed: an id no row has is no question); rate [N] floating, the question's true rate."""
    q, _ = checks.probs("stated", checks.array1d("stated", stated), allow_nan=True)
    a = checks.labels("outcome", outcome).to(q.device)
    g = checks.group_ids_1d("group_ids", group_ids).to(q.device)
    r = checks.array1d("rate", rate).to(q.device, torch.float64)
    checks.same_shape(stated=q, outcome=a, group_ids=g, rate=r)
    checks.nonempty("stated", q)
    n, valid = int(g.max()) + 1, ~torch.isnan(q)
    total = torch.zeros(n, dtype=torch.float64, device=q.device).index_add_(0, g[valid], q[valid].to(torch.float64))
    count = torch.zeros(n, dtype=torch.float64, device=q.device).index_add_(0, g[valid], torch.ones_like(total[g[valid]]))
    has = count > 0
    per_a = torch.zeros(n, dtype=torch.bool, device=q.device).index_put_((g,), a)[has]
    per_r = torch.zeros(n, dtype=torch.float64, device=q.device).index_put_((g,), r)[has]
    return total[has] / count[has], per_a, per_r


def stated_probability_summary(stated, outcome, group_ids, rate, n_bins: int = 10) -> dict[str, float]:
    """Calibration of stated probabilities of stochastic outcomes, per question (Bereket & Leskovec, arXiv
    2508.11800, Sec. 3, the measures of Table 1), on :func:`stated_question_means`' m, a, p: ``stochastic_ece``
    (``n_bins``-bin ECE of m against a), ``stochastic_rate_error`` (mean |m - p|), ``stochastic_auroc`` (AUROC of m
    for a), ``stochastic_mean_stated`` (mean of m), ``stochastic_questions`` (Q'; the others NaN when it is 0).
    Shapes as :func:`stated_question_means`."""
    return stated_means_summary(*stated_question_means(stated, outcome, group_ids, rate), n_bins=n_bins)


def stated_means_summary(m: torch.Tensor, a: torch.Tensor, p: torch.Tensor, n_bins: int = 10,
                         prefix: str = "stochastic") -> dict[str, float]:
    """:func:`stated_probability_summary` from :func:`stated_question_means`' output (m, a, p: [Q'] each), for a
    caller that also needs the means (``capo eval``'s reliability diagram), so they are computed once. ``prefix``
    names the keys (``stochastic``: :data:`STATED_KEYS`; ``answer``: :data:`ANSWER_KEYS`)."""
    out = {f"{prefix}_questions": float(m.numel())}
    if m.numel() == 0:
        return out | {k.replace("stochastic", prefix, 1): math.nan for k in STATED_KEYS[1:]}
    return out | {f"{prefix}_ece": ece(m, a, n_bins=n_bins), f"{prefix}_rate_error": float((m - p).abs().mean()),
                  f"{prefix}_auroc": auroc(m, a), f"{prefix}_mean_stated": float(m.mean())}


def stochastic_summary(stated, outcome, group_ids, rate, chosen=None, n_bins: int = 10) -> dict[str, float]:
    """The per-question measures of stochastic outcomes, the one function ``capo eval``, comparisons and the trainer
    call: :func:`stated_probability_summary` of the stated probabilities of a = 1 (:data:`STATED_KEYS`) and, given
    ``chosen`` (the binary variant: [N] the predicted outcome as 1.0 / 0.0, NaN where invalid), the same measures of
    each question's frequency of predicting 1, the model's own probability of the outcome (:data:`ANSWER_KEYS`;
    arXiv 2508.11800 reads a model's answer distribution this way). Shapes as :func:`stated_question_means`."""
    out = stated_probability_summary(stated, outcome, group_ids, rate, n_bins=n_bins)
    if chosen is not None:
        out |= stated_means_summary(*stated_question_means(chosen, outcome, group_ids, rate), n_bins=n_bins,
                                    prefix="answer")
    return out


# ------------------------------------------------------------------------------ the generated task ``stochastic``
# A language-model version of the setting: the prompt names the question's category, the model states a probability
# for a = 1 as two digits (percent) and is scored against the question's fixed outcome.
#
#     prompt   = "<s>P(C)="              (category C of 20: letters A, B, ...)
#     response = "37</s>"                (stated probability 0.37; parsed strictly, capo.verify.extract_percent)
#
# Gold = the fixed outcome "1" / "0"; the ``percent`` answer format grades it (capo.rollout.grade: ``correct`` = the
# outcome, ``confidence`` = the stated probability), and the ``log_score`` / ``brier_score`` rewards score it.
#
# The binary variant ``stochastic_binary`` asks the same questions (the same draws) as "predict the outcome and say
# how sure you are", where a prediction can be right or wrong, so that CAPO (verdicts = the prediction matches the
# outcome) and RLCR (a Brier term on the stated confidence) apply:
#
#     prompt   = "<s>B(C)="
#     response = "1 73</s>"              (predicts a = 1, 73% sure it is right; capo.verify.extract_outcome)
#
# The ``outcome`` answer format grades it: ``correct`` = D == a, ``confidence`` = 0.73 (the stated P(correct)); the
# stated probability of a = 1 is 0.73 for D = 1 and 0.27 for D = 0, and the frequency of D = 1 is the model's own
# probability of the outcome (stochastic_summary, above, measures both per question).

TASK_NAME = "stochastic"
BINARY_TASK_NAME = "stochastic_binary"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# n_categories: categories (one letter each, at most 26); rate_seed: the draw of the true rates p_c ~ U(0, 1), shared
# by both splits (numpy default_rng(rate_seed).uniform, as stochastic_data draws them).
DEFAULT_OPTIONS: dict[str, int] = {"n_categories": 20, "rate_seed": 0}
_OPTION_RANGES = {"n_categories": (1, len(LETTERS)), "rate_seed": (0, 2**32 - 1)}


def check_options(options: dict | None) -> dict[str, int]:
    """The task options with defaults filled in; ConfigError naming an unknown key or a value out of range."""
    from capo.errors import ConfigError
    from capo.tasks.problem import fill_options

    def value(key, val):
        lo, hi = _OPTION_RANGES[key]
        if not checks.is_int(val) or not lo <= val <= hi:
            raise ConfigError(f"data.task_options.{key} must be an integer in [{lo}, {hi}], got {val!r}")
        return val

    return fill_options(TASK_NAME, DEFAULT_OPTIONS, options, value)


def category_rates(n_categories: int = 20, rate_seed: int = 0) -> torch.Tensor:
    """[C] float64 true rates p_c ~ U(0, 1), numpy ``default_rng(rate_seed)``: the same for every split and seed."""
    return torch.from_numpy(np.random.default_rng(rate_seed).uniform(0, 1, size=(n_categories,)))


def stochastic_problems(split: str, n: int, seed: int = 0, options: dict | None = None) -> list:
    """``n`` questions of ``split`` ("train" / "eval"): question i draws its category uniformly and its fixed outcome
    a ~ Bernoulli(p_c) from its own stream seeded by (split, seed, i), so the first k questions do not depend on n
    and the splits draw different outcomes (their prompts can coincide: a prompt is only its category). Gold "1" /
    "0"; ``meta``: ``category``, ``rate`` (p_c)."""
    return _problems(split, n, seed, options, TASK_NAME, "P")


def binary_problems(split: str, n: int, seed: int = 0, options: dict | None = None) -> list:
    """The binary variant's questions (``stochastic_binary``): the same draws as :func:`stochastic_problems` for the
    same split, seed and options (question i has the same category and outcome), asked as ``B(C)=``: predict the
    outcome and state a confidence that the prediction is right, ``D NN``."""
    return _problems(split, n, seed, options, BINARY_TASK_NAME, "B")


def _problems(split: str, n: int, seed: int, options: dict | None, name: str, letter: str) -> list:
    from capo.tasks.problem import Problem, check_split, question_rng

    check_split(split)
    opts = check_options(options)
    rates = category_rates(opts["n_categories"], opts["rate_seed"]).tolist()
    out = []
    for i in range(n):
        rng = question_rng(TASK_NAME, split, seed, i)
        c = rng.randrange(opts["n_categories"])
        a = int(rng.random() < rates[c])
        out.append(Problem(id=f"{name}-{split}-{seed}-{i}", prompt=f"{letter}({LETTERS[c]})=", answer=str(a),
                           meta={"category": c, "rate": rates[c]}))
    return out


def format_prompt(problem) -> str:
    """The raw prompt after BOS: ``P(C)=`` (``B(C)=`` for the binary variant)."""
    return problem.prompt


# The shipped base model: the embedded default's character tokenizer and architecture family, trained only to state
# each of 01 ... 99 with equal probability whatever the category (the paper's start: uniform answers).
ARCH = {"hidden": 64, "layers": 2, "heads": 4, "intermediate": 128, "max_positions": 32}
WARMUP = {"steps": 600, "batch_size": 512, "lr": 3e-3, "warmup_steps": 50}
MAX_NEW_TOKENS = 4  # two digits and EOS, one token of slack (a longer answer is truncated and invalid)
BINARY_MAX_NEW_TOKENS = 6  # "D NN" and EOS, one token of slack


def _uniform_answer(problem, rng) -> str:
    return f"{rng.randint(1, 99):02d}"


@torch.no_grad()
def stated_distribution(model, tokenizer, n_categories: int = 20) -> torch.Tensor:
    """[C, 99] float64: the exact probability, at temperature 1, that the model's whole response to ``P(c)=`` is the
    answer 01 ... 99 followed by EOS (row sums < 1: the rest is invalid output). Two batched forwards per category
    (prompt + first digit, prompt + both digits); the character tokenizer makes each digit one token."""
    digits = [tokenizer.convert_tokens_to_ids(str(k)) for k in range(10)]
    eos = tokenizer.eos_token_id
    out = torch.zeros(n_categories, 99, dtype=torch.float64)
    for c in range(n_categories):
        base = tokenizer(f"P({LETTERS[c]})=")["input_ids"]
        two = torch.tensor([base + [digits[a]] for a in range(10)])
        lp2 = torch.log_softmax(model(input_ids=two).logits.double(), -1)  # [10, L+1, V]
        p1 = lp2[0, len(base) - 1, digits].exp()  # first digit
        p12 = p1[:, None] * lp2[:, -1, digits].exp()  # [10, 10] both digits
        three = torch.tensor([base + [digits[a], digits[b]] for a in range(10) for b in range(10)])
        p_eos = torch.softmax(model(input_ids=three).logits[:, -1].double(), -1)[:, eos].view(10, 10)
        out[c] = (p12 * p_eos).flatten()[1:]  # drop "00"
    return out


@torch.no_grad()
def binary_distribution(model, tokenizer, n_categories: int = 20) -> torch.Tensor:
    """[C, 2, 99] float64: the exact probability, at temperature 1, that the model's whole response to ``B(c)=`` is
    ``D NN`` followed by EOS, for D = 0, 1 and NN = 01 ... 99 (the sum is < 1: the rest is invalid output). One
    batched forward per category over the 198 whole sequences (the character tokenizer: one token per character)."""
    answers = [f"{d} {k:02d}" for d in (0, 1) for k in range(1, 100)]
    eos = tokenizer.eos_token_id
    out = torch.zeros(n_categories, 2 * 99, dtype=torch.float64)
    for c in range(n_categories):
        base = tokenizer(f"B({LETTERS[c]})=")["input_ids"]
        seqs = torch.tensor([base + tokenizer(a, add_special_tokens=False)["input_ids"] + [eos] for a in answers])
        lp = torch.log_softmax(model(input_ids=seqs).logits.double(), -1)[:, len(base) - 1 : -1]
        out[c] = lp.gather(-1, seqs[:, len(base):, None]).squeeze(-1).sum(1).exp()
    return out.view(n_categories, 2, 99)


def _uniform_binary(problem, rng) -> str:
    return f"{rng.randint(0, 1)} {rng.randint(1, 99):02d}"


def _distribution_stats(variant: str, llama, tok) -> dict:
    """The shipped model's exact answer distribution against the uniform one it was trained on."""
    n = DEFAULT_OPTIONS["n_categories"]
    dist = (stated_distribution(llama, tok, n) if variant == "percent" else binary_distribution(llama, tok, n)).flatten(1)
    valid = dist.sum(1)
    tv = 0.5 * (dist - 1 / dist.shape[1]).abs().sum(1) + 0.5 * (1 - valid)
    out = {"tv_from_uniform_max": round(float(tv.max()), 4), "valid_mass_min": round(float(valid.min()), 4)}
    if variant == "percent":
        return out
    p1 = dist[:, 99:].sum(1) / valid
    return out | {"p_predict_1_range": [round(float(p1.min()), 4), round(float(p1.max()), 4)]}


def build_stochastic_model(out_dir, seed: int = 0, *, steps: int | None = None, batch_size: int | None = None,
                           lr: float | None = None, log_every: int = 100, log=None, variant: str = "percent") -> dict:
    """Train the stochastic task's base model from scratch (fp32, CPU, deterministic for a seed and thread count) on
    uniform answers to the prompts of every category and save it to ``out_dir``
    (:func:`capo.tasks.model_builder.build_model` with this task's settings): ``variant`` "percent" (the task
    ``stochastic``: 01-99 to ``P(c)=``) or "outcome" (``stochastic_binary``: ``D NN`` to ``B(c)=``, D and NN
    independent and uniform). The record (also in ``out_dir/capo_default.json``) has the exact answer distribution's
    distance from uniform (:func:`stated_distribution`, :func:`binary_distribution`): total variation per category
    (max), the valid mass (min) and, for "outcome", the range over categories of P(D = 1)."""
    import time

    from capo.tasks import model_builder as mb

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    problems_fn, respond, name = VARIANTS[variant]
    steps, batch_size = int(steps or WARMUP["steps"]), int(batch_size or WARMUP["batch_size"])
    lr = float(lr or WARMUP["lr"])
    t0 = time.perf_counter()
    recipe = mb.ModelRecipe(problems=lambda n: problems_fn("train", n, seed=seed), respond=respond,
                            prompt=format_prompt, steps=steps, batch_size=batch_size, lr=lr,
                            warmup_steps=int(WARMUP["warmup_steps"]), seed=seed, arch=mb.Architecture(**ARCH),
                            hooks=mb.WarmupHooks(log=log, log_every=log_every))
    built = mb.build_model(recipe, out_dir)
    answer_chars = 2 if variant == "percent" else 4
    n_answers = 99 if variant == "percent" else 198
    stats = {"task": f"capo:{name}", "options": DEFAULT_OPTIONS, "seed": seed, "steps": steps,
             "batch_size": batch_size, "lr": lr, "warmup_steps": int(WARMUP["warmup_steps"]),
             "architecture": {"type": "llama (trained as qwen2, exported)", **ARCH, "vocab": len(built.tokenizer)},
             "params": built.params, "final_loss": round(sum(built.losses[-20:]) / len(built.losses[-20:]), 4),
             "uniform_loss": round(math.log(n_answers) / (answer_chars + 1), 4),
             **_distribution_stats(variant, built.model, built.tokenizer),
             "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "train_seconds": round(time.perf_counter() - t0, 1)}
    mb.write_record(out_dir, stats)
    return stats


def build_binary_model(out_dir, seed: int = 0, **kw) -> dict:
    """:func:`build_stochastic_model` with ``variant="outcome"``: the base model of ``stochastic_binary``."""
    return build_stochastic_model(out_dir, seed, variant="outcome", **kw)


# variant -> (problems, the uniform answer the base model learns, task name)
VARIANTS = {"percent": (stochastic_problems, _uniform_answer, TASK_NAME),
            "outcome": (binary_problems, _uniform_binary, BINARY_TASK_NAME)}

"""``word_problems``: multi-step word problems with step-by-step traces -- the reasoning testbed.

Problems in the spirit of GSM8K, generated in code: one person's stock of one item changes through 3-6 operations
(buying, giving away, packs of several items, doubling, sharing out equally), with sentences carrying irrelevant
numbers mixed in. The gold solution is a trace with one computation per line, each line labelled by the sentence
it uses, ending in RLCR's answer and confidence tags (the verifier reads ``<answer>``)::

    prompt   = "<s>Ana has 7 pens. Ben is 9 years old. Ana buys 3 packs of 4 pens. Ana gives 5 pens to Ben.
                Ana splits her pens into 2 equal piles and keeps one. How many pens does Ana have now?\\n"
    response = "packs: 3*4=12\\nbuys 12: 7+12=19\\ngives 5: 19-5=14\\nsplits in 2: 14/2=7\\n"
               "<answer>7</answer><confidence>0.6</confidence></s>"

Why it exists: on the chain sums of the embedded default the answer's confidence sits in one digit
token; here a response is 60-130 characters of reasoning in which a model can go wrong in the middle (a wrong
product, a distractor number picked up, a step skipped) and still write a fluent answer line, which is where
perplexity can come apart from correctness.

Splits: the *skeleton* of a problem (its operations and numbers, not the names, items or wording) is hashed; one
skeleton in ``EVAL_BUCKETS`` is held out. Train and eval are therefore disjoint by construction, and an eval problem
is never a train problem re-worded. Problem ``i`` of (split, seed) is drawn from its own seeded stream, so the
first ``n`` problems do not depend on how many are asked for.

Difficulty knobs (:data:`DEFAULT_OPTIONS`): ``min_ops``/``max_ops`` (computations, i.e. trace lines; buying or
giving packs of several items takes two), ``max_start`` (largest starting amount), ``max_value`` (no intermediate value above it),
``distractors`` (largest number of irrelevant sentences).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from capo.errors import ConfigError, is_int
from capo.tasks.problem import SPLITS, Problem, check_split, fill_options, question_rng

__all__ = ["TASK_NAME", "DEFAULT_OPTIONS", "SPLITS", "EVAL_BUCKETS", "check_options", "word_problems",
           "format_prompt", "format_response", "check_trace", "TraceCheck"]

TASK_NAME = "word_problems"
EVAL_BUCKETS = 8
DEFAULT_OPTIONS: dict[str, int] = {"min_ops": 3, "max_ops": 6, "max_start": 20, "max_value": 150, "distractors": 2}
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
CONF_OPEN, CONF_CLOSE = "<confidence>", "</confidence>"

NAMES = ("Ana", "Ben", "Carla", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Mo", "Nia",
         "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wen", "Yara", "Zoe")
ITEMS = ("apples", "pens", "stamps", "marbles", "cards", "shells", "books", "coins", "eggs", "beads", "stickers",
         "cookies", "plums", "rocks", "cups", "bolts")
# Wording of each operation: (sentence, line label). {a}: the protagonist, {b}: another person, {i}: the item,
# {x}/{y}: the numbers. Label and sentence name the numbers the line uses.
WORDING = {
    "add": (("{a} buys {x} more {i}.", "buys {x}"), ("{b} gives {a} {x} {i}.", "gets {x}"),
            ("{a} finds {x} {i}.", "finds {x}")),
    "sub": (("{a} gives {x} {i} to {b}.", "gives {x}"), ("{a} loses {x} {i}.", "loses {x}"),
            ("{a} sells {x} {i}.", "sells {x}")),
    "pack_add": (("{a} buys {x} packs of {y} {i}.", "packs", "buys"),
                 ("{b} gives {a} {x} boxes with {y} {i} in each.", "boxes", "gets")),
    "pack_sub": (("{a} gives {x} friends {y} {i} each.", "friends", "gives"),
                 ("{a} fills {x} bags with {y} {i} each and sells the bags.", "bags", "sells")),
    "mul": (("{a} ends up with {x} times as many {i} as before.", "times {x}"),
            ("The number of {i} {a} has is multiplied by {x}.", "times {x}")),
    "div": (("{a} splits the {i} into {x} equal piles and keeps one.", "splits in {x}"),
            ("{a} shares the {i} equally among {x} kids and keeps one share.", "shares in {x}")),
}
DISTRACTORS = ("{b} is {x} years old.", "{b} has {x} {j}.", "The shop has {x} {j} left.",
               "{a} walks {x} blocks to school.", "{b} buys {x} {j}.")


def check_options(options: dict | None) -> dict[str, int]:
    """The task options with defaults filled in; ConfigError naming an unknown key or a bad value."""
    def value(key, val):
        if not is_int(val) or val < 0:
            raise ConfigError(f"data.task_options.{key} must be a non-negative integer, got {val!r}")
        return val

    opts = fill_options(TASK_NAME, DEFAULT_OPTIONS, options, value)
    if not 1 <= opts["min_ops"] <= opts["max_ops"] <= 12:
        raise ConfigError(f"data.task_options: need 1 <= min_ops <= max_ops <= 12, got min_ops={opts['min_ops']}, "
                          f"max_ops={opts['max_ops']}")
    if not 2 <= opts["max_start"] <= opts["max_value"]:
        raise ConfigError(f"data.task_options: need 2 <= max_start <= max_value, got max_start={opts['max_start']}, "
                          f"max_value={opts['max_value']}")
    return opts


def _split_of(skeleton: str) -> str:
    h = int.from_bytes(hashlib.sha256(skeleton.encode()).digest()[:8], "big")
    return "eval" if h % EVAL_BUCKETS == 0 else "train"


@dataclass(frozen=True)
class _Op:
    kind: str
    x: int
    y: int = 0


def _pick_op(rng: random.Random, cur: int, max_value: int, two_line: bool) -> tuple[_Op, int]:
    """One operation that keeps the stock in [0, max_value], and the new stock (``two_line``: a pack operation,
    which takes two computations, is allowed)."""
    kinds = ("add", "add", "sub", "sub", "pack_add", "pack_sub", "mul", "div")
    while True:
        kind = rng.choice(kinds if two_line else kinds[:4] + kinds[6:])
        if kind == "add" and cur + 2 <= max_value:
            x = rng.randint(2, min(30, max_value - cur))
            return _Op(kind, x), cur + x
        if kind == "sub" and cur >= 3:
            x = rng.randint(1, min(30, cur - 1))
            return _Op(kind, x), cur - x
        if kind == "pack_add":
            x, y = rng.randint(2, 6), rng.randint(2, 9)
            if cur + x * y <= max_value:
                return _Op(kind, x, y), cur + x * y
        if kind == "pack_sub":
            x, y = rng.randint(2, 6), rng.randint(2, 9)
            if x * y < cur:
                return _Op(kind, x, y), cur - x * y
        if kind == "mul" and 2 <= cur and cur * 2 <= max_value:
            x = rng.randint(2, min(4, max_value // cur))
            return _Op(kind, x), cur * x
        if kind == "div":
            ks = [k for k in range(2, 7) if cur % k == 0 and cur // k >= 2]
            if ks:
                x = rng.choice(ks)
                return _Op(kind, x), cur // x


def _lines(ops: list[_Op], start: int, rng_wording: list[int]) -> list[str]:
    """The gold trace lines for ``ops`` from ``start`` (``rng_wording[k]``: the wording of op k, for labels)."""
    out, cur = [], start
    for op, w in zip(ops, rng_wording):
        form = WORDING[op.kind][w]
        if op.kind in ("pack_add", "pack_sub"):
            n = op.x * op.y
            new = cur + n if op.kind == "pack_add" else cur - n
            out += [f"{form[1]}: {op.x}*{op.y}={n}", f"{form[2]} {n}: {cur}{'+' if op.kind == 'pack_add' else '-'}{n}={new}"]
        else:
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op.kind]
            new = {"add": cur + op.x, "sub": cur - op.x, "mul": cur * op.x, "div": cur // max(1, op.x)}[op.kind]
            out.append(f"{form[1].format(x=op.x)}: {cur}{sym}{op.x}={new}")
        cur = new
    return out


def _one(split: str, seed: int, i: int, opts: dict) -> Problem | None:
    """Problem ``i`` of the (split, seed) stream, or None when its skeleton belongs to the other split."""
    rng = question_rng(TASK_NAME, split, seed, i)
    start = rng.randint(2, opts["max_start"])
    n_ops = rng.randint(opts["min_ops"], opts["max_ops"])
    ops, cur, done = [], start, 0
    while done < n_ops:
        op, cur = _pick_op(rng, cur, opts["max_value"], two_line=n_ops - done >= 2)
        ops.append(op)
        done += 2 if op.kind.startswith("pack") else 1
    skeleton = f"{start}|" + "|".join(f"{o.kind}:{o.x}:{o.y}" for o in ops)
    if _split_of(skeleton) != split:
        return None
    a, b = rng.sample(NAMES, 2)
    item, other = rng.sample(ITEMS, 2)
    wording = [rng.randrange(len(WORDING[o.kind])) for o in ops]
    sentences = [f"{a} has {start} {item}."]
    for o, w in zip(ops, wording):
        sentences.append(WORDING[o.kind][w][0].format(a=a, b=b, i=item, x=o.x, y=o.y))
    n_dis = rng.randint(0, opts["distractors"])
    for _ in range(n_dis):
        pos = rng.randint(1, len(sentences))
        text = rng.choice(DISTRACTORS).format(a=a, b=b, j=other, x=rng.randint(2, 40))
        sentences.insert(pos, text)
    sentences.append(f"How many {item} does {a} have now?")
    lines = _lines(ops, start, wording)
    return Problem(id=f"{TASK_NAME}-{split}-s{seed}-{i}", prompt=" ".join(sentences), answer=str(cur),
                   meta={"n_ops": n_ops, "n_lines": len(lines), "distractors": n_dis, "skeleton": skeleton,
                         "trace": "\n".join(lines), "source": f"capo:{TASK_NAME}"})


def word_problems(split: str, n: int, seed: int = 0, options: dict | None = None) -> list[Problem]:
    """``n`` problems of ``split`` ("train" or "eval"), reproducible for a given ``seed`` and ``options``.

    Train and eval are disjoint by skeleton (see the module docstring); eval problems are unique within a call.
    ``meta``: ``n_ops`` (computations), ``n_lines`` (trace lines), ``distractors``, ``skeleton``, ``trace`` (the gold trace)."""
    check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    opts = check_options(options)
    out: list[Problem] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        if i > 100 * n + 1000:
            raise RuntimeError(f"could not generate {n} unique {split} problems with options {opts}")
        p = _one(split, seed, i, opts)
        i += 1
        if p is None or (split == "eval" and p.meta["skeleton"] in seen):
            continue
        seen.add(p.meta["skeleton"])
        out.append(p)
    return out


def format_prompt(problem: Problem) -> str:
    """The raw text the model sees after BOS: the problem text and a newline (no chat template)."""
    return f"{problem.prompt}\n"


def format_response(problem: Problem, confidence: str) -> str:
    """The gold target: the trace, one computation per line, then the answer and confidence tags."""
    return f"{problem.meta['trace']}\n{ANSWER_OPEN}{problem.answer}{ANSWER_CLOSE}{CONF_OPEN}{confidence}{CONF_CLOSE}"


_LINE = re.compile(r"^(?P<label>[^:\n]*):\s*(?P<a>-?\d+)\s*(?P<op>[-+*/])\s*(?P<b>-?\d+)\s*=\s*(?P<c>-?\d+)\s*$")


@dataclass(frozen=True)
class TraceCheck:
    """Where a response's trace first departs from sound reasoning (a diagnostic, not the reward).

    ``kind``: ``"ok"`` (every line well formed, arithmetic right, and the gold trace's lines in order),
    ``"arithmetic"`` (a line whose result is wrong for its own operands), ``"operands"`` (arithmetic right but the
    line is not the gold line: a wrong number picked up, a step skipped or invented), ``"malformed"`` (a line that
    is not ``label: a op b = c``), ``"length"`` (fewer or more lines than the gold trace). ``line``: 0-based index
    of the first departure (None when ok)."""

    kind: str
    line: int | None


def check_trace(text: str, problem: Problem) -> TraceCheck:
    """Compare the trace part of ``text`` (before ``<answer>``) with ``problem``'s gold trace, line by line."""
    body = text.split(ANSWER_OPEN, 1)[0].strip("\n")
    got = [ln for ln in body.split("\n") if ln.strip()]
    gold = problem.meta["trace"].split("\n")
    for k, ln in enumerate(got):
        m = _LINE.match(ln)
        if m is None:
            return TraceCheck("malformed", k)
        a, b, c = int(m["a"]), int(m["b"]), int(m["c"])
        right = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b and a % b == 0 else None}[m["op"]]
        if right != c:
            return TraceCheck("arithmetic", k)
        if k >= len(gold) or ln.split(":", 1)[1].replace(" ", "") != gold[k].split(":", 1)[1].replace(" ", ""):
            return TraceCheck("operands" if k < len(gold) else "length", k)
    if len(got) != len(gold):
        return TraceCheck("length", len(got))
    return TraceCheck("ok", None)


# -------------------------------------------------------------------------------------------------- base model

# The shipped model's architecture and warm-up (docs/model-builds.md, "The reasoning testbed"): a Qwen2-shaped network
# trained from scratch with the default's character tokenizer, exported in the Llama layout like the default.
ARCH: dict[str, int] = {"hidden": 256, "layers": 6, "heads": 4, "intermediate": 768, "max_positions": 768}
WARMUP: dict[str, float] = {"steps": 1000, "batch_size": 32, "lr": 1.5e-3, "warmup_steps": 100}


def _respond(p: Problem, rng: random.Random) -> str:
    from capo.tasks.model_builder import CONFIDENCE_GRID

    return format_response(p, rng.choice(CONFIDENCE_GRID))


def build_word_model(out_dir, seed: int = 0, *, steps: int | None = None, batch_size: int | None = None,
                     lr: float | None = None, log_every: int = 50, log=None, on_step=None, resume=None,
                     save_every: int = 0) -> dict:
    """Pre-train the reasoning testbed's base model from scratch on ``word_problems`` train traces and save it (fp32
    safetensors + tokenizer) to ``out_dir`` (:func:`capo.tasks.model_builder.build_model` with this task's
    settings). Deterministic on CPU for a fixed seed and thread count; a run of k steps equals the first k steps of
    a longer one (constant learning rate after warm-up). The confidence in the targets is uniform over
    {0.0, ..., 1.0}, independent of correctness. Returns the build record (also written to
    ``out_dir/capo_default.json``), with the loss curve every ``log_every`` steps. ``on_step(step, model)``: called
    after each step (checkpoints, measurements); ``resume``/``save_every``: a state file written every
    ``save_every`` steps and continued from when it exists (a killed build resumes exactly)."""
    import time

    import torch

    from capo.tasks import model_builder as mb

    steps = int(steps or WARMUP["steps"])
    batch_size = int(batch_size or WARMUP["batch_size"])
    lr = float(lr or WARMUP["lr"])
    t0 = time.perf_counter()
    hooks = mb.WarmupHooks(log=log, log_every=log_every, on_step=on_step, resume=resume, save_every=save_every)
    recipe = mb.ModelRecipe(problems=lambda n: word_problems("train", n, seed=seed), respond=_respond,
                            prompt=format_prompt, steps=steps, batch_size=batch_size, lr=lr,
                            warmup_steps=int(WARMUP["warmup_steps"]), seed=seed, arch=mb.Architecture(**ARCH),
                            hooks=hooks)
    built = mb.build_model(recipe, out_dir)
    stats = _build_record(built.losses, log_every, seed=seed, steps=steps, batch_size=batch_size, lr=lr,
                         vocab=len(built.tokenizer), params=built.params)
    stats |= {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "train_seconds": round(time.perf_counter() - t0, 1)}
    mb.write_record(out_dir, stats)
    return stats


def _build_record(losses: list[float], every: int, *, seed: int, steps: int, batch_size: int, lr: float, vocab: int,
                 params: int) -> dict:
    """The head of a word-problem build record: the settings, the architecture and the loss curve (the mean loss
    of each ``every`` steps; ``final_loss`` its last point)."""
    curve = [round(sum(losses[k:k + every]) / len(losses[k:k + every]), 4) for k in range(0, len(losses), every)]
    return {
        "task": f"capo:{TASK_NAME}", "options": DEFAULT_OPTIONS, "seed": seed, "steps": steps,
        "batch_size": batch_size, "lr": lr, "warmup_steps": int(WARMUP["warmup_steps"]),
        "architecture": {"type": "llama (trained as qwen2, exported)", **ARCH, "vocab": vocab},
        "params": params, "loss_every": every, "loss_curve": curve, "final_loss": curve[-1],
    }

"""Training/eval problems and prompt rendering for the trainer."""

from __future__ import annotations

from capo.errors import ConfigError
from capo.tasks.problem import Problem

SYSTEM_BOXED = ("Solve the problem step by step. Put your final answer within \\boxed{}.")
SYSTEM_RLCR = ("Solve the problem step by step inside <think></think>. Then give the final answer as "
               "<answer>...</answer>, analyse how likely it is to be right inside <analysis></analysis>, and give "
               "your confidence that it is correct as a number between 0 and 1 in <confidence></confidence>.")


def load_problems(data, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out eval) problems for a DataConfig; the two sets are disjoint."""
    if data.dataset == "default":
        from capo.tasks.default import default_problems

        return default_problems("train", data.n_train, seed=seed), default_problems("eval", data.n_eval, seed=0)
    from capo.tasks import datasets

    kw = dict(prompt_field=data.prompt_field, answer_field=data.answer_field)
    builtin = datasets.BUILTIN_DATASETS.get(data.dataset)
    if builtin is not None and "train" in builtin["local"]:
        train = datasets.load_problems(data.dataset, split="train", limit=data.n_train, **kw)
        held = datasets.load_problems(data.dataset, split="test", limit=data.n_eval, **kw)
        return train, held
    # one split only (MATH-500, a user file): the first n_eval problems are held out, the rest are trained on
    if builtin is None:
        kw["answer_format"] = data.gold_format
    rows = datasets.load_problems(data.dataset, split="test", **kw)
    if len(rows) <= data.n_eval:
        raise ConfigError(f"data.dataset={data.dataset!r} has {len(rows)} problems: not enough for data.n_eval="
                          f"{data.n_eval} held-out problems plus training problems")
    return rows[data.n_eval:data.n_eval + data.n_train], rows[:data.n_eval]


def render_prompts(problems: list[Problem], tokenizer, data, *, use_chat_template: bool) -> list[str]:
    """Prompt strings for generation: the embedded task's raw format, or the chat template with a system message."""
    if data.dataset == "default":
        from capo.tasks.default import format_prompt

        return [format_prompt(p) for p in problems]
    system = data.system_prompt
    if system is None:
        system = SYSTEM_RLCR if data.answer_format == "rlcr" else SYSTEM_BOXED
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                               {"role": "user", "content": p.prompt}],
                                              tokenize=False, add_generation_prompt=True) for p in problems]
    return [f"{system}\n\n{p.prompt}\n" for p in problems]

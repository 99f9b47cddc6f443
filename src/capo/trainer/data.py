"""Training/eval problems and prompt rendering for the trainer."""

from __future__ import annotations

from capo.errors import ConfigError
from capo.tasks.problem import Problem
from capo.tasks.prompts import default_system, render_problem

def load_problems(data, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out eval) problems for a DataConfig; the two sets are disjoint."""
    from capo.tasks import datasets

    if data.dataset in datasets.GENERATED_TASKS:
        from capo.tasks.generated import generated_task

        task, opts = generated_task(data.dataset), data.task_options
        return (task.problems("train", data.n_train, seed=seed, options=opts),
                task.problems("eval", data.n_eval, seed=0, options=opts))

    kw = dict(prompt_field=data.prompt_field, answer_field=data.answer_field)
    if not datasets.held_out_by_position(data.dataset):
        train = datasets.load_problems(data.dataset, split="train", limit=data.n_train, **kw)
        held = datasets.load_problems(data.dataset, split="test", limit=data.n_eval, **kw)
        return train, held
    # one split only (MATH-500, a user file): the first n_eval problems are held out, the rest are trained on
    if data.dataset not in datasets.BUILTIN_DATASETS:
        kw["answer_format"] = data.gold_format
    rows = datasets.load_problems(data.dataset, split="test", **kw)
    if len(rows) <= data.n_eval:
        raise ConfigError(f"data.dataset={data.dataset!r} has {len(rows)} problems: not enough for data.n_eval="
                          f"{data.n_eval} held-out problems plus training problems")
    return rows[data.n_eval:data.n_eval + data.n_train], rows[:data.n_eval]


def render_prompts(problems: list[Problem], tokenizer, data, *, use_chat_template: bool) -> list[str]:
    """Prompt strings for generation (the same rendering ``capo eval`` uses)."""
    system = data.system_prompt if data.system_prompt is not None else default_system(data.answer_format)
    return [render_problem(tokenizer, p, dataset=data.dataset, chat_template=use_chat_template, system=system,
                           response_prefix=data.response_prefix) for p in problems]

"""The tasks capo generates in code, each with the model shipped for it: the one list every caller reads
(datasets, the trainer's data and config, the builtin model specs, ``capo build-default``, ``capo demo``).

Each task gives its problems for a split ("train" / "eval", disjoint by construction), the raw prompt its model was
trained on, the validation of its ``data.task_options``, the folder of its shipped model and the response budget
that model needs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capo.errors import ConfigError
from capo.tasks.problem import Problem

__all__ = ["GeneratedTask", "GENERATED_TASKS", "generated_task"]


@dataclass(frozen=True)
class GeneratedTask:
    """A task generated in code. ``problems(split, n, seed, options)``; ``prompt(problem)``: the raw text after BOS;
    ``check_options(options) -> dict`` (ConfigError on a bad key or value); ``model_dir``: the shipped model;
    ``max_new_tokens``: a response budget the shipped model fits in; ``summary``: one line for ``--help``;
    ``answer_format``: the one answer format its responses are graded with, when the task needs one."""

    name: str
    summary: str
    max_new_tokens: int
    module: str  # the task's module: its problems function, format_prompt and check_options
    problems_fn: str
    model_folder: str  # under capo/assets
    answer_format: str | None = None  # the answer format its responses need (None: any; capo eval's default)

    def _mod(self):
        import importlib

        return importlib.import_module(self.module)

    def problems(self, split: str, n: int, seed: int = 0, options: dict | None = None) -> list[Problem]:
        return getattr(self._mod(), self.problems_fn)(split, n, seed=seed, options=options)

    def prompt(self, problem: Problem) -> str:
        return self._mod().format_prompt(problem)

    def check_options(self, options: dict | None) -> dict:
        return self._mod().check_options(options)

    @property
    def model_dir(self) -> Path:
        from importlib import resources

        return Path(str(resources.files("capo") / "assets" / self.model_folder))


_TASKS = (
    GeneratedTask("default", "chain sums of 2-5 one-digit numbers, ~10-token traces (the embedded default)", 64,
                  "capo.tasks.default", "default_problems", "default_model"),
    GeneratedTask("coin_sum", "chain sums with a hidden coin (the calibration-collapse testbed)", 64,
                  "capo.tasks.coin_sum", "coin_problems", "coin_sum_model"),
    GeneratedTask("word_problems", "multi-step word problems with step-by-step traces (the reasoning testbed)", 192,
                  "capo.tasks.word_problems", "word_problems", "word_problems_model"),
    GeneratedTask("stochastic", "stated probabilities (01-99) of fixed coin-flip outcomes whose rate is set by a "
                  "category (arXiv 2508.11800's setting; the positive control)", 4,
                  "capo.tasks.stochastic", "stochastic_problems", "stochastic_model", answer_format="percent"),
    GeneratedTask("stochastic_binary", "the stochastic task's questions as a prediction of the outcome (0/1) and a "
                  "stated confidence 01-99 that it is right, 'D NN' (where CAPO and RLCR apply)", 6,
                  "capo.tasks.stochastic", "binary_problems", "stochastic_binary_model", answer_format="outcome"),
)
GENERATED_TASKS: dict[str, GeneratedTask] = {t.name: t for t in _TASKS}


def generated_task(name: str) -> GeneratedTask:
    """The generated task ``name``; ConfigError naming the allowed names."""
    try:
        return GENERATED_TASKS[name]
    except KeyError:
        raise ConfigError(f"unknown generated task {name!r}; allowed values: {', '.join(GENERATED_TASKS)}") from None

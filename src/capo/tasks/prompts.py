"""The text a model is prompted with: one function for training and evaluation, so both see the same prompts."""

from __future__ import annotations

from capo.tasks.problem import Problem

SYSTEM_BOXED = "Solve the problem step by step. Put your final answer within \\boxed{}."
SYSTEM_RLCR = ("Solve the problem step by step inside <think></think>. Then give the final answer as "
               "<answer>...</answer>, analyse how likely it is to be right inside <analysis></analysis>, and give "
               "your confidence that it is correct as a number between 0 and 1 in <confidence></confidence>.")


SYSTEM_RLCR_SHORT = ("Answer the question inside <answer></answer>, then give your confidence that the answer is "
                     "correct, a number between 0 and 1, inside <confidence></confidence>.")


def default_system(answer_format: str) -> str | None:
    """The built-in system message for an answer format: RLCR's tags (``rlcr``; ``rlcr_short``: around a short
    answer), none for ``short`` (the chat template's own: the facts pilot's choice, docs/results/real-model.md), else
    ``\\boxed{}``."""
    return {"rlcr": SYSTEM_RLCR, "rlcr_short": SYSTEM_RLCR_SHORT, "short": None}.get(answer_format, SYSTEM_BOXED)


def _bos(tokenizer) -> str:
    return getattr(tokenizer, "bos_token", None) or ""


def render_prompt(tokenizer, prompt: str, *, chat_template: bool = True, system: str | None = SYSTEM_BOXED) -> str:
    """The chat template (system + user turn, generation prompt) when the tokenizer has one and ``chat_template`` is
    on; otherwise the tokenizer's BOS token (if it has one), ``system`` and the prompt as plain text.

    The result is complete: tokenize it with ``add_special_tokens=False`` (chat templates write their own special
    tokens, and the plain form carries its BOS), so training and evaluation see identical token ids.
    """
    if chat_template and getattr(tokenizer, "chat_template", None):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return _bos(tokenizer) + (f"{system}\n\n{prompt}\n" if system else f"{prompt}\n")


def render_problem(tokenizer, problem: Problem, *, dataset: str, chat_template: bool = True,
                   system: str | None = SYSTEM_BOXED, response_prefix: str = "") -> str:
    """The prompt for ``problem`` of ``dataset``: a task generated in code (:mod:`capo.tasks.generated`) uses the raw
    format its model was trained on (``"7-1-3="``, no system text, no template); every other dataset goes through
    :func:`render_prompt`, followed by ``response_prefix``: the start of the model's turn, written for it (a prefill
    such as ``"<answer>"``); the response is graded as ``response_prefix`` + what the model wrote
    (:func:`with_prefix`)."""
    from capo.tasks.datasets import GENERATED_TASKS

    check_response_prefix(dataset, response_prefix)
    if dataset in GENERATED_TASKS:
        from capo.tasks.generated import generated_task

        return _bos(tokenizer) + generated_task(dataset).prompt(problem)
    return render_prompt(tokenizer, problem.prompt, chat_template=chat_template, system=system) + response_prefix


def check_response_prefix(dataset: str, response_prefix: str) -> None:
    """The one rule for a response prefix: a string, and none for a task generated in code (its model reads its own
    raw prompt format). Raises ValueError naming the problem."""
    from capo.tasks.datasets import GENERATED_TASKS

    if not isinstance(response_prefix, str):
        raise ValueError(f"the response prefix must be a string, got {response_prefix!r}")
    if response_prefix and dataset in GENERATED_TASKS:
        raise ValueError(f"a response prefix is for prompted datasets; the task {dataset!r} is generated in code and "
                         f"its model reads its own raw prompt format (got {response_prefix!r})")


def with_prefix(response_prefix: str, texts: list[str]) -> list[str]:
    """The responses as the grader and the records see them: ``response_prefix`` (written into the prompt for the
    model, :func:`render_problem`) followed by what the model wrote."""
    return [response_prefix + t for t in texts] if response_prefix else list(texts)


def check_context(model, attention_mask, max_new_tokens: int, prompts: list[str]) -> None:
    """Refuse prompts that cannot fit: prompt tokens + ``max_new_tokens`` beyond the model's context window.

    ``attention_mask``: [P, L] of the tokenized prompts. Raises :class:`capo.errors.DataError` naming the first
    offending prompt, its length and the limit (rather than failing deep inside the model or silently truncating).
    """
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        return
    lengths = attention_mask.sum(-1).tolist()
    for i, n in enumerate(lengths):
        if n + max_new_tokens > limit:
            from capo.errors import DataError

            head = prompts[i][:60].replace("\n", " ")
            if n >= limit:  # no number of new tokens helps
                raise DataError(f"prompt {i} ({head!r}...) has {n} tokens, as many as the model's context of {limit} "
                                "positions or more, before any response: shorten or drop the prompt, or use a model "
                                "with a longer context (is this the task the model was made for?)")
            raise DataError(f"prompt {i} ({head!r}...) has {n} tokens; with max_new_tokens={max_new_tokens} it "
                            f"exceeds the model's context of {limit} positions: shorten or drop the prompt, or lower "
                            "max_new_tokens")

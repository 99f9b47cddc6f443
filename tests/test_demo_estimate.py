"""`capo demo`'s time estimate: scaled by the speed probe (injected here, never timed), says when the machine is
shared, and re-estimates after the first run without scaling the final evaluations by its start-up costs."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from capo.cli import demo_cmd
from capo.cli.demo_cmd import PROBE_REFERENCE_S, SECONDS_ESTIMATE, DemoPlan, estimate_line, remaining_after_first


def _minutes(line: str) -> int:
    return int(re.search(r"~(\d+) min", line).group(1))


def test_the_estimate_scales_with_the_probe():
    plan = DemoPlan("default", runs=3, steps=60, evals_per_run=3)
    per_step, per_eval = SECONDS_ESTIMATE["default"]
    reference = 3 * (60 * per_step + 3 * per_eval) + 4 * per_eval  # 3 runs with their evaluations, 4 final ones
    assert _minutes(estimate_line(plan, PROBE_REFERENCE_S, 0.5, 2)) == round(reference / 60)
    assert _minutes(estimate_line(plan, 7 * PROBE_REFERENCE_S, 0.5, 2)) == round(7 * reference / 60)
    assert "(7.0x)" in estimate_line(plan, 7 * PROBE_REFERENCE_S, 0.5, 2)


@pytest.mark.parametrize("load,cores,shared", [(0.5, 2, False), (2.0, 2, False), (3.9, 2, True), (None, 2, False),
                                               (9.0, 16, False)])
def test_a_shared_machine_is_named(load, cores, shared):
    line = estimate_line(DemoPlan("default", 1, 10, 1), PROBE_REFERENCE_S, load, cores)
    assert ("machine is shared" in line) == shared
    if shared:
        assert f"load average {load:.1f} on {cores} cores" in line


def test_the_re_estimate_scales_the_final_evaluations_by_the_probe_not_the_first_run():
    """A small demo: 3 runs of 4 steps; the first took 100 s (start-up, periodic evaluations) where the reference
    says 4 x 2 s + 2 x 30 s. Left: 2 more runs of 100 s and 4 final evaluations at the probe's speed (1.5x) --
    not scaled by 100 / 8 as the first run's s/step would."""
    plan = DemoPlan("default", runs=3, steps=4, evals_per_run=2)
    left = remaining_after_first(plan, 100.0, 1.5 * PROBE_REFERENCE_S)
    assert left == pytest.approx(2 * 100 + 4 * 30 * 1.5)


def test_train_all_prints_the_probed_estimate(monkeypatch, capsys):
    import capo.trainer.loop as loop

    monkeypatch.setattr(loop, "Trainer", lambda cfg: SimpleNamespace(train=lambda: None))
    cfg = SimpleNamespace(run=SimpleNamespace(steps=50, eval_every=20, out_dir="o"),
                          rollout=SimpleNamespace(prompts_per_step=8, group_size=8))
    args = SimpleNamespace(task="default", eval_problems=100, eval_k=8, out="runs/demo")
    cfgs = {("grpo", 0): cfg, ("capo", 0): cfg}
    demo_cmd._train_all(cfgs, args, probe=lambda: 4 * PROBE_REFERENCE_S,
                        machine=lambda: (5.0, 2))
    out = capsys.readouterr().out
    plan = DemoPlan("default", runs=2, steps=50, evals_per_run=3)  # at steps 20, 40 and the last, 50
    assert f"~{round(4 * sum(plan.reference_seconds()) / 60)} min" in out
    assert "this machine is shared (load average 5.0 on 2 cores)" in out


def test_the_final_evaluations_scale_with_their_size():
    """--eval-problems 16 --eval-k 4 is 1/12.5 of the default budget's 100 x 8 responses."""
    per_eval = SECONDS_ESTIMATE["default"][1]
    full = DemoPlan("default", runs=2, steps=4, evals_per_run=1).reference_seconds()[1]
    small = DemoPlan("default", runs=2, steps=4, evals_per_run=1, responses=64).reference_seconds()[1]
    assert full == pytest.approx(3 * per_eval) and small == pytest.approx(3 * per_eval * 64 / 800)

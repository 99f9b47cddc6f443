"""`capo demo --task facts`: its budget, bf16 autocast only where the CPU has bf16 kernels, and its held-out
evaluation rendering the prompts as training did (chat template, the answer format's system prompt)."""

import pytest

from capo.cli import demo_cmd


def _cfgs(tmp_path, monkeypatch, has_bf16, extra=None):
    monkeypatch.setattr("capo.rollout.models.cpu_has_bf16", lambda: has_bf16)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    budget = demo_cmd.DEMO_BUDGET["facts"]
    return demo_cmd._configs(["grpo", "capo"], [0], {**dict(budget.sets), **(extra or {})}, tmp_path, budget.steps,
                             "facts")


def test_facts_demo_budget_and_autocast_on_a_bf16_cpu(tmp_path, monkeypatch, capsys):
    cfgs = _cfgs(tmp_path, monkeypatch, True)
    assert set(cfgs) == {("grpo", 0), ("capo", 0)}
    c = cfgs[("capo", 0)]
    assert c.run.steps == 30 and c.model.path == "smollm2" and c.data.dataset == "facts"
    assert c.model.autocast_bf16 is True and c.algo.mask_calib_prompts == 16
    assert "no bf16 kernels" not in capsys.readouterr().out


def test_facts_demo_trains_in_fp32_on_an_avx2_cpu_unless_told(tmp_path, monkeypatch, capsys):
    cfgs = _cfgs(tmp_path, monkeypatch, False)
    assert all(c.model.autocast_bf16 is False for c in cfgs.values())
    assert "no bf16 kernels (AVX2 only): training in fp32" in capsys.readouterr().out
    cfgs = _cfgs(tmp_path, monkeypatch, False, {"model.autocast_bf16": "true"})
    assert all(c.model.autocast_bf16 is True for c in cfgs.values())


def test_demo_evaluation_renders_prompts_as_training(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("capo.evaluation.run.run_eval", lambda s, out, progress: seen.append(s) or {"n": 1.0})
    cfgs = _cfgs(tmp_path, monkeypatch, True)
    args = type("A", (), {"eval_problems": 150, "eval_k": 4, "out": str(tmp_path)})()
    demo_cmd._evaluate_all(cfgs, args)
    assert len(seen) == 3  # base, grpo, capo
    assert all(s.chat_template is True and s.system_prompt is None and s.answer_format == "short" for s in seen)
    assert seen[0].model == "smollm2" and seen[0].limit == 150 and seen[0].k == 4


@pytest.mark.parametrize("task", demo_cmd.DEMO_TASKS)
def test_every_demo_task_has_its_tables(task):
    assert task in demo_cmd.SECONDS_ESTIMATE and task in demo_cmd.DEMO_ALGOS and task in demo_cmd.DEMO_BUDGET

"""The trainer's periodic evaluation and `capo eval` are one measurement: on the same draw they agree exactly.

They differ only in how they seed and batch the sampler (`Trainer.evaluate`: one call, seed run.seed + 10007;
`capo eval`: batches, seed * 1000003 + batch index), so two readings of the same model differ by sampling noise
alone (`scripts/eval_paths.py` measures that noise; docs/results/reasoning-testbed.md, "Powered comparison on the
reasoning testbed")."""

import pytest

import capo.evaluation.run as eval_run
from capo.evaluation.run import EvalSettings, run_eval
from capo.trainer.config import load_config
from capo.trainer.loop import Trainer


def test_trainer_evaluation_equals_capo_eval_on_the_same_draw(tmp_path, monkeypatch):
    cfg = load_config("default", {"data.n_eval": 12, "run.eval_samples": 4, "run.seed": 3, "run.progress": False,
                                  "run.out_dir": str(tmp_path / "run")})
    m = Trainer(cfg).evaluate()
    assert 0 < m["eval/accuracy"] < 1 and m["eval/auc_mean_groups"] >= 3  # a draw with mixed groups to rank
    sample = eval_run._sample
    seeds = []

    def the_trainers_seed(engine, texts, s, *, seed):
        seeds.append(seed)
        return sample(engine, texts, s, seed=cfg.run.seed + 10_007)

    monkeypatch.setattr(eval_run, "_sample", the_trainers_seed)
    s = EvalSettings(model=cfg.model.path, dataset=cfg.data.dataset, split="test", limit=12, k=4, batch_size=48,
                     temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=0,
                     chat_template=False, system_prompt="", answer_format=cfg.data.answer_format, n_boot=0,
                     token_stats=False, autocast="off")
    e = run_eval(s, tmp_path / "eval", progress=False)
    assert len(seeds) == 1  # the 12 prompts x 4 samples in one call, as the trainer samples them
    for key in ("accuracy", "auc_mean", "auc_mean_groups", "auroc", "ece", "brier", "mean_confidence"):
        assert e[key] == pytest.approx(m[f"eval/{key}"], abs=1e-6), key

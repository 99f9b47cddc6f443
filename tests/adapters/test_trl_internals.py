"""Guard: the TRL internals capo.adapters.trl relies on still exist in the installed TRL.

If this fails after a TRL upgrade, the message names what changed; fix capo/adapters/trl.py (and the pin in
pyproject.toml) before trusting CapoGRPOTrainer's advantages.
"""

from __future__ import annotations

import inspect

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")


def _src(fn) -> str:
    return inspect.getsource(fn)


def test_trl_version_is_the_pinned_minor():
    assert trl.__version__.startswith("1.16."), (
        f"capo.adapters.trl was written against TRL 1.16.x, installed is {trl.__version__}: re-check the internals "
        "listed in capo.adapters.trl.TRL_INTERNALS and update the pin in pyproject.toml"
    )


def test_trl_internals_relied_on_exist():
    from trl import GRPOTrainer

    from capo.adapters.trl import TRL_INTERNALS

    problems = []
    for name in TRL_INTERNALS["methods"]:
        if not callable(getattr(GRPOTrainer, name, None)):
            problems.append(f"method GRPOTrainer.{name} is missing")
    init = _src(GRPOTrainer.__init__)
    for attr in TRL_INTERNALS["attributes"]:
        if f"self.{attr} =" not in init and attr not in ("accelerator",):
            problems.append(f"attribute self.{attr} is no longer set in GRPOTrainer.__init__")
    gen = _src(GRPOTrainer._generate_and_score_completions)
    for key in TRL_INTERNALS["output_keys"] + TRL_INTERNALS["optional_output_keys"]:
        if f'"{key}"' not in gen:
            problems.append(f'_generate_and_score_completions no longer writes output key "{key}"')
    for needle, what in [
        ("rewards_per_func = self._calculate_rewards(", "rewards come from self._calculate_rewards(...)"),
        ("advantages = advantages[process_slice]", "advantages are computed on the gathered batch, then sliced"),
        ("self.accelerator.process_index * len(prompts)", "the process slice is process_index * local size"),
        ("rewards.view(-1, num_generations)", "groups are contiguous rows of num_generations"),
        ("advantages / (std_rewards + 1e-4)", "TRL's GRPO eps is 1e-4"),
    ]:
        if needle not in gen:
            problems.append(f"_generate_and_score_completions changed: expected {what} (`{needle}` not found)")
    if "gather(rewards_per_func)" not in _src(GRPOTrainer._calculate_rewards):
        problems.append("_calculate_rewards no longer returns rewards gathered across processes")
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    if params[:6] != ["self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"]:
        problems.append(f"_get_per_token_logps_and_entropies signature changed: {params[:6]}")
    loss = _src(GRPOTrainer._compute_loss)
    if 'inputs["advantages"]' not in loss:
        problems.append('_compute_loss no longer reads inputs["advantages"]')
    for needle, what in [
        ('self._logs["advantages"].extend(', "the completions table logs self._logs['advantages'] (capo replaces them)"),
        ('use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)',
         "PEFT reference: the 'ref' adapter if present, else adapters disabled"),
        ("completion_mask * (~is_truncated)", "mask_truncated_completions zeroes a truncated row's mask"),
    ]:
        if needle not in gen:
            problems.append(f"_generate_and_score_completions changed: expected {what} (`{needle}` not found)")
    from trl.trainer import utils as trl_utils

    for fn in TRL_INTERNALS["functions"]:
        if not callable(getattr(trl_utils, fn, None)):
            problems.append(f"trl.trainer.utils.{fn} is missing")
    if "temperature" not in inspect.signature(trl_utils.add_fused_lm_head).parameters:
        problems.append("add_fused_lm_head no longer takes temperature")
    assert not problems, "TRL internals used by capo.adapters.trl changed:\n- " + "\n- ".join(problems)

"""A trained run is evaluated as it trained: one function reads the training config for `capo sweep` and
`capo demo` alike."""

from capo.evaluation.run import settings_as_trained, validate_settings
from capo.trainer.config import load_config


def test_a_run_is_evaluated_with_its_sampling_prompt_precision_and_answer_format():
    cfg = load_config("facts", {"data.system_prompt": "Be brief.", "data.response_prefix": "<answer>",
                                "data.answer_format": "rlcr_short", "rollout.temperature": 0.7,
                                "rollout.max_new_tokens": 24, "model.chat_template": False}).to_dict()
    s = settings_as_trained(cfg, model="m", limit=5, k=3, batch_size=6, seed=2)
    assert (s.model, s.dataset, s.split, s.limit, s.k, s.batch_size, s.seed) == ("m", "facts", "test", 5, 3, 6, 2)
    assert (s.temperature, s.max_new_tokens) == (0.7, 24)
    assert (s.chat_template, s.system_prompt, s.response_prefix) == (False, "Be brief.", "<answer>")
    assert (s.answer_format, s.autocast, s.n_boot, s.token_stats) == ("rlcr_short", "on", 0, False)
    validate_settings(s)
    plain = settings_as_trained(load_config("default").to_dict(), model="default", limit=None, k=2, batch_size=4)
    assert (plain.autocast, plain.response_prefix, plain.system_prompt) == ("off", "", None)

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


def test_a_file_is_read_sampled_and_held_out_as_in_training(tmp_path):
    """A file's fields and gold format and the run's top-p carry over; a dataset whose held-out problems are its
    first data.n_eval (a file, MATH-500) is evaluated on those only, never on the problems trained on."""
    import pytest

    from capo.errors import ConfigError

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"q": "{i} + 1?", "a": "#### {i + 1}"}}\n' for i in range(12)))
    cfg = load_config("default", {"data.dataset": str(data), "data.prompt_field": "q", "data.answer_field": "a",
                                  "data.gold_format": "gsm8k", "data.n_eval": 4, "data.answer_format": "last_number",
                                  "rollout.top_p": 0.9}).to_dict()
    s = settings_as_trained(cfg, model="m", limit=None, k=2, batch_size=4)
    assert (s.prompt_field, s.answer_field, s.gold_format, s.top_p) == ("q", "a", "gsm8k", 0.9)
    assert s.limit == 4  # the held-out part, not the whole file
    assert settings_as_trained(cfg, model="m", limit=3, k=2, batch_size=4).limit == 3
    with pytest.raises(ConfigError, match=r"training held out only its first data.n_eval=4"):
        settings_as_trained(cfg, model="m", limit=5, k=2, batch_size=4)
    # separate splits (GSM8K, facts, a generated task): the limit is the caller's
    assert settings_as_trained(load_config("facts").to_dict(), model="m", limit=500, k=2, batch_size=4).limit == 500


def test_a_run_trained_with_other_task_options_is_refused_before_anything_runs():
    import pytest

    from capo.errors import ConfigError

    cfg = load_config("collapse", {"data.task_options": "{coin_frac: 1.0}"}).to_dict()
    with pytest.raises(ConfigError, match=r"data.task_options=.*cannot be evaluated as it trained"):
        settings_as_trained(cfg, model="m", limit=10, k=2, batch_size=4)
    same = load_config("collapse", {"data.task_options": "{coin_frac: 0.5}"}).to_dict()  # the defaults, spelled out
    assert settings_as_trained(same, model="m", limit=10, k=2, batch_size=4).limit == 10

"""The adapters' text rewards for stated probabilities: log_score / brier_score (TRL reward classes, verl compute_score
functions, the shared ``score_texts``) on the stochastic tasks' answer formats and on RLCR's tags, with hand-computed
values; the failure default is each reward's own (the worst valid score), never RLCR's -1."""

from __future__ import annotations

import math

import pytest

from capo.adapters._common import TEXT_REWARDS, score_texts
from capo.verify import STATED_FORMATS
from capo.adapters.verl_plugin import compute_score_brier_score, compute_score_log_score, compute_score_rlcr


class _NoVerifier:
    def verify_batch(self, *a, **k):  # the stated formats never call the verifier
        raise AssertionError("verifier called")


def test_log_score_on_the_percent_format():
    b = score_texts(["37", "x", "<answer>90</answer>"], ["1", "0", "0"], kind="log_score", verifier=_NoVerifier(),
                    answer_format="percent")
    assert b.rewards == pytest.approx([math.log(0.37), math.log(0.01), math.log(0.1)], rel=1e-6)
    assert b.correct == [True, False, False] and b.format_ok == [True, False, True]
    assert b.confidence[0] == pytest.approx(0.37) and math.isnan(b.confidence[1])


def test_brier_score_on_the_outcome_format():
    """q = the stated P(correct) of 'D NN', scored against the prediction being right."""
    b = score_texts(["1 73", "0 20", "2 50"], ["1", "1", "0"], kind="brier_score", verifier=_NoVerifier(),
                    answer_format="outcome")
    assert b.correct == [True, False, False]
    assert b.rewards == pytest.approx([-(0.27 ** 2), -(0.2 ** 2), -(0.99 ** 2)], rel=1e-6)
    assert b.answers == ["1", "0", None]


def test_failure_reward_given_or_the_rewards_own():
    kw = dict(verifier=_NoVerifier(), answer_format="percent")
    assert score_texts(["bad"], ["1"], kind="log_score", format_failure_reward=-10.0, **kw).rewards == [-10.0]
    assert score_texts(["bad"], ["1"], kind="rlcr", **kw).rewards == [-1.0]  # RLCR's own default, unchanged
    assert score_texts(["bad"], ["1"], kind="brier_score", **kw).rewards == pytest.approx([-(0.99 ** 2)])


def test_log_score_reads_rlcr_tags_outside_the_stated_formats():
    from capo.verify import Verifier

    with Verifier(workers=1) as v:
        b = score_texts(["<answer>4</answer><confidence>0.8</confidence>", "<answer>5</answer><confidence>0.8</confidence>"],
                        ["4", "4"], kind="log_score", verifier=v)
    assert b.rewards == pytest.approx([math.log(0.8), math.log(0.2)], rel=1e-6)
    assert set(STATED_FORMATS) == {"percent", "outcome"} and {"log_score", "brier_score"} <= set(TEXT_REWARDS)


def test_verl_functions_hand_computed():
    r = compute_score_log_score("stochastic", "37", "1", {})
    assert r["score"] == pytest.approx(math.log(0.37)) and r["correct"] == 1.0 and r["confidence"] == pytest.approx(0.37)
    assert compute_score_log_score("stochastic", "37", "0", {})["score"] == pytest.approx(math.log(0.63))
    assert compute_score_brier_score("s", "1 73", "0", {}, answer_format="outcome")["score"] == pytest.approx(-(0.73 ** 2))
    assert compute_score_rlcr("math", "<answer>4</answer>", "4", {})["score"] == -1.0


def test_trl_reward_classes_hand_computed():
    pytest.importorskip("trl")
    from capo.adapters.trl import _REWARD_CLASSES, BrierScoreReward, LogScoreReward

    f = LogScoreReward(answer_key="answer", verifier=_NoVerifier())
    assert f(prompts=["P(A)="] * 2, completions=["37", "99"], answer=["1", "0"]) == pytest.approx(
        [math.log(0.37), math.log(0.01)], rel=1e-6)
    g = BrierScoreReward(answer_key="gold", answer_format="outcome", verifier=_NoVerifier())
    assert g(completions=["1 73"], gold=["0"]) == pytest.approx([-(0.73 ** 2)])
    assert _REWARD_CLASSES["log_score"] is LogScoreReward and f.__name__ == "log_score"


def test_verl_ppo_c_and_correctness_hand_computed():
    """PPO-C: c + w (q - 0.5) when c > threshold, else c - w (q - 0.5); correctness: 1[answer equivalent], with
    ``correct`` and ``pred`` only (mutation testing of the ``adapters.rewards`` module)."""
    from capo.adapters.verl_plugin import compute_score_correctness, compute_score_ppo_c

    right, wrong = "<answer>4</answer><confidence>0.8</confidence>", "<answer>5</answer><confidence>0.8</confidence>"
    r = compute_score_ppo_c("math", right, "4", {})
    assert r["score"] == pytest.approx(1 + 0.5 * 0.3, abs=1e-6) and r["pred"] == "4"
    assert (r["correct"], r["format_ok"]) == (1.0, 1.0) and r["confidence"] == pytest.approx(0.8)
    assert compute_score_ppo_c("math", wrong, "4", {})["score"] == pytest.approx(-0.5 * 0.3, abs=1e-6)
    assert compute_score_ppo_c("math", right, "4", {}, weight=1.0)["score"] == pytest.approx(1.3, abs=1e-6)
    assert compute_score_ppo_c("math", right, "4", {}, threshold=1.0)["score"] == pytest.approx(0.85, abs=1e-6)
    bad = compute_score_ppo_c("math", "<answer>4</answer>", "4", {})
    assert bad["score"] == -1.0 and bad["format_ok"] == 0.0 and math.isnan(bad["confidence"])
    assert compute_score_ppo_c("math", "<answer>4</answer>", "4", {}, format_failure_reward=-2.0)["score"] == -2.0

    c = compute_score_correctness("math", r"so \boxed{4}", "4", {})
    assert c == {"score": 1.0, "correct": 1.0, "pred": "4", "answer_format": "auto"}
    assert compute_score_correctness("math", r"\boxed{5}", "4", {}) == {"score": 0.0, "correct": 0.0, "pred": "5",
                                                                            "answer_format": "auto"}
    assert compute_score_correctness("math", "no answer", "4", {}) == {"score": 0.0, "correct": 0.0, "pred": "",
                                                                             "answer_format": "auto"}
    # the answer format reaches the extraction ("auto" would read the box first, and no number without a marker)
    assert compute_score_correctness("gsm8k", "\\boxed{5}\n#### 4", "4", {}, answer_format="gsm8k")["score"] == 1.0
    assert compute_score_correctness("math", "it is 4", "4", {}, answer_format="last_number")["pred"] == "4"


def test_engine_preset_fills_the_defaults_and_trl_preset_settings_by_hand():
    """``engine_preset`` returns every field, the ones a preset leaves out at their defaults; ``capo_preset`` maps
    GRPO to TRL's "grpo" loss with PPO's 0.2 / 0.2 clip and no KL, CAPO to its tau and the quantile mask, and hands
    the reward its answer column and verifier."""
    from capo.adapters._common import engine_preset

    for engine in ("trl", "verl"):
        p = engine_preset("grpo", engine)
        assert (p["group_filter"], p["overlong_cache"], p["noise_mask"]) == (False, 0, "off")
        assert (p["advantage_kwargs"], p["loss_kwargs"], p["reward_kwargs"]) == ({}, {}, {})
    pytest.importorskip("trl")
    from capo.adapters.trl import CorrectnessReward, capo_preset

    cfg, grpo, fn = capo_preset("grpo")
    assert grpo == {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.2}
    assert (cfg.advantage, cfg.advantage_kwargs, cfg.noise_mask) == ("grpo", {}, "off")
    assert isinstance(fn, CorrectnessReward) and fn.answer_key == "answer" and fn.verifier is None
    v = _NoVerifier()
    cfg, grpo, fn = capo_preset("capo", answer_key="gold", verifier=v)
    assert (cfg.advantage, cfg.advantage_kwargs, cfg.noise_mask) == ("capo", {"tau": 0.6}, "quantile")
    assert fn.answer_key == "gold" and fn.verifier is v and fn.reward_kwargs == {}


class _AllCorrect:
    def verify_batch(self, answers, golds):  # every answer judged right: shows which verifier was used
        from capo.verify import Verdict

        return [Verdict.CORRECT] * len(answers)


def test_completion_text_of_strings_messages_and_blocks():
    from capo.adapters._common import completion_text

    assert completion_text("plain") == "plain"
    msgs = [{"role": "assistant", "content": "a"}, {"role": "tool"}, "s",
            {"content": [{"type": "text", "text": "x"}, {"type": "image"}, "junk", {"text": "y"}]}]
    assert completion_text(msgs) == "asxy"  # no content: ""; a bare string as is; text blocks only
    with pytest.raises(TypeError, match=r"^a completion must be a string or a list of messages, got int"):
        completion_text(3)


def test_check_estimator_refuses_unknown_knobs_and_step_inputs():
    from capo.adapters._common import check_estimator
    from capo.errors import ConfigError

    check_estimator("capo", {"tau": 0.6}, engine="trl")
    check_estimator("grpo", None, engine="verl")
    for hp, bad in (({"bogus": 1}, "'bogus'"), ({"rewards": 1}, "'rewards'"), ({"tau": 0.6, "bogus": 1}, "'bogus'")):
        with pytest.raises(ConfigError, match=rf"^trl: advantage_kwargs: advantage estimator 'capo' has no "
                                              rf"hyperparameter {bad}; "
                                              r"allowed: tau, surrogate, norm, masked_partners, score$"):
            check_estimator("capo", hp, engine="trl")
    with pytest.raises(ConfigError, match=r"^verl: algorithm\.capo\.advantage_kwargs\.tau must be > 0, got 0"):
        check_estimator("capo", {"tau": 0}, engine="verl", key="algorithm.capo.advantage_kwargs")


def test_trl_reward_classes_pass_their_settings_on():
    pytest.importorskip("trl")
    from capo.adapters.trl import CorrectnessReward, LogScoreReward, PPOCReward
    from capo.errors import ConfigError

    f = LogScoreReward()
    assert (f.answer_key, f.answer_format) == ("answer", "percent")
    assert f.last is None  # no verdicts before the first call (the trainer reads only rewards with verdicts)
    assert LogScoreReward(format_failure_reward=-5.0, verifier=_NoVerifier())(completions=["bad"], answer=["1"]) == [-5.0]
    with pytest.raises(ConfigError, match=r"^correctness: the dataset has no column 'answer' with the gold answers; "
                                          r"columns: gold, prompt_id\. Pass answer_key=<column>\.$"):
        CorrectnessReward()(completions=["x"], gold=["1"], prompt_id=[0], trainer_state=1, log_extra=1, log_metric=1,
                            environments=1)
    assert CorrectnessReward(verifier=_AllCorrect())(completions=[r"\boxed{5}"], answer=["4"]) == [1.0]
    # correctness has no format to fail: a failure reward given to it changes nothing
    assert score_texts(["no answer"], ["4"], kind="correctness", verifier=_AllCorrect(),
                       format_failure_reward=-3.0).rewards == [1.0]
    right = "<answer>4</answer><confidence>0.8</confidence>"
    g = PPOCReward(reward_kwargs={"weight": 1.0})
    assert g(completions=[right], answer=["4"]) == pytest.approx([1.3], abs=1e-6)
    assert g.verifier is not None  # the default verifier, made on first use and kept


def test_verl_rlcr_log_and_brier_scores_and_their_verifier(monkeypatch):
    from capo.adapters.verl_plugin import compute_score_correctness, rewards

    v = rewards.get_verifier()
    assert v is rewards.get_verifier() and v.workers == 1
    right = "<answer>4</answer><confidence>0.8</confidence>"
    assert compute_score_rlcr("math", right, "4", {})["score"] == pytest.approx(1 - 0.2 ** 2, abs=1e-6)
    assert compute_score_rlcr("math", right, "5", {})["score"] == pytest.approx(-(0.8 ** 2), abs=1e-6)
    assert compute_score_rlcr("math", "no tags", "4", {}, format_failure_reward=-2.0)["score"] == -2.0
    assert compute_score_log_score("s", "bad", "1", {}, format_failure_reward=-5.0)["score"] == -5.0
    assert compute_score_brier_score("s", "bad", "1", {}, format_failure_reward=-5.0)["score"] == -5.0
    assert compute_score_brier_score("s", "37", "1", {})["score"] == pytest.approx(-(0.63 ** 2), abs=1e-6)
    r = compute_score_brier_score("s", "37", "1", {})
    assert set(r) == {"score", "correct", "pred", "answer_format", "confidence", "format_ok"} and r["format_ok"] == 1.0
    monkeypatch.setattr(rewards, "get_verifier", _AllCorrect)
    assert compute_score_correctness("math", r"\boxed{5}", "4", {})["score"] == 1.0


def test_tagged_rewards_read_the_tags_only_and_the_default_verifier_has_one_worker():
    """RLCR reads ``<answer>``: a boxed answer without tags is not read (correct 0, a format failure), and a
    confidence without an answer is a failure too (-1, not 0 - 0.8^2)."""
    from capo.adapters._common import default_verifier

    r = compute_score_rlcr("math", r"\boxed{4}", "4", {})
    assert (r["score"], r["correct"], r["format_ok"], r["pred"]) == (-1.0, 0.0, 0.0, "")
    assert compute_score_rlcr("math", "<confidence>0.8</confidence>", "4", {})["score"] == -1.0
    with default_verifier() as v:
        assert v.workers == 1


def test_a_calibration_reward_on_facts_grades_with_the_short_answer_judge():
    """A review found the adapters' rlcr / ppo_c rewards grading facts (`rlcr_short`) with math-verify: "Kiev" against
    the gold "Kyiv|Kiev" was wrong, rewarded -0.81. They now grade as `capo train` does (`capo.rollout.grade`)."""
    from capo.rollout.grading import grade
    from capo.verify import Verifier

    texts = [f"<answer>{a}</answer><confidence>0.9</confidence>" for a in ("Kiev", "kyiv", "Lviv")]
    golds = ["Kyiv|Kiev"] * 3
    with Verifier(workers=1) as v:
        want = grade(texts, golds, v, answer_format="rlcr_short").correct.tolist()
        for kind in ("rlcr", "ppo_c"):
            for fmt in ("rlcr_short", "short"):
                got = score_texts(texts, golds, kind=kind, verifier=v, answer_format=fmt)
                assert got.correct == want == [True, True, False], (kind, fmt)
        assert score_texts(texts, golds, kind="rlcr", verifier=v, answer_format="rlcr_short").rewards == \
            pytest.approx([1 - 0.01, 1 - 0.01, -0.81])
    r = compute_score_rlcr(solution_str=texts[0], ground_truth="Kyiv|Kiev", answer_format="rlcr_short")
    assert (r["correct"], r["score"]) == (1.0, pytest.approx(0.99))


def test_a_rewards_hyperparameters_are_checked_when_it_is_made():
    """As the trainer's algo.reward_kwargs: a misspelt name or a refused value fails at construction, naming it."""
    from capo.adapters.trl import PPOCReward
    from capo.errors import ConfigError

    with pytest.raises(ConfigError, match="reward 'ppo_c' has no hyperparameter 'wieght'; allowed: weight, threshold"):
        PPOCReward(reward_kwargs={"wieght": 1.0})
    with pytest.raises(ConfigError, match=r"reward_kwargs.weight must be >= 0, got -1"):
        PPOCReward(reward_kwargs={"weight": -1})


def test_a_verl_reward_function_says_which_keyword_it_ignores():
    """A misspelt knob in verl's reward_kwargs (``wieght``) was dropped without a word: it is named in a warning with
    the function's knobs, and the score is the default's. verl's own call keys pass quietly."""
    import warnings

    from capo.adapters.verl_plugin import compute_score_ppo_c

    text = "<answer>4</answer><confidence>0.9</confidence>"
    with pytest.warns(UserWarning, match=r"compute_score_ppo_c ignores wieght: not one of its knobs "
                                         r"\(format_failure_reward, weight, threshold, answer_format\)"):
        r = compute_score_ppo_c("math", text, "4", {}, wieght=0.1)
    assert r["score"] == compute_score_ppo_c("math", text, "4", {})["score"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_score_ppo_c("math", text, "4", {}, weight=0.1, reward_router_address=None, reward_model_tokenizer=None)


def test_every_core_reward_is_one_the_adapters_compute_from_text():
    """``TEXT_REWARDS`` lists the core rewards in the order the adapters offer them: the registry's rewards, each with
    a verl reward function of its name; a reward registered without one would be missing from the engines without a
    word (the list is a second copy of the registry's names, held to it here)."""
    from capo.adapters.verl_plugin import rewards as verl_rewards
    from capo.core import REWARDS

    assert sorted(TEXT_REWARDS) == REWARDS.names() and len(set(TEXT_REWARDS)) == len(TEXT_REWARDS)
    for kind in TEXT_REWARDS:
        assert callable(getattr(verl_rewards, f"compute_score_{kind}", None)), kind

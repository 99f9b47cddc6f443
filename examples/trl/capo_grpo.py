"""Any capo method (CAPO, RLCR, the GRPO family, the calibration-aware methods) with TRL's GRPOTrainer.

    pip install -e '.[trl]'                       # in capo's clone; vLLM for fast generation on GPUs: '.[vllm]'
    python examples/trl/capo_grpo.py --smoke      # offline, CPU, capo's embedded model and task, 3 steps, < 3 min
    python examples/trl/capo_grpo.py --model Qwen/Qwen2.5-Math-1.5B --algo capo
    python examples/trl/capo_grpo.py --model Qwen/Qwen2.5-Math-1.5B --algo rlcr
    accelerate launch --num_processes 8 examples/trl/capo_grpo.py --algo capo ...      # several GPUs

``--algo`` takes capo's algorithm presets by name (``capo.core.presets.ALGORITHMS``); the ones TRL cannot run
(their policy loss is not PPO-clip, or DAPO's group filter) stop with the reason. Generation uses vLLM (TRL's
colocate mode) when vLLM is installed and a CUDA GPU is present, else Hugging Face ``generate``; bf16 only where the
GPU supports it. Data: MATH training problems from the Hub (``--dataset``, columns problem/solution); with
``--smoke``, capo's embedded chain-sum task and its 0.37M model, no download. Settings follow the CAPO paper where
it states them (lr 1e-6, 8 rollouts, clip 0.2, temperature 1.0, KL 0); see docs/engines.md.
"""

from __future__ import annotations

import argparse
import importlib.util

RLCR_SYSTEM = ("Think step by step inside <think></think>, give the final answer inside <answer></answer>, analyse "
               "how likely it is correct inside <analysis></analysis>, and state that probability as a number "
               "between 0 and 1 inside <confidence></confidence>.")
BOXED = "Let's think step by step and output the final answer within \\boxed{}."


def parse(argv=None) -> argparse.Namespace:
    from capo.core.presets import ALGORITHMS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", default="capo", choices=list(ALGORITHMS), help="capo algorithm preset (default: capo)")
    p.add_argument("--model", default="Qwen/Qwen2.5-Math-1.5B", help="policy: Hub id or local folder")
    p.add_argument("--dataset", default="DigitalLearningGmbH/MATH-lighteval", help="Hub dataset (problem/solution)")
    p.add_argument("--no-mask", action="store_true", help="turn CAPO's reference-perplexity noise mask off")
    p.add_argument("--mask", action="store_true", help="apply CAPO's noise mask to any estimator (e.g. --algo grpo "
                   "--mask: the paper's GRPO + mask ablation)")
    p.add_argument("--no-vllm", action="store_true", help="generate with Hugging Face generate even if vLLM is here")
    p.add_argument("--output-dir", default="runs/trl-capo")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--smoke", action="store_true", help="offline CPU check: the embedded model and task, 3 steps")
    a = p.parse_args(argv)
    if a.mask and a.no_mask:
        p.error("--mask and --no-mask contradict each other")
    return a


def hardware(a) -> dict:
    """GRPOConfig settings that depend on the machine: bf16 and vLLM only where they work."""
    import torch

    cuda = torch.cuda.is_available()
    vllm = cuda and not a.no_vllm and not a.smoke and importlib.util.find_spec("vllm") is not None
    out = {"bf16": bool(cuda and torch.cuda.is_bf16_supported()), "use_cpu": not cuda, "use_vllm": vllm}
    if vllm:
        out |= {"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}
    return out


def data(a, reward_name: str):
    """(train dataset with "prompt" and "answer" columns, policy) for the run."""
    from datasets import Dataset

    if a.smoke:
        from capo.tasks.default import default_problems, format_prompt
        from capo.tasks.generated import generated_task

        rows = [{"prompt": format_prompt(p), "answer": p.answer} for p in default_problems("train", 64, seed=0)]
        return Dataset.from_list(rows), str(generated_task("default").model_dir)
    from datasets import load_dataset

    from capo.verify import extract_boxed

    def to_row(ex):
        if reward_name != "correctness":  # rlcr, ppo_c: the RLCR tags
            prompt = [{"role": "system", "content": RLCR_SYSTEM}, {"role": "user", "content": ex["problem"]}]
        else:
            prompt = f"{ex['problem']} {BOXED}"
        return {"prompt": prompt, "answer": extract_boxed(ex["solution"]) or ""}

    ds = load_dataset(a.dataset, split="train")
    return ds.map(to_row, remove_columns=ds.column_names).filter(lambda r: r["answer"] != ""), a.model


def grpo_config(a, preset_settings: dict):
    from trl import GRPOConfig

    run = dict(learning_rate=1e-6,              # paper
               num_generations=8,               # 8 rollouts per prompt (paper)
               per_device_train_batch_size=16,  # completions per device per micro-step (hardware knob)
               gradient_accumulation_steps=4,   # hardware knob
               max_completion_length=3072,      # not stated by the paper
               max_steps=a.max_steps, report_to="tensorboard")
    if a.smoke:  # seconds per step on a CPU: the embedded model, 4 prompts x 4 samples of 40 tokens
        run = dict(learning_rate=3e-4, num_generations=4, per_device_train_batch_size=16,
                   gradient_accumulation_steps=1, max_completion_length=40, max_steps=3, report_to="none",
                   save_strategy="no", seed=0)
    return GRPOConfig(output_dir=a.output_dir, temperature=1.0, logging_steps=1, **preset_settings, **run,
                      **hardware(a))


def main(argv=None) -> int:
    a = parse(argv)
    from capo.adapters.trl import CapoGRPOTrainer, capo_preset, leave_process_group

    capo, preset_settings, reward = capo_preset(a.algo)  # epsilon, loss_type, beta 0 from the preset
    if a.no_mask:
        capo.noise_mask = "off"
    elif a.mask and capo.noise_mask == "off":  # the preset's rule when it has one (capo: quantile), else fixed
        capo.noise_mask = "fixed"  # the mask's reference = a frozen copy of the policy (loaded by the adapter)
    ds, model = data(a, type(reward).__name__.removesuffix("Reward").lower())
    trainer = CapoGRPOTrainer(model=model, reward_funcs=reward, args=grpo_config(a, preset_settings),
                              train_dataset=ds, capo=capo)
    trainer.train()
    trainer.save_model(a.output_dir)
    if a.smoke:
        logged = [row for row in trainer.state.log_history if "loss" in row]
        keys = ("loss", "reward", "train/masked_frac", "calib/accuracy", "calib/auc_mean")
        print(f"smoke: {len(logged)} optimizer steps with {a.algo}; last step: "
              + ", ".join(f"{k}={float(logged[-1][k]):.4g}" for k in keys if k in logged[-1]))
    leave_process_group(trainer)  # on several processes: DDP freed before the process group (no teardown hang)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

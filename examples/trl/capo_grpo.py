"""CAPO (or RLCR) with TRL's GRPOTrainer through capo's adapter.

    pip install 'capo[trl]'
    python examples/trl/capo_grpo.py --model Qwen/Qwen2.5-Math-1.5B --estimator capo
    python examples/trl/capo_grpo.py --model Qwen/Qwen2.5-Math-1.5B --estimator grpo --reward rlcr
    accelerate launch --num_processes 8 examples/trl/capo_grpo.py ...      # several GPUs

Data: MATH training problems from the Hub (``--dataset``, columns problem/solution -> prompt/answer); any dataset
with a "prompt" column and a gold "answer" column works. Settings follow the CAPO paper where it states them
(lr 1e-6, 8 rollouts, clip 0.2, temperature 1.0, KL 0, entropy 0); see docs/engines.md.
"""

from __future__ import annotations

import argparse

RLCR_SYSTEM = ("Think step by step inside <think></think>, give the final answer inside <answer></answer>, analyse "
               "how likely it is correct inside <analysis></analysis>, and state that probability as a number "
               "between 0 and 1 inside <confidence></confidence>.")
BOXED = "Let's think step by step and output the final answer within \\boxed{}."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-Math-1.5B")
    p.add_argument("--dataset", default="DigitalLearningGmbH/MATH-lighteval")
    p.add_argument("--estimator", default="capo", help="capo, grpo, dr_grpo or rloo")
    p.add_argument("--tau", type=float, default=0.6)
    p.add_argument("--reward", default="correctness", choices=["correctness", "rlcr"])
    p.add_argument("--no-mask", action="store_true", help="disable CAPO's reference-perplexity noise mask (on by "
                   "default for capo only)")
    p.add_argument("--mask", action="store_true", help="apply CAPO's noise mask to any estimator (e.g. --estimator "
                   "grpo --mask: the paper's GRPO + mask ablation)")
    p.add_argument("--output-dir", default="runs/trl-capo")
    p.add_argument("--max-steps", type=int, default=600)
    a = p.parse_args()

    from datasets import load_dataset
    from trl import GRPOConfig

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer, CorrectnessReward, RLCRReward
    from capo.verify import extract_boxed

    ds = load_dataset(a.dataset, split="train")

    def to_row(ex):
        if a.reward == "rlcr":
            prompt = [{"role": "system", "content": RLCR_SYSTEM}, {"role": "user", "content": ex["problem"]}]
        else:
            prompt = f"{ex['problem']} {BOXED}"
        return {"prompt": prompt, "answer": extract_boxed(ex["solution"]) or ""}

    ds = ds.map(to_row, remove_columns=ds.column_names).filter(lambda r: r["answer"] != "")
    reward = RLCRReward(answer_key="answer") if a.reward == "rlcr" else CorrectnessReward(answer_key="answer")
    args = GRPOConfig(
        output_dir=a.output_dir,
        learning_rate=1e-6,                # paper
        num_generations=8,                 # 8 rollouts per prompt (paper)
        per_device_train_batch_size=16,    # completions per device per micro-step (hardware knob)
        gradient_accumulation_steps=4,     # hardware knob
        temperature=1.0,                   # paper
        epsilon=0.2,                       # PPO clip (paper)
        beta=0.0,                          # KL coefficient 0 (paper)
        max_completion_length=3072,        # not stated by the paper
        loss_type="dapo",                  # token-mean aggregation, as verl's default (not stated by the paper)
        max_steps=a.max_steps,
        logging_steps=1,
        bf16=True,
        report_to="tensorboard",
    )
    capo = CapoAdvantageConfig(
        estimator=a.estimator,
        estimator_kwargs={"tau": a.tau} if a.estimator == "capo" else ({"eps": 1e-4} if a.estimator == "grpo" else {}),
        noise_mask=False if a.no_mask else (True if a.mask else None),  # None: capo's default (on for capo only);
        # the mask's reference = a frozen copy of --model (loaded by the adapter)
    )
    trainer = CapoGRPOTrainer(model=a.model, reward_funcs=reward, args=args, train_dataset=ds, capo=capo)
    trainer.train()
    trainer.save_model(a.output_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

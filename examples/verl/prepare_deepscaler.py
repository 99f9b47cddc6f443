"""Write DeepScaleR (and MATH-500 for validation) as verl parquet files for the CAPO launch script.

    python examples/verl/prepare_deepscaler.py --out ~/data/capo --n-train 20000

verl's RL dataset format: one row per prompt with ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model = {"style": "rule", "ground_truth": <answer>}`` and ``extra_info``. The CAPO paper trains on 20k
DeepScaleR problems; which 20k is not stated, so this takes a seeded random subset (``--seed``).
Needs the Hugging Face Hub (``datasets.load_dataset``).
"""

from __future__ import annotations

import argparse
import os

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def _rows(ds, question_key: str, answer_key: str, source: str, split: str):
    for i, ex in enumerate(ds):
        yield {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"{ex[question_key]} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(ex[answer_key])},
            "extra_info": {"split": split, "index": i},
        }


def main() -> int:
    from datasets import Dataset, load_dataset

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder for train.parquet and test.parquet")
    p.add_argument("--n-train", type=int, default=20000, help="DeepScaleR problems to keep (paper: 20k)")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train = load_dataset("agentica-org/DeepScaleR-Preview-Dataset", split="train").shuffle(seed=a.seed)
    train = train.select(range(min(a.n_train, len(train))))
    Dataset.from_list(list(_rows(train, "problem", "answer", "deepscaler", "train"))).to_parquet(
        os.path.join(a.out, "train.parquet"))
    test = load_dataset("HuggingFaceH4/MATH-500", split="test")
    Dataset.from_list(list(_rows(test, "problem", "answer", "math500", "test"))).to_parquet(
        os.path.join(a.out, "test.parquet"))
    print(f"wrote {len(train)} train and {len(test)} test prompts to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CapoGRPOTrainer for one generation batch under `accelerate launch --multi_gpu --num_processes 2` (test_trl_paths.py).

Usage: accelerate launch --multi_gpu --num_processes 2 trl_two_process.py MODEL_DIR OUT_DIR
Each rank saves its local rows of the first generation batch and the advantages the loss received.
"""

import json
import pathlib
import sys

import torch
from _tiny import dataset, grpo_args, seven_reward  # the script's folder is on sys.path


def main():
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer, leave_process_group

    model_dir, out = sys.argv[1], pathlib.Path(sys.argv[2])
    saved = {}

    class Rec(CapoGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            o = super()._generate_and_score_completions(inputs)
            if not saved:
                b = self.capo_last_batch
                saved.update({k: o[k].detach().cpu() for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                               "completion_mask")})
                saved.update(local_adv=o["advantages"].detach().cpu(), all_adv=b["advantages"].cpu(),
                             rewards_all=b["rewards"].cpu(), rewards_local=b["rewards"][b["process_slice"]].cpu())
            return o

    args = grpo_args(out / "run", max_steps=1)
    ds = dataset(16)
    tr = Rec(model=model_dir, reward_funcs=seven_reward, args=args, train_dataset=ds,
             processing_class=AutoTokenizer.from_pretrained(model_dir),
             capo=CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9))
    tr.train()
    rank = tr.accelerator.process_index
    out.mkdir(parents=True, exist_ok=True)
    torch.save(saved, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({"world": tr.accelerator.num_processes}))
    assert leave_process_group(tr), "DDP outlived the trainer's references"


if __name__ == "__main__":
    main()

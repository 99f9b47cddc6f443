"""CapoGRPOTrainer trained for several optimizer steps, under `accelerate launch` with 1 or 2 processes
(test_trl_paths.py::test_training_on_two_processes_equals_one).

Usage: accelerate launch --num_processes P trl_train_processes.py MODEL_DIR OUT_DIR ESTIMATOR PER_DEVICE STEPS

Sampling is the one thing that cannot be the same on 1 and 2 processes (each rank draws from its own generator), so
the completions are a fixed function of the row's place in the global generation batch and of the step: rank r of
P holds global rows [r * PER_DEVICE, (r + 1) * PER_DEVICE), the rows the single process holds in the same order.
Everything after sampling -- rewards, the gathered advantages with the noise mask's thresholds, the log-probs, the
loss, DDP's gradient average, AdamW -- is TRL and capo as they run. Rank 0 saves the final parameters; every rank
saves its rows' prompts and completions and the advantages it received.
"""

import json
import pathlib
import sys

import torch
from _tiny import dataset, grpo_args  # the script's folder is on sys.path


def fixed_completion(tok, step: int, row: int) -> list[int]:
    """'<answer> d </answer> <confidence> q </confidence> <eos>' with d and q drawn from (step, row) alone."""
    g = torch.Generator().manual_seed(1000 * step + row)
    d = ["3", "4", "7", "7"][int(torch.randint(0, 4, (1,), generator=g))]
    q = ["0.1", "0.5", "0.9"][int(torch.randint(0, 3, (1,), generator=g))]
    words = ["<answer>", d, "</answer>", "<confidence>", q, "</confidence>", "<eos>"]
    return tok.convert_tokens_to_ids(words)  # ids of the word-level vocabulary (no re-tokenisation)


def main():
    import faulthandler

    # A run takes ~30 s: if it hangs, every thread's stack reaches the test's captured output before the test's
    # 600 s timeout kills it.
    faulthandler.dump_traceback_later(240)
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer, CorrectnessReward, leave_process_group
    from capo.verify import Verifier

    model_dir, out, est, per_device, steps = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:6])
    tok = AutoTokenizer.from_pretrained(model_dir)
    seen = []

    class Fixed(CapoGRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
            r = self.accelerator.process_index
            rows = [r * len(prompt_ids) + i for i in range(len(prompt_ids))]
            comps = [fixed_completion(tok, self.state.global_step, j) for j in rows]
            seen.append({"step": self.state.global_step, "rows": rows, "prompts": [list(p) for p in prompt_ids],
                         "completions": comps})
            return comps, None

        def _generate_and_score_completions(self, inputs):
            o = super()._generate_and_score_completions(inputs)
            seen[-1]["advantages"] = o["advantages"].detach().cpu().tolist()
            return o

    capo = {"capo": CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9),
            "seed_grpo": CapoAdvantageConfig(advantage="seed_grpo", advantage_kwargs={"alpha": 1.0})}[est]
    with Verifier(workers=1) as v:
        tr = Fixed(model=model_dir, reward_funcs=CorrectnessReward(verifier=v), train_dataset=dataset(32),
                   args=grpo_args(out / "run", max_steps=steps, per_device_train_batch_size=per_device),
                   processing_class=tok, capo=capo)
        tr.train()
    rank = tr.accelerator.process_index
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"world": tr.accelerator.num_processes, "batches": seen}))
    if rank == 0:
        model = tr.accelerator.unwrap_model(tr.model)
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, out / "params.pt")
    assert leave_process_group(tr), "DDP outlived the trainer's references"


if __name__ == "__main__":
    main()

"""Benchmark: the training forward + backward (``capo.rollout.logprobs.token_logprobs``, what the trainer's update
runs) under bf16 autocast with the default SDPA backends against the same with cuDNN's attention left out, and fp32.

Why: on an H200 the testbed's bf16 update was ~9x slower than its fp32 update (docs/performance.md, "The GPU check's
second run"). A candidate cause: on Hopper and newer, torch sends SDPA with an explicit padding mask (as transformers
passes) in bf16 to cuDNN's attention first, and cuDNN builds an execution plan for every new shape (reported in the
hundreds of ms a shape, forward and backward), while an RL update sees a new response length almost every step; fp32
never takes cuDNN. This benchmark gives each call a new response length, as training does, and times the variants
alternated in one process: the default backends, cuDNN excluded (``torch.nn.attention.sdpa_kernel`` with flash,
memory-efficient and math attention), and fp32. On a CPU there is no cuDNN attention: the first two read alike.

Work: the shipped word-problems model (``--model``), B x G = 16 x 8 rows, a shared 96-token prompt per group, response
lengths ``--lengths`` (round r uses each length + r, so every call of a variant meets a shape new to it), ``--rounds``
passes after a first call per variant. CPU runs use one thread.

    python benchmarks/update_attention.py                     # on a GPU (the GPU check runs this)
    python benchmarks/update_attention.py --quick             # a small CPU run (the check's dry run)

Prints ``RATIO bf16 default/no-cudnn: X`` (> 1: leaving cuDNN out is faster) and ``RATIO bf16 default/fp32: X``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

VARIANTS = ("bf16", "bf16-no-cudnn", "fp32")


def _backends(variant: str):
    """The SDPA backends a variant may use: every one, or all but cuDNN's."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if variant != "bf16-no-cudnn":
        return nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def one_update(model, batch: dict, variant: str, device: torch.device) -> float:
    """Seconds of one forward + backward of the batch's response log-probs (gradients then dropped)."""
    from capo.rollout.logprobs import token_logprobs

    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with _backends(variant):
        logp = token_logprobs(model, batch["prompt"], batch["prompt_mask"], batch["response"], batch["response_mask"],
                              autocast_bf16=variant != "fp32")
        logp.sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def make_batch(vocab: int, rows: int, group: int, prompt_len: int, length: int, device, seed: int) -> dict:
    """Random token ids: every group shares its prompt (the shared-prefix path, as in training); each row's response
    ends at a length of up to ``length`` (right padding), the longest exactly ``length``."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (rows // group, prompt_len), generator=g).repeat_interleave(group, 0)
    response = torch.randint(0, vocab, (rows, length), generator=g)
    ends = torch.randint(length // 2, length + 1, (rows,), generator=g)
    ends[0] = length
    mask = (torch.arange(length)[None, :] < ends[:, None]).long()
    return {k: v.to(device) for k, v in {"prompt": prompt, "prompt_mask": torch.ones_like(prompt),
                                         "response": response * mask, "response_mask": mask}.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="word_problems", help="a shipped model name or a model folder")
    ap.add_argument("--rows", type=int, default=128, help="responses per update (B x G)")
    ap.add_argument("--group", type=int, default=8, help="responses per prompt (G)")
    ap.add_argument("--prompt-len", type=int, default=96, help="prompt tokens")
    ap.add_argument("--lengths", type=int, nargs="+", default=[100, 104, 108, 112, 116, 120, 124, 128],
                    help="response lengths, one per call, cycled (new shapes, as an RL update sees)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the lengths per variant, after a first call")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    add_quick(ap, rows=16, lengths=[8, 12], rounds=1, prompt_len=16)
    a = ap.parse_args(argv)
    from capo.rollout.models import load_model

    torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = load_model(a.model)
    model.to(device).train()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {a.rows} rows, prompt {a.prompt_len}, lengths {a.lengths}")
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    warm = make_batch(model.config.vocab_size, a.rows, a.group, a.prompt_len, a.lengths[0] - 1, device, 0)
    first = {v: one_update(model, warm, v, device) for v in VARIANTS}  # a length no later call has
    for r in range(a.rounds):
        for i, length in enumerate(a.lengths):
            batch = make_batch(model.config.vocab_size, a.rows, a.group, a.prompt_len, length + r, device, i)
            for v in VARIANTS:  # alternated: each length is new to every variant in the first round
                times[v].append(one_update(model, batch, v, device))
    med = {v: statistics.median(t) for v, t in times.items()}
    for v in VARIANTS:
        print(f"  {v:14} first {first[v]:.3f} s, median {med[v]:.4f} s over {len(times[v])} calls")
    print(f"RATIO bf16 default/no-cudnn: {med['bf16'] / med['bf16-no-cudnn']:.2f}")
    print(f"RATIO bf16 default/fp32: {med['bf16'] / med['fp32']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

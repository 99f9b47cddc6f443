"""A tiny Qwen2 model + word-level tokenizer for the engine-adapter tests, built in code (no Hub access).

Vocabulary: special tokens, digits 0-9, a few confidences and the RLCR tags, so that a model briefly trained on
well-formed RLCR outputs samples answers that are sometimes right, sometimes wrong, with varied confidences.
"""

from __future__ import annotations

import json
import pathlib
import random
import re
import sys

import torch

if str(pathlib.Path(__file__).resolve().parents[1]) not in sys.path:  # tests/ (for scripts run from this folder)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _device import DEVICE  # noqa: E402  (cpu, or cuda when a GPU is visible / CAPO_TEST_DEVICE=cuda)

TAGS = ["<answer>", "</answer>", "<confidence>", "</confidence>"]
CONFS = ["0.1", "0.5", "0.9"]
WORDS = ["<pad>", "<eos>", "Q", ":", "="] + [str(d) for d in range(10)] + CONFS + TAGS


def build_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(path)
    return fast


def build_model(path, tokenizer, *, sft_steps: int = 60, seed: int = 0, head_dim: int = 16):
    """2-layer Qwen2 (~50k params), briefly trained on '<answer> d </answer> <confidence> q </confidence>'.
    ``head_dim`` 32 or 64 for vLLM (its CPU attention rejects 16 and 24): 2 heads, hidden size 2 * head_dim."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(WORDS), hidden_size=2 * head_dim, intermediate_size=4 * head_dim, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg)
    rng = random.Random(seed)
    texts = []
    for _ in range(64):
        q = rng.randrange(10)
        texts.append(f"Q : {q} = <answer> {rng.choice('3477')} </answer> <confidence> {rng.choice(CONFS)} "
                     f"</confidence> <eos>")
    ids = torch.tensor([tokenizer(t)["input_ids"] for t in texts])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(sft_steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(path)
    return model


def prompts(n: int = 4):
    """Dataset rows: prompt text and gold answer (the model answers 3, 4 or 7; gold 7 -> mixed groups)."""
    return [{"prompt": f"Q : {i % 10} =", "answer": "7"} for i in range(n)]


def dataset(n: int = 8):
    """:func:`prompts` as a datasets.Dataset (what TRL's trainer takes)."""
    from datasets import Dataset

    return Dataset.from_list(prompts(n))


def seven_reward(completions, **kwargs):
    """A deterministic verifiable reward independent of capo.verify: 1 if the answer tag holds a 7."""
    return [1.0 if re.search(r"<answer>\s*7\s*</answer>", c) else 0.0 for c in completions]


# TRL GRPOConfig settings of the adapter tests: the test device (tests/_device.py), fp32, G = 4 generations of 8
# tokens, 2 steps, no KL, T = 1
GRPO_ARGS = dict(use_cpu=DEVICE == "cpu", bf16=False, gradient_checkpointing=False, report_to="none",
                 per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2,
                 logging_steps=1, learning_rate=5e-3, beta=0.0, temperature=1.0, save_strategy="no", seed=0,
                 disable_dropout=True)


# Tolerance on advantages recomputed independently. CPU: 1e-6 (measured). CUDA: 1e-5, not yet measured: cuBLAS picks
# its kernels by batch shape, and TRL's chunked forwards and the tests' one-batch forward have different shapes.
TOL = 1e-6 if DEVICE == "cpu" else 1e-5


def reference_model(model_dir):
    """An independent frozen copy of the model in ``model_dir``, on the test device (where the trainer's tensors are)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval().to(DEVICE)


def cpu_copy(out: dict) -> dict:
    """``out`` (a TRL batch) with its tensors detached and on the CPU, where the tests compare."""
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def raw_token_logps(model, out, temperature=1.0):
    """Per-token log-probs of a TRL batch's completions (``out``) from a plain forward with full logits, run on the
    model's device, returned on the CPU: [n, T] float64."""
    dev = next(model.parameters()).device
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1).to(dev)
    attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1).to(dev)
    t = out["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -t - 1:-1].double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -t:, None]).squeeze(-1).cpu()


def grpo_args(output_dir, **kw):
    """A GRPOConfig with :data:`GRPO_ARGS`, ``kw`` overriding."""
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(output_dir), **{**GRPO_ARGS, **kw})


if __name__ == "__main__":  # pragma: no cover - manual check
    import tempfile

    d = tempfile.mkdtemp()
    t = build_tokenizer(d)
    m = build_model(d, t)
    x = t("Q : 3 =", return_tensors="pt")
    out = m.generate(**x, do_sample=True, max_new_tokens=8, num_return_sequences=4, pad_token_id=0)
    print(json.dumps(t.batch_decode(out[:, x["input_ids"].shape[1]:], skip_special_tokens=True), indent=1))


class VerlProto:
    """The parts of verl's DataProto the verl plugin reads (for tests that run the plugin without verl)."""

    def __init__(self, batch, non_tensor_batch):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, {"temperature": 1.0}

    def __len__(self):
        return len(next(iter(self.batch.values())))


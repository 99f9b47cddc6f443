"""The one recipe every generated task's shipped model is built with: a character tokenizer, a small Qwen2-shaped
network (or a saved model to fine-tune), a supervised warm-up on the task's gold responses, and a plain Hugging Face
folder written at the end.

Each task states its settings in a :class:`ModelRecipe` (its training problems, the warm-up target it writes for a
problem, its raw prompt, the architecture or the model it starts from, steps, batch size, learning rate, seed) and
calls :func:`build_model`; the task then writes its own build record with :func:`write_record`. The tasks' public
builders (``capo.tasks.default.build_default_model``, ``capo.tasks.coin_sum.build_coin_model``,
``capo.tasks.word_problems.build_word_model``, ``capo.tasks.stochastic.build_stochastic_model`` /
``build_binary_model``) are thin calls of it, and ``capo build-default --task NAME`` calls them.

Determinism: for a fixed seed and torch thread count a build is bit-identical on the CPU. The order of the random
draws is part of the recipe: ``torch.manual_seed(seed)``, then a ``random.Random(seed)`` for the warm-up targets,
then the network's initialisation (or the base model's loading), then the training problems, then the warm-up.

Model string (raw text, no chat template): ``<s>`` + the task's prompt + the response + ``</s>``; the four RLCR tags
(``<answer>``, ``</answer>``, ``<confidence>``, ``</confidence>``, arXiv 2507.16806) are single tokens.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capo.tasks.problem import Problem

__all__ = ["ANSWER_OPEN", "ANSWER_CLOSE", "CONF_OPEN", "CONF_CLOSE", "TAGS", "CONFIDENCE_GRID", "Architecture",
           "ModelRecipe", "BuiltModel", "WarmupHooks", "build_tokenizer", "model_config", "export_llama", "sft_batch", "warmup",
           "save_warmup_state", "load_warmup_state", "save_model", "load_model", "build_model", "write_record",
           "mean_loss"]

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
CONF_OPEN, CONF_CLOSE = "<confidence>", "</confidence>"
TAGS = (ANSWER_OPEN, ANSWER_CLOSE, CONF_OPEN, CONF_CLOSE)
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
# Confidence values the warm-up data carries: one decimal, uniform, independent of correctness.
CONFIDENCE_GRID = tuple(f"{k / 10:.1f}" for k in range(11))


# ---------------------------------------------------------------------------------------------------- tokenizer


def build_tokenizer(model_max_length: int = 256):
    """Character-level ``PreTrainedTokenizerFast``: printable ASCII + newline, the four RLCR tags as single tokens,
    ``<s>`` (BOS, added in front of every encoded text), ``</s>`` (EOS), ``<pad>``, ``<unk>``. Decoding is exact."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, EOS, UNK]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {t: i for i, t in enumerate(specials + list(TAGS) + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    tok.add_tokens(list(TAGS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


# -------------------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Architecture:
    """The size of a network trained from scratch: ``hidden`` width, ``layers``, attention ``heads`` (as many
    key/value heads), the MLP's ``intermediate`` width, ``max_positions`` (also the tokenizer's model_max_length)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int = 256

    def as_record(self) -> dict[str, int]:
        """The fields in a build record's ``architecture`` (max_positions only where the task records it)."""
        return {"hidden": self.hidden, "layers": self.layers, "heads": self.heads, "intermediate": self.intermediate,
                "max_positions": self.max_positions}


def model_config(tokenizer, hidden: int, layers: int, heads: int, intermediate: int, max_positions: int = 256):
    """The architecture trained: Qwen2 (q/k/v biases, RMSNorm, SwiGLU, RoPE), tied embeddings."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def export_llama(qwen):
    """The same network in the Llama layout (q/k/v biases kept, a zero o_proj bias added): bit-identical outputs.

    Why: transformers 5's AutoTokenizer forces ``Qwen2Tokenizer`` (byte-level BPE) on every ``qwen2`` checkpoint and
    would silently rebuild the character tokenizer (dropping spaces); for ``llama`` it loads tokenizer.json as saved.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    qc = qwen.config
    cfg = LlamaConfig(
        vocab_size=qc.vocab_size,
        hidden_size=qc.hidden_size,
        intermediate_size=qc.intermediate_size,
        num_hidden_layers=qc.num_hidden_layers,
        num_attention_heads=qc.num_attention_heads,
        num_key_value_heads=qc.num_key_value_heads,
        max_position_embeddings=qc.max_position_embeddings,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=False,
        rms_norm_eps=qc.rms_norm_eps,
        rope_parameters=dict(qc.rope_parameters),
        hidden_act=qc.hidden_act,
        bos_token_id=qc.bos_token_id,
        eos_token_id=qc.eos_token_id,
        pad_token_id=qc.pad_token_id,
    )
    llama = LlamaForCausalLM(cfg).float()
    sd = {k: v.clone() for k, v in qwen.state_dict().items()}
    for i in range(qc.num_hidden_layers):
        sd[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(qc.hidden_size)
    missing, unexpected = llama.load_state_dict(sd, strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"Qwen2 -> Llama export mismatch: missing {missing}, unexpected {unexpected}")
    llama.tie_weights()
    llama.eval()
    return llama


# ------------------------------------------------------------------------------------------------------ warm-up

Respond = Callable[[Problem, random.Random], str]  # the warm-up target for a problem (EOS appended by the batcher)


def sft_batch(problems: list[Problem], rng: random.Random, tokenizer, respond: Respond,
              prompt_fn: Callable[[Problem], str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids [n, T], attention_mask [n, T], labels [n, T]) for ``n`` problems; labels are -100 on
    the prompt and padding. ``respond(problem, rng)`` writes each target, ``prompt_fn(problem)`` each prompt."""
    seqs, labs = [], []
    for p in problems:
        pr = tokenizer(prompt_fn(p))["input_ids"]
        resp = tokenizer(respond(p, rng), add_special_tokens=False)["input_ids"]
        resp = resp + [tokenizer.eos_token_id]
        seqs.append(pr + resp)
        labs.append([-100] * len(pr) + resp)
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), T), dtype=torch.long)
    lab = torch.full((len(seqs), T), -100, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labs)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        lab[i, : len(l)] = torch.tensor(l)
    return ids, att, lab


@dataclass(frozen=True)
class WarmupHooks:
    """What a caller may attach to a warm-up without changing its numbers: ``log(line)`` every ``log_every`` steps;
    ``on_step(step, model)`` after each optimizer step (checkpoints, measurements); ``resume``: a state file (model,
    optimizer, schedule, random states, losses) written every ``save_every`` steps and read at the start when it
    exists, so that a killed build continues bit-identically."""

    log: Callable[[str], None] | None = None
    log_every: int = 100
    on_step: Callable[[int, object], None] | None = None
    resume: str | Path | None = None
    save_every: int = 0


def warmup(model, train: list[Problem], tokenizer, rng: random.Random, *, steps: int, batch_size: int, lr: float,
           warmup_steps: int, respond: Respond, prompt_fn: Callable[[Problem], str],
           hooks: WarmupHooks = WarmupHooks()) -> list[float]:
    """Supervised warm-up (AdamW betas (0.9, 0.98), weight decay 0.01, linear LR warm-up over ``warmup_steps`` then
    constant, grad-norm clip 1) on batch k = ``train[k * batch_size : (k + 1) * batch_size]``; returns the per-step
    losses. The first k steps of a run do not depend on ``steps`` (so a longer run's step k is the shorter run)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup_steps)))
    losses: list[float] = []
    if hooks.resume is not None and Path(hooks.resume).exists():
        losses = load_warmup_state(hooks.resume, model, opt, sched, rng)
        if hooks.log is not None:
            hooks.log(f"resumed at step {len(losses)} from {hooks.resume}")
    model.train()
    for step in range(len(losses), steps):
        ids, att, lab = sft_batch(train[step * batch_size : (step + 1) * batch_size], rng, tokenizer, respond,
                                  prompt_fn)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        every = hooks.log_every
        if hooks.log is not None and (step + 1) % every == 0:
            hooks.log(f"step {step + 1}/{steps} loss {sum(losses[-every:]) / len(losses[-every:]):.4f}")
        if hooks.on_step is not None:
            hooks.on_step(step + 1, model)
            model.train()
        if hooks.resume is not None and hooks.save_every and (step + 1) % hooks.save_every == 0:
            save_warmup_state(hooks.resume, model, opt, sched, rng, losses)
    model.eval()
    return losses


def save_warmup_state(path, model, opt, sched, rng: random.Random, losses: list[float]) -> None:
    """Everything the next warm-up step depends on, written atomically (a kill mid-write keeps the previous state)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "losses": list(losses)}, tmp)
    os.replace(tmp, path)


def load_warmup_state(path, model, opt, sched, rng: random.Random) -> list[float]:
    """Restore :func:`save_warmup_state`'s file into ``model``, ``opt``, ``sched``, ``rng`` and torch's global RNG;
    returns the losses so far (their count is the step to continue from)."""
    st = torch.load(path, weights_only=False)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    sched.load_state_dict(st["sched"])
    rng.setstate(st["rng"])
    torch.set_rng_state(st["torch_rng"])
    return list(st["losses"])


# ------------------------------------------------------------------------------------------------ saved folders


def save_model(model, tokenizer, out_dir: Path) -> None:
    """Save a task model + tokenizer as a plain Hugging Face folder (safetensors, portable tokenizer config)."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _portable_tokenizer_config(out_dir)


def _portable_tokenizer_config(out_dir: Path) -> None:
    """transformers 5 writes ``tokenizer_class: TokenizersBackend``, unknown to transformers 4.x (and so to most
    vLLM installs); ``PreTrainedTokenizerFast`` names the same tokenizer for both."""
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a saved task model folder (plain ``transformers`` loaders; model in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (Path(model_dir) / "config.json").exists():
        from capo.errors import DataError

        raise DataError(f"no model at {model_dir} (no config.json there)")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    return model, tok


def write_record(out_dir: str | Path, record: dict) -> None:
    """Write a build record to ``out_dir/capo_default.json`` (indented JSON, keys in the order given)."""
    (Path(out_dir) / "capo_default.json").write_text(json.dumps(record, indent=2) + "\n")


def mean_loss(losses: list[float], last: int = 20) -> float:
    """The mean of the last ``last`` warm-up losses (0.0 for none): a build record's ``final_loss``."""
    return sum(losses[-last:]) / max(1, len(losses[-last:]))


# -------------------------------------------------------------------------------------------------- the builder


@dataclass(frozen=True)
class ModelRecipe:
    """One task's model build. ``problems(n)``: the first n training problems; ``respond(problem, rng)``: the
    warm-up target (EOS appended); ``prompt(problem)``: the raw prompt after BOS; ``arch``: train a network of this
    size from scratch (exported in the Llama layout, :func:`export_llama`) -- or ``base_dir``: fine-tune the model
    saved there (kept in its layout); exactly one of the two. ``steps`` x ``batch_size`` problems are drawn; AdamW at
    ``lr`` after ``warmup_steps`` of linear warm-up; ``seed`` seeds everything (see the module docstring)."""

    problems: Callable[[int], list[Problem]]
    respond: Respond
    prompt: Callable[[Problem], str]
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    seed: int = 0
    arch: Architecture | None = None
    base_dir: Path | None = None
    hooks: WarmupHooks = field(default_factory=WarmupHooks)

    def __post_init__(self) -> None:
        if (self.arch is None) == (self.base_dir is None):
            raise ValueError("a ModelRecipe needs exactly one of arch (from scratch) and base_dir (fine-tune)")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class BuiltModel:
    """What :func:`build_model` saved: ``model`` (as saved, eval mode), ``tokenizer``, the per-step ``losses`` and
    ``params``, the trained network's parameter count (before a Llama export adds its zero o_proj biases), and
    ``train_seconds`` (from the start of the build to the end of the warm-up)."""

    model: object
    tokenizer: object
    losses: list[float]
    params: int
    train_seconds: float


def build_model(recipe: ModelRecipe, out_dir: str | Path) -> BuiltModel:
    """Build ``recipe``'s model and save it with its tokenizer to ``out_dir`` (fp32 safetensors); the caller writes
    the build record (:func:`write_record`). Deterministic on CPU for a fixed seed and thread count."""
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    if recipe.arch is not None:
        from transformers import Qwen2ForCausalLM

        a = recipe.arch
        tok = build_tokenizer(model_max_length=a.max_positions)
        model = Qwen2ForCausalLM(model_config(tok, a.hidden, a.layers, a.heads, a.intermediate,
                                              max_positions=a.max_positions)).float()
    else:
        model, tok = load_model(recipe.base_dir)
    params = sum(p.numel() for p in model.parameters())
    train = recipe.problems(recipe.steps * recipe.batch_size)
    losses = warmup(model, train, tok, rng, steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr,
                    warmup_steps=recipe.warmup_steps, respond=recipe.respond, prompt_fn=recipe.prompt,
                    hooks=recipe.hooks)
    train_seconds = time.perf_counter() - t0
    saved = export_llama(model) if recipe.arch is not None else model
    save_model(saved, tok, Path(out_dir))
    return BuiltModel(saved, tok, losses, params, train_seconds)

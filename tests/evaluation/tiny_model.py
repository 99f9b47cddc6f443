"""A tiny random causal LM (2-layer Qwen2) with a character-level tokenizer built in code, saved as an HF folder."""

from __future__ import annotations

from pathlib import Path

CHARS = list("0123456789+-*/=()\\{}[]<>.,:;?!'\"#$% \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_|")
SPECIAL = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_model(out: Path, *, seed: int = 0, chat_template: bool = True, hidden: int = 32) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIAL)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=vocab["<pad>"], eos_token_id=vocab["<eos>"], bos_token_id=None,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # make EOS likely enough that some samples stop early
        model.lm_head.weight[vocab["<eos>"]] *= 1.0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

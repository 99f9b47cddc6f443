"""A tiny random Qwen2 (fp32, head_dim 32: vLLM's CPU attention rejects 24) saved with capo's character tokenizer.

Two ids end a response: the tokenizer's ``<eos>`` and a second EOS id that only the generation config names, so the
tests see both stop paths. Both get a logit boost along the mean direction of the final hidden states, so that a fair
share of the samples stop before ``max_new_tokens`` (a random model almost never samples a given token)."""

from __future__ import annotations

from pathlib import Path

SECOND_EOS = "#"  # a character token that the generation config also treats as EOS


def build_tiny_qwen2(out: Path, *, seed: int = 0, head_dim: int = 32, sharpness: float = 15.0,
                     eos_logit: float = 2.5, max_positions: int = 256) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from capo.tasks.default import build_tokenizer

    tok = build_tokenizer()
    second = tok.convert_tokens_to_ids(SECOND_EOS)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=2 * head_dim, intermediate_size=4 * head_dim,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                      max_position_embeddings=max_positions, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)  # peaked next-token distributions (N(0, 0.02) gives near-uniform)
        ids = torch.randint(3, len(tok), (8, 24))
        h = model.model(input_ids=ids).last_hidden_state.reshape(-1, cfg.hidden_size)
        mean = h.mean(0)
        for t in (tok.eos_token_id, second):  # logit ~ eos_logit on a typical hidden state
            model.lm_head.weight[t] = eos_logit * mean / mean.norm() ** 2
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, second], pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

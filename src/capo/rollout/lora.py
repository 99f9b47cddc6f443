"""LoRA adapters on a causal LM (Hu et al. 2021, arXiv 2106.09685), through peft, for training with ``model.lora_rank``.

The adapters are injected into the model's own linear layers (:func:`add_lora`: no wrapper object, so every forward
path -- generation, the tiled log-prob forward, the reference -- runs the same module tree), only they train, and each
starts at zero (peft's B = 0), so the adapted model begins exactly as the base. A checkpoint stores the merged weights
W + (alpha / r) B A under the base model's own names (:func:`merged_state_dict`: a plain Hugging Face model for
``capo eval``, vLLM or ``from_pretrained``) and the adapters themselves in the trainer state
(:func:`adapter_state` / :func:`load_adapter_state`), from which a resumed run rebuilds the same model on the base.
peft is an optional dependency (capo's ``lora`` extra: ``pip install -e '.[lora]'`` in capo's clone).
"""

from __future__ import annotations

import torch

from capo.errors import ConfigError

ADAPTER = "default"  # peft's adapter name


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora_rank > 0 trains LoRA adapters through peft, which is not installed: "
                          "pip install peft (capo's extra `lora`: pip install -e '.[lora]' in capo's clone)") from None
    return peft


def add_lora(model, rank: int, alpha: float, targets: str) -> dict[str, int]:
    """Inject rank-``rank`` LoRA adapters with scale ``alpha / rank`` into the linear layers ``targets`` names
    (``all-linear``: every linear layer but the output head; or module names separated by commas, e.g.
    ``q_proj,v_proj``), freeze every other parameter, and return the trained and total parameter counts."""
    peft = _peft()
    target = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target, bias="none")
    try:
        peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as e:  # peft: a target module name the model does not have
        raise ConfigError(f"model.lora_targets={targets!r}: {e}") from None
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return {"trained": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def has_lora(model) -> bool:
    return any(".lora_A." in n for n, _ in model.named_parameters())


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters' tensors by parameter name (what a resumed run loads back with :func:`load_adapter_state`)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    own = dict(model.named_parameters())
    differ = sorted({n for n in own if ".lora_A." in n or ".lora_B." in n} ^ set(state))
    if differ or any(own[n].shape != t.shape for n, t in state.items()):
        which = differ[0] if differ else "their shapes"
        raise ConfigError(f"the checkpoint's LoRA adapters do not match the model's ({which}): resume with the "
                          "model.lora_* settings the run was started with")
    with torch.no_grad():
        for n, t in state.items():
            own[n].copy_(t)


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's state dict with every adapter merged into its layer's weight (W + (alpha / r) B A, in the
    weight's dtype) under the base model's own parameter names, adapters dropped: what a plain model of the base
    architecture loads."""
    peft = _peft()
    merged = {}
    for name, module in model.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer) and hasattr(module, "base_layer"):
            w = module.base_layer.weight
            merged[f"{name}.weight"] = (w + module.get_delta_weight(ADAPTER).to(w.dtype)).detach()
    out = {}
    for key, value in model.state_dict().items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        plain = key.replace(".base_layer.", ".")
        out[plain] = merged.get(plain, value)
    return out

"""LoRA through peft: the one module that imports ``peft`` (inside its functions, so that
importing it costs nothing). A policy with adapters is the transformers model itself with
peft's LoRA layers injected (``peft.inject_adapter_in_model``): the trainer, its log-prob
path and its checkpoints handle it as any model, and only what differs lives here:

- `wrap`: inject adapters as ``[lora]`` says (the base weights frozen, the adapters the only
  trainable parameters, so the optimiser holds state for them alone);
- `engine_state_dict`: the weights an engine receives, with the adapter's update merged on
  the fly, W + (alpha / r) B A for the targeted modules only, under the plain model's keys,
  without touching the trainer's adapter (a model without adapters: its own state dict);
  with ``adapted_only``, the targeted modules' merged weights alone: the rest are the frozen
  base, which an engine that already holds them keeps (a publish after the first);
- `adapter_state_dict`: the same weights in adapter form (each targeted module's A, B and
  scale, with the frozen bases and the rest on a full publish), for an engine that merges
  them itself with `merge_weight`, the trainer's own merge;
- `plain_copy`: a copy of the policy without adapters, holding the merged weights (the
  engine's model);
- `save_adapter` / `load_adapter`: a checkpoint's ``model/`` holds peft's adapter files
  (adapter_config.json naming the base model's directory, adapter_model.safetensors) and
  the base's config.json, so it reads as a PEFT adapter folder and as a model folder;
- `load_merged`: such a folder as a plain merged model (evaluation, serving, export).

Knows nothing of runs, configs or the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # how a PeftModel names the adapter's tensors in its files
ADAPTER = "default"
# an adapter publish's keys: the targeted module's name, then one of these
LORA_A, LORA_B, LORA_SCALE = ".lora_A", ".lora_B", ".lora_scale"


def is_lora(model: Any) -> bool:
    """Whether ``model`` carries injected adapters."""
    return getattr(model, "peft_config", None) is not None


def is_adapter_dir(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def wrap(model, *, rank: int, alpha: float, dropout: float, target_modules: list[str],
         base_dir: str | Path):
    """``model`` with LoRA adapters injected (in place; returned). ``base_dir``: the base
    model's directory, recorded in the adapter's config (resolved to an absolute path)."""
    from peft import LoraConfig, inject_adapter_in_model

    targets: Any = "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                     base_model_name_or_path=str(Path(base_dir).resolve()),
                     task_type="CAUSAL_LM")
    try:
        model = inject_adapter_in_model(cfg, model)
    except ValueError as e:  # no module matched target_modules
        from reroll.errors import ConfigError

        raise ConfigError(f"lora.target_modules = {list(target_modules)}: {e}") from None
    return model


def lora_layers(model) -> Iterator[tuple[str, Any]]:
    """(name, layer) of each module with an adapter (peft's LoRA layers: ``base_layer`` is
    the frozen original, ``lora_A`` / ``lora_B`` the adapter)."""
    for name, module in model.named_modules():
        if hasattr(module, "base_layer") and ADAPTER in getattr(module, "lora_A", {}):
            yield name, module


def engine_state_dict(model, dtype=None, copy: bool = False,
                      adapted_only: bool = False) -> dict[str, Any]:
    """The weights to publish, under the plain model's keys (see the module docstring); with
    ``copy``, each a tensor of its own (floating ones in ``dtype`` when given), so later
    updates of the trainer's weights do not reach them. With ``adapted_only`` (and
    adapters), only the targeted modules' merged weights: the only tensors training
    changes, each computed as in the full dict, so loading them over an engine that holds
    the full dict of an earlier publish leaves it equal to the full dict of this one. A targeted module's weight is
    W + (alpha / r) B A in one fresh tensor (``addmm``: one pass over the output, where
    peft's own merge makes three; equal to it within float rounding). `load_merged` and
    `plain_copy` merge through this function too, so evaluation, export and serving see
    the weights the engine was sent, bit for bit."""
    import torch

    if not is_lora(model):
        return model.state_dict()
    merged: dict[str, Any] = {}
    with torch.no_grad():
        for name, layer in lora_layers(model):
            a, b, scale = _factors(layer)
            merged[f"{name}.weight"] = merge_weight(layer.base_layer.weight, a, b, scale,
                                                    getattr(layer, "fan_in_fan_out", False))
    if adapted_only:
        return {k: v.to(dtype) if dtype is not None else v for k, v in merged.items()}
    sd = {}
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        k = k.replace(".base_layer.", ".")
        v = merged.get(k, v.detach())
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype, copy=copy and k not in merged)
        elif copy and k not in merged:
            v = v.clone()
        sd[k] = v
    return sd


def merge_weight(base, a, b, scale: float, fan_in_fan_out: bool):
    """base + scale B A in one fresh tensor, in the dtype of its inputs: one ``addmm`` (one
    pass over the output). ``fan_in_fan_out``: the layer stores its weight transposed
    (transformers' Conv1D; peft sets it for exactly those layers), so Aᵀ Bᵀ. The trainer's
    merge and the engine's (`reroll.engine.lora_apply`) both call this, so on the same device
    and dtypes they give the same bits."""
    import torch

    return (torch.addmm(base, a.T, b.T, alpha=scale) if fan_in_fan_out
            else torch.addmm(base, b, a, alpha=scale))


def _factors(layer) -> tuple[Any, Any, float]:
    return (layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight,
            float(layer.scaling[ADAPTER]))


def adapter_state_dict(model, dtype=None, adapter_only: bool = False) -> dict[str, Any]:
    """The weights to publish in adapter form, copies of their own: each targeted module
    ``m`` as ``m.lora_A``, ``m.lora_B`` and ``m.lora_scale`` (a 0-d float64 tensor holding
    alpha / r exactly), and with ``adapter_only`` False every other tensor too, under the
    plain model's keys, ``m.weight`` being the frozen base. The engine merges them itself
    (`reroll.engine.lora_apply`). The adapter entries and the bases travel in the trainer's
    own dtype, the rest in ``dtype``: the engine merges in that dtype and casts, as
    `engine_state_dict` does, so it holds the same bits. A model without adapters: its whole
    state dict (every tensor trains), copied and cast."""
    import torch

    out: dict[str, Any] = {}
    bases = set()
    with torch.no_grad():
        for name, layer in lora_layers(model):
            a, b, scale = _factors(layer)
            out[name + LORA_A], out[name + LORA_B] = a.detach().clone(), b.detach().clone()
            out[name + LORA_SCALE] = torch.tensor(scale, dtype=torch.float64)
            bases.add(f"{name}.weight")
    if adapter_only and is_lora(model):
        return out
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        k = k.replace(".base_layer.", ".")
        cast = dtype is not None and v.is_floating_point() and k not in bases
        out[k] = v.detach().to(dtype, copy=True) if cast else v.detach().clone()
    return out


def plain_copy(model, device, dtype, copy: Callable):
    """``copy(model, device, dtype)`` (`reroll.build.module_copy`) with each adapted module
    put back to its base layer and the merged weights loaded: a plain model."""
    merged = engine_state_dict(model)
    out = _strip(copy(model, device, dtype))
    out.load_state_dict({k: v.to(device, dtype if v.is_floating_point() else None)
                         for k, v in merged.items()})
    return out


def _strip(model):
    """``model`` (in place) with each adapted module put back to its base layer."""
    for name, _ in list(lora_layers(model)):
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, child, getattr(holder, child).base_layer)
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if attr in vars(model):
            delattr(model, attr)
    return model


def save_adapter(model, out: Path) -> None:
    """The adapter of ``model`` as peft writes it, plus the base's config.json."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {PREFIX + k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(sd, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(out)
    model.config.save_pretrained(out)


def load_adapter(model, adapter_dir: Path) -> None:
    """Load a saved adapter (`save_adapter`) into ``model``, which carries adapters of the
    same shape; a missing or unexpected tensor is an error."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    sd = {k.removeprefix(PREFIX): v for k, v in load_file(Path(adapter_dir) / ADAPTER_WEIGHTS).items()}
    result = set_peft_model_state_dict(model, sd)
    unexpected = getattr(result, "unexpected_keys", [])
    want = {k for k, _ in model.named_parameters() if ".lora_" in k}
    missing = [k for k in getattr(result, "missing_keys", []) if k in want]
    if unexpected or missing:
        from reroll.errors import CheckpointError

        raise CheckpointError(f"adapter {adapter_dir} does not match the model's adapters "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def base_dir(adapter_dir: Path) -> Path:
    """The base model's directory an adapter folder names."""
    return Path(json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
                ["base_model_name_or_path"])


def load_merged(adapter_dir: Path, dtype):
    """A plain model: the base an adapter folder names with the adapter merged into it (in
    float32 by `engine_state_dict`, then in ``dtype``)."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir(adapter_dir), dtype=torch.float32)
    model = inject_adapter_in_model(LoraConfig.from_pretrained(str(adapter_dir)), base)
    load_adapter(model, adapter_dir)
    merged = engine_state_dict(model)
    plain = _strip(model)
    plain.load_state_dict(merged)
    return plain.to(dtype=dtype)

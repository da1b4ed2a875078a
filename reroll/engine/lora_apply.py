"""LoRA adapters as an engine applies them: a publish in adapter form
(`reroll.lora.adapter_state_dict`) names each targeted module ``m`` by ``m.lora_A``,
``m.lora_B`` and ``m.lora_scale``; the engine keeps the base weight of each such module (sent
as ``m.weight`` by the full publish that came with the adapter) and sets
W = base + scale B A itself, through `reroll.lora.merge_weight`, the trainer's own merge.

Why the bits agree with a trainer-side merge on the same device: A, B and the base arrive in
the trainer's own dtype, uncast (copies of the trainer's tensors, bit for bit), and the scale
as a float64 0-d tensor (alpha / r is a Python float, a double, so it round-trips exactly);
the merge is the same ``torch.addmm`` call on the same operands, and its result is cast to
the engine's dtype as `reroll.lora.engine_state_dict` casts to the publish dtype.

Owns the split of a publish into plain tensors and adapters, their checks (before anything
changes) and the kept bases (one extra copy of the targeted modules' base weights; dropped
when a tensor is loaded plainly over them, e.g. a full publish without adapters). Knows
nothing of peft, trainers or scheduling.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.lora import LORA_A, LORA_B, LORA_SCALE, merge_weight

SUFFIXES = (LORA_A, LORA_B, LORA_SCALE)


def split(state_dict: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, dict]]:
    """(the plain tensors, {module: {suffix: tensor}}) of a publish."""
    plain: dict[str, Tensor] = {}
    parts: dict[str, dict] = {}
    for k, v in state_dict.items():
        suffix = next((s for s in SUFFIXES if k.endswith(s)), None)
        if suffix is None:
            plain[k] = v
        else:
            parts.setdefault(k[: -len(suffix)], {})[suffix] = v
    return plain, parts


class Bases:
    """The engine's kept base weights, by module name, and the merge over them."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.kept: dict[str, Tensor] = {}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kept.values())

    def check(self, plain: dict[str, Tensor], parts: dict[str, dict]) -> list[str]:
        """What is wrong with the adapters of a publish (empty: nothing)."""
        modules = dict(self.model.named_modules())
        bad = []
        for m, got in sorted(parts.items()):
            missing = [s for s in SUFFIXES if s not in got]
            mod = modules.get(m)
            w = getattr(mod, "weight", None)
            if missing:
                bad.append(f"{m}: no {', '.join(s.lstrip('.') for s in missing)}")
            elif not isinstance(w, Tensor):
                bad.append(f"{m}: the engine's model has no such module with a weight")
            else:
                a, b = got[LORA_A], got[LORA_B]
                base = plain.get(f"{m}.weight", self.kept.get(m))
                want = _shape(mod, a, b)
                if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or want != w.shape:
                    bad.append(f"{m}: wrong shapes (A {tuple(a.shape)}, B {tuple(b.shape)} "
                               f"for a weight of {tuple(w.shape)})")
                elif base is None:
                    bad.append(f"{m}: no base weight (a full publish must come first)")
                elif base.shape != w.shape:
                    bad.append(f"{m}: base of shape {tuple(base.shape)}, weight {tuple(w.shape)}")
        return bad

    def apply(self, plain: dict[str, Tensor], parts: dict[str, dict]) -> None:
        """After ``plain`` is loaded: keep the bases it sent for adapted modules, drop those
        it overwrote plainly, and set each adapted module's weight to the merge."""
        for k in plain:
            m = k.removesuffix(".weight")
            if k.endswith(".weight") and m in self.kept and m not in parts:
                del self.kept[m]  # loaded plainly (LoRA off): its base is freed
        modules = dict(self.model.named_modules())
        with torch.no_grad():
            for m, got in parts.items():
                w = modules[m].weight
                if f"{m}.weight" in plain:  # as sent: the trainer's dtype
                    self.kept[m] = plain[f"{m}.weight"].detach().to(w.device, copy=True)
                base = self.kept[m]
                merged = merge_weight(base, got[LORA_A].to(base.device),
                                      got[LORA_B].to(base.device), float(got[LORA_SCALE]),
                                      fan_in_fan_out=not isinstance(modules[m], torch.nn.Linear))
                w.copy_(merged.to(w.dtype))


def _shape(module, a: Tensor, b: Tensor) -> torch.Size:
    """The weight shape an adapter fits: out x in for a Linear, in x out for a layer that
    stores it transposed (Conv1D)."""
    out_in = (b.shape[0], a.shape[-1])
    return torch.Size(out_in if isinstance(module, torch.nn.Linear) else out_in[::-1])

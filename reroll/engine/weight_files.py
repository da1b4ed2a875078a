"""The trainer's weights as a server takes them: safetensors bytes for a request body, or a
directory written atomically where a server loads weights from disk (a new ``vNNNNNN``
folder with the model's config beside the tensors, the last two kept; or, for a server that
reloads the directory it was started from, its ``model.safetensors`` replaced in place).

Owns the files only; knows nothing of HTTP or of any server's routes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from reroll.engine.adapters import Weights


def plain(weights: dict[str, Any]) -> dict[str, Any]:
    """CPU, contiguous, one storage per name (safetensors refuses shared storage)."""
    seen: set[int] = set()
    out = {}
    for k, v in weights.items():
        v = v.detach().cpu()
        out[k] = v.clone() if v.data_ptr() in seen else v.contiguous()
        seen.add(v.data_ptr())
    return out


def payload(weights: dict[str, Any], version: int, weights_dir: str = "", *,
            in_place: bool = False, model_config: Any = None) -> Weights:
    """Safetensors bytes (no ``weights_dir``), or the directory written under it."""
    from safetensors.torch import save, save_file

    tensors = plain(weights)
    if not weights_dir:
        return Weights(version, data=save(tensors))
    root = Path(weights_dir)
    root.mkdir(parents=True, exist_ok=True)
    if in_place:  # the server's own model directory: replace its weights
        tmp = root / ".model.safetensors.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, root / "model.safetensors")
        return Weights(version, path=str(root))
    target, tmp = root / f"v{version:06d}", root / f".v{version:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"))
    if model_config is not None:
        model_config.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    for old in sorted(root.glob("v[0-9]*"))[:-2]:  # keep the last two
        shutil.rmtree(old, ignore_errors=True)
    return Weights(version, path=str(target))

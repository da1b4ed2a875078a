"""Device names, resolved in one place: what "auto" means ("cuda" when torch sees a GPU,
else "cpu"), the index of a ``cuda:N``, whether this process sees it, and where the torch
engine runs (``engine.device``, else ``model.device``). Every caller that turns a configured
device into a torch one comes here. Knows the two config keys that name devices; knows
nothing of models, engines or Ray (torch is imported only when a name must be resolved).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reroll.config import RunConfig


def resolve_device(name: str) -> str:
    """``name`` as torch names it: "auto" is cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def is_cuda_name(name: str) -> bool:
    """Whether ``name`` is ``cuda`` or ``cuda:N``."""
    return re.fullmatch(r"cuda(:\d+)?", name) is not None


def cuda_index(name: str) -> int:
    """The device index of ``cuda`` (0) or ``cuda:N`` (N)."""
    return int(name.split(":")[1]) if ":" in name else 0


def cuda_visible(name: str) -> bool:
    """Whether this process's torch sees the CUDA device ``name`` (``cuda`` or ``cuda:N``)."""
    import torch

    return torch.cuda.is_available() and cuda_index(name) < torch.cuda.device_count()


def engine_device(cfg: RunConfig) -> str:
    """Where the torch engine runs, as configured: engine.device, else model.device (not yet
    resolved: "auto" stays "auto")."""
    return cfg.engine.device or cfg.model.device


def resolved_engine_device(cfg: RunConfig) -> str:
    """Where the torch engine's model goes in this process: `engine_device`, resolved."""
    return resolve_device(engine_device(cfg))

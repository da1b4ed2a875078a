"""Mixed precision as reroll's trainers run it (the RL `Trainer` and the SFT warm start).

The weights being trained are the float32 master copy, so AdamW's state is float32 too;
`model.dtype = bfloat16` runs the forward and backward passes under ``torch.autocast`` at
bf16 (matmuls in bf16, reductions such as log_softmax in float32). ``float16`` trains in
float32 with no autocast: fp16 autocast would need loss scaling. Must not know about
losses, batches or optimisers.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

MASTER_DTYPE = "float32"
"""The dtype trained weights are loaded and updated in, whatever `model.dtype` says."""


def autocast_dtype(model_dtype: str) -> torch.dtype | None:
    """The autocast dtype for `model.dtype`: bf16 for "bfloat16", else None (no autocast)."""
    return torch.bfloat16 if model_dtype == "bfloat16" else None


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` on ``device``'s type at ``dtype``; a no-op context for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)

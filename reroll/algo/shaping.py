"""Reward shaping from response lengths (pure): DAPO's soft overlong punishment.

Owns the length penalty only; adding it to the correctness reward (and keeping correctness
separately for the dynamic-sampling filter) is the loop's job. Must not know about groups,
verifiers or configs. Method and keys: docs/algorithms.md (DAPO).
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """Soft overlong punishment per response [N] from response lengths [N] (tokens).

    With the expected limit L = max_len - buffer:
        0                          if length <= L
        -factor (length - L) / buffer   if L < length <= max_len   (linear ramp to -factor)
        -factor                    if length > max_len
    ``buffer = 0`` disables shaping (all zeros).
    """
    if buffer < 0 or max_len <= 0 or buffer > max_len:
        raise ValueError(f"overlong_penalty: need max_len > 0 and 0 <= buffer <= max_len, "
                         f"got max_len={max_len}, buffer={buffer}")
    if factor < 0:
        raise ValueError(f"overlong_penalty: factor must be >= 0, got {factor}")
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    if buffer == 0:
        return torch.zeros_like(lengths)
    over = (lengths - (max_len - buffer)).clamp(min=0.0, max=float(buffer))  # [N]
    return -factor * over / buffer

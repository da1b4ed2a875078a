"""A fixed pool of KV-cache slots that a transformers model writes through its `Cache` API.

Owns: the per-layer key/value tensors ``[slots, kv_heads, max_len, head_dim]`` (allocated once,
at the first forward, from the shapes the model hands in, then reused for every request), the
two write plans the engine sets before each forward, and the attention masks that go with
them. Knows nothing of requests, sampling or records.

Two kinds of forward go through the cache:

* packed prefill: the new sequences are concatenated into ONE row ``[1, T]`` with a
  block-diagonal causal mask and per-token position ids; ``update`` scatters each token's
  key/value into every slot that needs it (one slot per request; n samples of one prompt
  share a single packed copy, copied into n slots) and returns the packed keys unchanged, so
  the prefill attends only within its own block;
* decode: one token per active slot ``[n, 1]``; slot ``i`` writes at its own position
  ``pos[i]`` and attends to the slot's first ``pos[i] + 1`` positions; ``update`` returns views
  ``[:n, :, :L]`` of the pool (no copy), ``L`` the longest active sequence;
* extend (a decode step with drafts): ``q`` tokens per active slot ``[n, q]``; slot ``i``
  writes at ``pos[i] .. pos[i] + q - 1`` and its query ``j`` attends to the first
  ``pos[i] + j + 1`` positions (a row with a shorter draft pads with dummy queries, whose
  keys land beyond its accepted tokens and are overwritten before anything reads them).

Active requests always occupy slots ``0..n-1`` (the engine compacts with `move`), so a decode
batch is a view of the pool rather than a gather.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's key/value pool; allocated lazily from the first keys it sees."""

    is_sliding = False

    def __init__(self, slots: int, max_len: int):
        super().__init__()
        self.slots, self.max_len = slots, max_len

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        kv, dk, dv = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
        self.keys = key_states.new_zeros(self.slots, kv, self.max_len, dk)
        self.values = value_states.new_zeros(self.slots, kv, self.max_len, dv)
        self.flat_k = self.keys.view(-1, dk)  # [slots * kv * max_len, dk]
        self.flat_v = self.values.view(-1, dv)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        raise RuntimeError("SlotLayer is written through SlotCache.update only")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_len, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.max_len

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() * 2


class SlotCache(Cache):
    """The slot pool as a transformers `Cache` (see the module docstring)."""

    def __init__(self, num_layers: int, slots: int, max_len: int):
        super().__init__(layers=[SlotLayer(slots, max_len) for _ in range(num_layers)])
        self.slots, self.max_len = slots, max_len
        self._mode = "idle"
        self._idx: Tensor | None = None  # flat write index, [tokens * kv_heads]
        self._src: Tensor | None = None  # packed-token index per written row (prefill)
        self._n = 0
        self._len = 0
        self._heads: int | None = None

    # ---- plans (set by the engine before each forward) -----------------------------
    def _flat_index(self, slot: Tensor, pos: Tensor) -> Tensor:
        """Flat row index into ``[slots * kv * max_len]`` for every (token, kv head)."""
        heads = self._heads if self._heads is not None else 1
        base = slot * (heads * self.max_len) + pos  # [M]
        offs = torch.arange(heads, device=slot.device) * self.max_len  # [kv]
        return (base.unsqueeze(-1) + offs).reshape(-1)  # [M * kv]

    def plan_prefill(self, slot: Tensor, pos: Tensor, src: Tensor) -> None:
        """Packed token ``src[m]`` goes to slot ``slot[m]`` at position ``pos[m]``: [M] each."""
        self._mode, self._slot, self._pos, self._src = "prefill", slot, pos, src
        self._idx = self._flat_index(slot, pos) if self._heads is not None else None

    def plan_decode(self, pos: Tensor, length: int) -> None:
        """Slot ``i < n`` writes its token at ``pos[i]`` ([n]); attention spans ``length``."""
        n = pos.shape[0]
        self._mode, self._n, self._len = "decode", n, length
        self._slot, self._pos = torch.arange(n, device=pos.device), pos
        self._idx = self._flat_index(self._slot, pos) if self._heads is not None else None

    def plan_extend(self, pos: Tensor, q: int, length: int) -> None:
        """Slot ``i < n`` writes ``q`` tokens at ``pos[i] ..`` ([n]); attention spans
        ``length`` (<= max_len). Positions past the pool's end (a row's padded queries only:
        its real ones stay below ``max_len``) write at its last position, where a padded or
        a finishing row's last query -- whose output nothing uses -- is all that reads."""
        n = pos.shape[0]
        self._mode, self._n, self._len = "decode", n, length
        self._slot = torch.arange(n, device=pos.device).repeat_interleave(q)  # [n * q]
        at = pos.unsqueeze(1) + torch.arange(q, device=pos.device)
        self._pos = at.clamp(max=self.max_len - 1).reshape(-1)
        self._idx = self._flat_index(self._slot, self._pos) if self._heads is not None else None

    # ---- the Cache API the model calls ------------------------------------------------
    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        if self._heads is None or self._idx is None:
            self._heads = key_states.shape[1]
            self._idx = self._flat_index(self._slot, self._pos)
        if self._mode == "decode":
            # key_states: [n, kv, q, d] -> rows ordered (slot, token, head)
            if key_states.shape[2] > 1:  # extend: q tokens per slot
                key_states, value_states = key_states.transpose(1, 2), value_states.transpose(1, 2)
            layer.flat_k.index_copy_(0, self._idx, key_states.reshape(-1, key_states.shape[-1]))
            layer.flat_v.index_copy_(0, self._idx,
                                     value_states.reshape(-1, value_states.shape[-1]))
            n, ln = self._n, self._len
            return layer.keys[:n, :, :ln], layer.values[:n, :, :ln]
        if self._mode == "prefill":
            # key_states: [1, kv, T, d] -> [T, kv, d] -> the tokens each slot needs
            k = key_states[0].transpose(0, 1)[self._src]  # [M, kv, d]
            v = value_states[0].transpose(0, 1)[self._src]
            layer.flat_k.index_copy_(0, self._idx, k.reshape(-1, k.shape[-1]))
            layer.flat_v.index_copy_(0, self._idx, v.reshape(-1, v.shape[-1]))
            return key_states, value_states
        raise RuntimeError("SlotCache.update called without a plan (plan_prefill/plan_decode)")

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    # ---- slot management ----------------------------------------------------------------
    def move(self, dst: Tensor, src: Tensor, length: int) -> None:
        """Copy slots ``src`` into slots ``dst`` ([k] each), first ``length`` positions."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[dst, :, :length] = layer.keys[src, :, :length]
                layer.values[dst, :, :length] = layer.values[src, :, :length]

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def data_ptrs(self) -> list[int]:
        """Storage addresses of every pool tensor (a test checks they never change)."""
        return [t.data_ptr() for layer in self.layers if layer.is_initialized
                for t in (layer.keys, layer.values)]


def prefill_mask(lengths: list[int], dtype: torch.dtype, additive: bool,
                 device: torch.device | None = None) -> Tensor:
    """Block-diagonal causal mask ``[1, 1, T, T]`` for sequences packed back to back, built
    on ``device`` (default the CPU): no ``T x T`` host tensor to copy over per prefill."""
    total = sum(lengths)
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(lengths, device=device), output_size=total)  # [T]
    ar = torch.arange(total, device=device)
    allowed = (seq.unsqueeze(1) == seq.unsqueeze(0)) & (ar.unsqueeze(1) >= ar.unsqueeze(0))
    return _as_mask(allowed.view(1, 1, total, total), dtype, additive)


def decode_mask(pos: Tensor, length: int, arange: Tensor, dtype: torch.dtype,
                additive: bool) -> Tensor:
    """Slot ``i`` sees positions ``<= pos[i]``: [n] -> [n, 1, 1, length]."""
    allowed = arange[:length].unsqueeze(0) <= pos.unsqueeze(1)
    return _as_mask(allowed.view(pos.shape[0], 1, 1, length), dtype, additive)


def extend_mask(pos: Tensor, q: int, length: int, arange: Tensor, dtype: torch.dtype,
                additive: bool) -> Tensor:
    """Query ``j`` of slot ``i`` sees positions ``<= pos[i] + j``: [n] -> [n, 1, q, length]."""
    last = pos.unsqueeze(1) + arange[:q].unsqueeze(0)  # [n, q]
    allowed = arange[:length].view(1, 1, length) <= last.unsqueeze(-1)
    return _as_mask(allowed.unsqueeze(1), dtype, additive)


def _as_mask(allowed: Tensor, dtype: torch.dtype, additive: bool) -> Tensor:
    """Boolean (sdpa: True = attend) or additive float (eager: 0 / most negative)."""
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)

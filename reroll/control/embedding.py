"""DOTS's difficulty prediction for prompts not rolled out recently (docs/algorithms.md): a
prompt embedding and attention over a reference set of prompts whose success rates were
observed. Pure functions over numpy arrays.

Owns the embedding (hashed character n-grams of the prompt and of its shape, digits written
``0`` and letters ``a``, so that "37-45+12=" and "81-26+93=" land close) and the attention
rule ``p(q) = sum_r softmax(cos(q, r) / temperature)_r p_r``. DOTS embeds with a frozen LLM
and a trained adapter; no model is downloaded here, and the n-gram embedding needs no
training. Hashing uses blake2b, so an embedding is the same in every process (Python's
``hash`` of a string is salted per process). Knows nothing of selectors or statistics.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

_DIGIT, _LETTER = re.compile(r"\d"), re.compile(r"[^\W\d_]")


def shape(text: str) -> str:
    """Digits as ``0``, letters as ``a``, the rest unchanged."""
    return _LETTER.sub("a", _DIGIT.sub("0", text))


def _bucket(gram: str, dim: int) -> tuple[int, float]:
    h = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "little")
    return h % dim, (1.0 if (h >> 63) & 1 else -1.0)


def hashed_ngrams(text: str, *, dim: int = 256, orders: tuple[int, ...] = (1, 2, 3)
                  ) -> np.ndarray:
    """[dim] float32, unit length (zeros for an empty text): signed counts of the text's
    character n-grams and of its shape's (prefixed ``t:`` and ``s:``, so the two never share
    a gram), one bucket per gram by blake2b."""
    if dim < 1 or not orders or min(orders) < 1:
        raise ValueError(f"hashed_ngrams: needs dim >= 1 and orders >= 1, got {dim}, {orders}")
    v = np.zeros(dim, dtype=np.float32)
    for tag, s in (("t:", text), ("s:", shape(text))):
        for n in orders:
            for i in range(len(s) - n + 1):
                j, sign = _bucket(tag + s[i:i + n], dim)
                v[j] += sign
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def attention_predict(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, *,
                      temperature: float) -> np.ndarray:
    """[M] predicted rates: each query's softmax-weighted mean of ``values`` ([R]) with
    weights ``softmax(queries @ keys.T / temperature)`` (rows of unit length: cosine)."""
    if not temperature > 0:
        raise ValueError(f"attention_predict: temperature must be > 0, got {temperature}")
    if keys.shape[0] != values.shape[0] or keys.shape[0] == 0:
        raise ValueError(f"attention_predict: needs R >= 1 keys with one value each, got "
                         f"{keys.shape[0]} keys and {values.shape[0]} values")
    logits = queries.astype(np.float64) @ keys.astype(np.float64).T / temperature  # [M, R]
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ values.astype(np.float64)

"""Loss aggregation: a per-token loss matrix -> the scalar contribution of one micro-batch.

Owns the ``AGGREGATIONS`` registry. Every entry has the signature

    fn(per_token_loss [B, T], mask [B, T], n_tokens: float, n_seqs: float, *, hyperparams)
        -> 0-d tensor

``n_tokens`` / ``n_seqs`` are the trainable tokens / sequences of the whole mini-batch, not of
this micro-batch. Every mode is a sum of per-sequence terms divided by such a global constant,
so the micro-batch losses sum exactly to the whole mini-batch loss (and their gradients to
its gradient), however the mini-batch is split. Must not know about surrogates or models.
The modes and the methods that use them: docs/algorithms.md (aggregations).
"""

from __future__ import annotations

from torch import Tensor

from reroll.registry import Registry

AGGREGATIONS = Registry("aggregation")


def _check(name: str, loss: Tensor, mask: Tensor, n_tokens: float, n_seqs: float) -> Tensor:
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(f"aggregation {name!r}: per_token_loss {tuple(loss.shape)} and mask "
                         f"{tuple(mask.shape)} must be the same [B, T] shape")
    if not n_tokens > 0 or not n_seqs > 0:
        raise ValueError(f"aggregation {name!r}: global normalisers must be > 0, got "
                         f"n_tokens={n_tokens}, n_seqs={n_seqs}")
    return (loss * mask).sum(-1)  # [B] masked per-sequence token sums


@AGGREGATIONS.register("token_mean")
def token_mean(per_token_loss: Tensor, mask: Tensor, n_tokens: float, n_seqs: float) -> Tensor:
    """sum_{i,t} m l / n_tokens: every trainable token of the mini-batch weighs the same."""
    return _check("token_mean", per_token_loss, mask, n_tokens, n_seqs).sum() / n_tokens


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(per_token_loss: Tensor, mask: Tensor, n_tokens: float,
                        n_seqs: float) -> Tensor:
    """(1/n_seqs) sum_i [sum_t m l / sum_t m]: each sequence weighs the same (original GRPO).

    A sequence with no trainable token contributes 0 (it still counts in ``n_seqs``).
    """
    sums = _check("seq_mean_token_mean", per_token_loss, mask, n_tokens, n_seqs)  # [B]
    return (sums / mask.sum(-1).clamp(min=1.0)).sum() / n_seqs


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(per_token_loss: Tensor, mask: Tensor, n_tokens: float,
                       n_seqs: float) -> Tensor:
    """(1/n_seqs) sum_i sum_t m l: a sequence is one action whose loss is its token sum."""
    return _check("seq_mean_token_sum", per_token_loss, mask, n_tokens, n_seqs).sum() / n_seqs


@AGGREGATIONS.register("seq_mean_token_sum_norm", ranges={"divisor": "(0, inf)"})
def seq_mean_token_sum_norm(per_token_loss: Tensor, mask: Tensor, n_tokens: float,
                            n_seqs: float, *, divisor: float) -> Tensor:
    """sum_{i,t} m l / divisor, a constant independent of response lengths (Dr.GRPO).

    Set ``divisor`` to a fixed length such as the generation limit (max new tokens).
    """
    if not divisor > 0:
        raise ValueError(f"aggregation 'seq_mean_token_sum_norm': divisor must be > 0, got {divisor}")
    sums = _check("seq_mean_token_sum_norm", per_token_loss, mask, n_tokens, n_seqs)
    return sums.sum() / divisor

"""Aggregations: hand-computed values and exact micro-batch invariance."""

import pytest
import torch

from reroll.algo import AGGREGATIONS

# row 0: losses 1, 2, 3 all trainable ; row 1: losses 4, 5, 0 with only the first trainable
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ARGS = {"seq_mean_token_sum_norm": {"divisor": 8.0}}


@pytest.mark.parametrize("name,expected", [
    ("token_mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
    ("seq_mean_token_mean", 3.0),  # (6/3 + 4/1) / 2 sequences = (2 + 4) / 2
    ("seq_mean_token_sum", 5.0),  # (6 + 4) / 2 sequences
    ("seq_mean_token_sum_norm", 1.25),  # (6 + 4) / divisor 8
])
def test_aggregation_values(name, expected):
    out = AGGREGATIONS.bind(name, ARGS.get(name, {}))(LOSS, MASK, 4.0, 2.0)
    assert out.shape == () and abs(float(out) - expected) < 1e-6


def test_seq_mean_token_mean_counts_an_empty_sequence_as_zero():
    out = AGGREGATIONS.get("seq_mean_token_mean")(LOSS, torch.tensor([[1.0, 1, 1], [0, 0, 0]]),
                                                  3.0, 2.0)
    assert abs(float(out) - 1.0) < 1e-6  # (6/3 + 0) / 2


def test_divisor_is_required_and_normalisers_must_be_positive():
    from reroll.registry import RegistryError

    with pytest.raises(RegistryError, match="needs hyperparameter"):
        AGGREGATIONS.bind("seq_mean_token_sum_norm", {})
    with pytest.raises(ValueError, match="n_tokens=0"):
        AGGREGATIONS.get("token_mean")(LOSS, MASK, 0.0, 2.0)


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_summed_micro_batches_equal_the_whole_batch_in_value_and_gradient(name):
    torch.manual_seed(0)
    w = torch.randn(6, 5, requires_grad=True)  # per-token losses depend on a parameter
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = (torch.arange(5)[None] < lengths[:, None]).float()  # [6, 5]
    n_tok, n_seq = float(mask.sum()), 6.0
    agg = AGGREGATIONS.bind(name, ARGS.get(name, {}))

    def per_token(rows):
        return torch.tanh(w[rows]) * 3.0 + w[rows] ** 2  # [b, 5]

    whole = agg(per_token(slice(0, 6)), mask, n_tok, n_seq)
    (g_whole,) = torch.autograd.grad(whole, w)
    parts = [agg(per_token(s), mask[s], n_tok, n_seq)
             for s in (slice(0, 2), slice(2, 3), slice(3, 6))]
    summed = sum(parts)
    (g_parts,) = torch.autograd.grad(summed, w)
    assert torch.allclose(summed, whole, atol=1e-6)
    assert torch.allclose(g_parts, g_whole, atol=1e-6)

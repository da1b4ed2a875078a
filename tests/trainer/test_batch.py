"""Collation aligns every per-token field on next-token positions; log-probs match a
hand-rolled forward pass."""

import torch
from float_bounds import assert_reordered_close

from reroll.rollout import Rollout
from reroll.trainer.batch import collate, token_logprobs
from reroll.trainer.micro_batches import micro_slices


def rollout(tokens, prompt_len, lps, versions):
    r = Rollout(prompt_id="p", group_id="g", tokens=list(tokens[:prompt_len]), prompt_len=prompt_len)
    for t, lp, v in zip(tokens[prompt_len:], lps, versions):
        r.append(t, lp, v)
    return r


def test_collate_shifts_fields_by_one_and_pads():
    a = rollout([2, 5, 6, 7, 8], 3, [-0.1, -0.2], [0, 1])
    b = rollout([2, 9, 10], 2, [-0.3], [1])
    b.loss_exclusion = "pivot"
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[2, 5, 6, 7, 8], [2, 9, 10, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # position t predicts token t+1: targets are input_ids[:, 1:]
    assert batch.targets.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    # a's sampled tokens 7, 8 are targets at positions 2, 3; b is excluded (pivot)
    assert batch.mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
    assert torch.allclose(batch.behav_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, -0.3, 0, 0]]))
    assert batch.versions.tolist() == [[-1, -1, 0, 1], [-1, 1, -1, -1]]
    assert batch.n_tokens == 2.0


def test_token_logprobs_match_manual_forward(tiny, device):
    model, _ = tiny
    model.to(device)
    a = rollout([2, 5, 6, 7, 8], 3, [0, 0], [0, 0])
    b = rollout([2, 9, 10], 2, [0], [0])
    batch = collate([a, b], pad_id=0).to(device)

    def t(x):
        return torch.tensor(x, device=device)

    with torch.no_grad():
        got = token_logprobs(model, batch, temperature=0.5)
        logits = model(t([[2, 5, 6, 7, 8]])).logits[0]  # [5, V]
        want = torch.log_softmax(logits[:-1] / 0.5, -1)[t([0, 1, 2, 3]), t([5, 6, 7, 8])]
    # one sequence alone vs a batch of two: other matmul shapes, sums in another order; the
    # tiny model's longest sums are its MLP's (intermediate_size = 256 terms)
    assert_reordered_close(got[0], want, 256)
    with torch.no_grad():
        logits_b = model(t([[2, 9, 10]])).logits[0]
        want_b = torch.log_softmax(logits_b[:-1] / 0.5, -1)[t([0, 1]), t([9, 10])]
    assert_reordered_close(got[1, :2], want_b, 256)  # right padding does not leak


def test_micro_slices_cover_exactly():
    assert micro_slices(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]

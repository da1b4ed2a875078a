"""Micro-batches: how a mini-batch is cut (`plan_micro_batches`, hand-worked), each padded to
its own longest sequence (`Batch.trim`), and the update the same however it is cut: in
order or sorted by length under a token budget (`train.micro_batch_tokens`), one pass or
many, with the proximal and reference passes cut the same way."""

import copy

import pytest
import torch
from float_bounds import assert_reordered_close, assert_steps_close

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.trainer.batch import collate
from reroll.trainer.micro_batches import plan_micro_batches
from reroll.trainer.options import TrainerOptions
from reroll.trainer.step import Trainer


def test_in_order_micro_batches_are_consecutive_runs():
    assert plan_micro_batches([5, 9, 3, 9, 2], rows=2) == [[0, 1], [2, 3], [4]]
    assert plan_micro_batches([5, 9, 3], rows=8) == [[0, 1, 2]]
    assert plan_micro_batches([], rows=4) == [] and plan_micro_batches([], 4, 10) == []


def test_a_token_budget_sorts_by_length_and_fills_runs_up_to_it():
    # longest first, ties in order: 1 (9), 3 (9), 0 (5), 2 (3), 4 (2)
    # [1, 3]: 2 x 9 = 18 <= 18; adding 0 would pad 3 x 9 = 27. [0, 2, 4]: 3 x 5 = 15
    assert plan_micro_batches([5, 9, 3, 9, 2], rows=8, tokens=18) == [[1, 3], [0, 2, 4]]
    # the row cap still holds
    assert plan_micro_batches([5, 9, 3, 9, 2], rows=2, tokens=100) == [[1, 3], [0, 2], [4]]
    # a sample longer than the budget is a run of its own; [2, 4] would pad 2 x 3 = 6 > 4
    assert plan_micro_batches([5, 9, 3, 9, 2], rows=8, tokens=4) == [[1], [3], [0], [2], [4]]
    # every sample exactly once
    lengths = [7, 1, 30, 4, 4, 12, 2, 30, 9]
    plan = plan_micro_batches(lengths, rows=3, tokens=40)
    assert sorted(i for run in plan for i in run) == list(range(len(lengths)))
    assert all(len(r) * max(lengths[i] for i in r) <= 40 or len(r) == 1 for r in plan)


def test_units_keep_a_prompts_samples_together_under_a_budget():
    # prompt P: samples 0-3 (10, 2, 2, 2 tokens); prompt Q: samples 4-7 (9 tokens each)
    lengths, units = [10, 2, 2, 2, 9, 9, 9, 9], ["P"] * 4 + ["Q"] * 4
    # sorted by sample, both prompts are split: [0, 4, 5, 6] (4 x 10), [7, 1, 2, 3] (4 x 9)
    assert plan_micro_batches(lengths, rows=64, tokens=40) == [[0, 4, 5, 6], [7, 1, 2, 3]]
    # by unit (P's longest, 10, before Q's 9): [0, 1, 2, 3] (4 x 10), [4, 5, 6, 7] (4 x 9)
    assert plan_micro_batches(lengths, rows=64, tokens=40, units=units) == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    # members longest first inside a unit; a run that starts inside one (sample 4, 2 tokens)
    # meets longer samples of the next: 2 x 9, 3 x 9, 4 x 9 = 36 fit, a fifth (45) does not
    lengths, units = [10, 2, 2, 2, 2, 9, 9, 9, 9, 9], ["P"] * 5 + ["Q"] * 5
    plan = plan_micro_batches(lengths, rows=64, tokens=40, units=units)
    assert plan == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(len(r) * max(lengths[i] for i in r) <= 40 for r in plan)
    # units go longest member first, ties in order of first appearance; rows still cap
    assert plan_micro_batches([3, 5, 5, 1], rows=2, tokens=100, units=["a", "b", "a", "b"]) == \
        [[2, 0], [1, 3]]


def rollouts(lengths, prompt=(2, 5, 6)):
    """One group with one sample per entry: ``lengths[j]`` response tokens."""
    g = new_group(Example("p", "1+1=", "2"), len(lengths), list(prompt), SamplingParams(), 0)
    for j, (r, n) in enumerate(zip(g.rollouts, lengths)):
        for k in range(n):
            r.append(7 + (j + k) % 5, -2.0 - 0.1 * k, 0)
        r.finish, r.scores, r.reward = "stop", [Score("exact", value=float(j % 2))], float(j % 2)
    return g


def test_trim_cuts_a_batch_to_its_longest_sequence(tiny, device):
    model, _ = tiny
    model.to(device)
    rs = rollouts([1, 4, 2]).rollouts  # sequences of 4, 7 and 5 tokens
    full = collate(rs, pad_id=0, pad_to=12)
    assert full.input_ids.shape == (3, 12)
    cut = full.trim()
    assert cut.input_ids.shape == (3, 7) and cut.mask.shape == (3, 6)
    pads = {"input_ids": 0, "attention_mask": 0, "targets": 0, "mask": 0.0,
            "behav_logprobs": 0.0, "versions": -1}
    for f, pad in pads.items():  # the columns cut away held padding only
        a, b = getattr(full, f), getattr(cut, f)
        assert torch.equal(a[:, :b.shape[1]], b)
        assert (a[:, b.shape[1]:] == pad).all()
    assert full.slice(torch.tensor([0, 2])).trim().input_ids.shape == (2, 5)
    assert cut.trim() is cut
    # right padding: the real positions' log-probs do not depend on the padding cut away
    tr = Trainer(model, build_objective(AlgoConfig()), TrainerOptions(pad_id=0, lr=0.0))
    full, cut = full.to(device), cut.to(device)
    with torch.no_grad():
        a = tr._forward(model, full)[0][:, :6] * full.mask[:, :6]
        b = tr._forward(model, cut)[0] * cut.mask
    # other matmul shapes (12 vs 7 columns), sums in another order; the tiny model's longest
    # sums are its MLP's (intermediate_size = 256 terms)
    assert_reordered_close(b, a, 256)


# response lengths with a long tail, in two groups (rewards alternate 0, 1: every sample
# has signal)
LONG_TAIL = [[1, 2, 14, 1, 3, 2], [2, 1, 1, 9, 2, 1]]


def run(model, start, algo, steps=2, **kw):
    """Gradients at every optimiser step, the loss passes' shapes, and the metrics."""
    model.load_state_dict(start)
    ref = copy.deepcopy(model) if algo.kl_coef > 0 else None
    t = Trainer(model, build_objective(algo),
                TrainerOptions(pad_id=0, lr=1e-2, **kw), ref_model=ref)
    shapes, grads, real_fwd = [], [], t._forward
    t._forward = lambda m, b, entropy=False, **kw: (  # the loss's passes (with autograd)
        shapes.append(tuple(b.input_ids.shape)) if torch.is_grad_enabled() else None) \
        or real_fwd(m, b, entropy, **kw)
    t.opt.register_step_pre_hook(lambda *_: grads.append(
        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    metrics = [t.step([rollouts(x) for x in LONG_TAIL]) for _ in range(steps)]
    return grads, shapes, metrics


def assert_same_gradients(a, b):
    """Equal up to float rounding (the matmuls see other shapes): within the bound for sums
    in another order (`float_bounds`) of the tiny model's longest, its MLP's inner products
    (intermediate_size = 256 terms; a weight's gradient sums at most 12 x 17 = 204
    positions), at the scale of each step's largest gradient (~1e-2 to 1)."""
    for g_a in a[0]:
        assert max(float(x.abs().max()) for x in g_a) > 1e-2
    assert_steps_close(a[0], b[0], 256)
    for m_a, m_b in zip(a[2], b[2]):
        assert m_a["loss/policy"] == pytest.approx(m_b["loss/policy"], abs=1e-6)


@pytest.mark.parametrize("algo, kw", [
    (AlgoConfig(), {}),
    (AlgoConfig(correction="tis_token"), {"reuse_prox": False}),  # a separate proximal pass
    (AlgoConfig(kl_coef=0.05), {"minibatches": 2}),  # reference and proximal passes
    (AlgoConfig(kl_coef=0.05, kl_in_reward=True), {}),
])
def test_the_update_does_not_depend_on_how_the_batch_is_cut(tiny, algo, kw, device):
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    whole = run(model, start, algo, micro_batch=64, **kw)
    in_order = run(model, start, algo, micro_batch=3, **kw)
    budget = run(model, start, algo, micro_batch=64, micro_batch_tokens=24, **kw)
    assert_same_gradients(whole, in_order)
    assert_same_gradients(whole, budget)
    assert len(whole[0]) == 2 * kw.get("minibatches", 1)


def test_micro_batches_are_padded_to_their_own_longest_sample(tiny, device):
    """Sequences are 3 + the response lengths: [4, 5, 17, 4, 6, 5] and [5, 4, 4, 12, 5, 4]."""
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _, shapes, m = run(model, start, AlgoConfig(), steps=1, micro_batch=3)
    assert shapes == [(3, 17), (3, 6), (3, 5), (3, 12)]  # not 4 x 17
    real = 4 + 5 + 17 + 4 + 6 + 5 + 5 + 4 + 4 + 12 + 5 + 4
    assert m[0]["train/padding_share"] == pytest.approx(1 - real / (3 * (17 + 6 + 5 + 12)))
    assert m[0]["train/positions"] == 3 * (17 + 6 + 5 + 12)
    # a budget of 24 positions, at most 6 rows, longest first (17, 12, 6, 5 x 4, 4 x 5):
    # [17] | [12, 6] (2 x 12 = 24) | [5, 5, 5, 5] (20; a fifth 5 would pad 25) | [4 x 5] (20)
    _, shapes, m = run(model, start, AlgoConfig(), steps=1, micro_batch=6, micro_batch_tokens=24)
    assert shapes == [(1, 17), (2, 12), (4, 5), (5, 4)]
    assert m[0]["train/padding_share"] == pytest.approx(1 - real / (17 + 24 + 20 + 20))
    assert m[0]["train/positions"] == 17 + 24 + 20 + 20


def test_the_config_keys_reach_the_trainer(tiny_dir, device):
    from reroll import build
    from reroll.config_checks import load_checked

    on = f"model.device={device}"
    cfg = load_checked(None, ["train.micro_batch=16", "train.micro_batch_tokens=512", on])
    t = build.build_trainer(cfg, tiny_dir)
    assert (t.options.micro_batch, t.options.micro_batch_tokens) == (16, 512)
    assert build.build_trainer(load_checked(None, [on]), tiny_dir).options.micro_batch_tokens == 0


def test_packed_cost_counts_the_positions_of_the_layout_a_pass_runs_in():
    """Samples of 6, 6 (prompt 0, 1 token) and 4 tokens (prompt 1, 2 tokens). At hidden 128
    a position costs 2 (4 x 128^2 + 3 x 128 x 256) = 327,680 FLOPs and a query-key pair 512:
    positions decide. Samples 0 and 1 packed: one row of 1 + 5 + 5 = 11, not 2 x 6; with
    sample 2 too, rows 11 and 4 -> 2 x 11 = 22 against 3 x 6 = 18 padded: padded. At hidden 1
    (a position 8, a pair 4) the pair term decides: one packed row of 11 costs 11 x 8 + 121 x
    4 = 572, two padded rows of 6 cost 2 x 6 x 8 + 2 x 36 x 4 = 384: padded, 12 positions."""
    from reroll.trainer.shared_prompt import PackedCost

    lengths, prompt_lens, ids = [6, 6, 4], [1, 1, 2], [0, 0, 1]
    wide = PackedCost(lengths, prompt_lens, ids, hidden=128, intermediate=256)
    wide.add(0)
    assert wide.with_(1) == 11
    wide.add(1)
    assert wide.with_(2) == 18
    narrow = PackedCost(lengths, prompt_lens, ids, hidden=1, intermediate=0)
    narrow.add(0)
    assert narrow.with_(1) == 12
    # a budget of 11: the packed pair fits in one pass; counted padded (12) it would not
    assert plan_micro_batches(lengths, rows=8, tokens=11, units=ids, cost=wide) == [[0, 1], [2]]
    assert plan_micro_batches(lengths, rows=8, tokens=11, units=ids) == [[0], [1], [2]]

"""Per-token advantages through the objective: the trainer's per-token path
(`reroll.trainer.credit`) gives bitwise the old scalar broadcast wherever no tree group asks
for segment credit, a tiny per-token loss by hand, and a segment-credit tree group's rows
aligned on next-token positions with its inherited tokens out of the loss."""

import math

import pytest
import torch
from test_tree_credit import LENGTHS, PARENTS, REWARDS, SHARED, TRAINED, UNSCALED, P

from reroll.algo import SURROGATES, LossInputs, build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Example, Group, Rollout, Score
from reroll.trainer import credit
from reroll.trainer.batch import collate


def loss_and_grad(obj, adv, seed=0, B=3, T=5):
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(B, T, generator=g) * 2
    behav = prox + 0.3 * torch.randn(B, T, generator=g)
    logp = (prox + 0.2 * torch.randn(B, T, generator=g)).requires_grad_()
    mask = (torch.arange(T)[None] < torch.tensor([5, 2, 4])[:, None]).float()
    loss, _ = obj.loss(LossInputs(logp, prox, behav, adv, mask, float(mask.sum()), float(B)))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad


@pytest.mark.parametrize("surrogate", SURROGATES.names())
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_per_token_path_is_bitwise_the_scalar_broadcast(surrogate, aggregation):
    obj = build_objective(AlgoConfig(surrogate=surrogate, aggregation=aggregation))
    scalar = torch.tensor([0.7, -1.3, 0.1])  # [B]
    mask = torch.ones(3, 5)
    old = scalar[:, None].expand_as(mask).contiguous()  # what the step did before
    groups = [plain_group(2, "a"), plain_group(1, "b")]  # no tree: nothing to change
    new, new_mask, new_scalar, metrics = credit.token_advantages(groups, torch.ones(3), scalar,
                                                                 mask)
    assert torch.equal(new, old) and new_mask is mask and new_scalar is scalar and not metrics
    l_old, g_old = loss_and_grad(obj, old)
    l_new, g_new = loss_and_grad(obj, new)
    assert torch.equal(l_old, l_new) and torch.equal(g_old, g_new)


def test_a_tiny_per_token_loss_by_hand():
    # ppo_clip (0.2), token_mean, behaviour = proximal (TIS weights 1). Row 0: A = 0.5, -1, 2
    # at ratios 1.5, 1, 0.5; row 1: A = 3, 1, 0 at ratio 1 with only its middle token in the
    # loss (an inherited token on each side). Per token -min(r A, clip(r) A):
    #   row 0: -min(0.75, 0.6) = -0.6 (clipped), -min(-1, -1) = 1, -min(1, 1.6) = -1
    #   row 1: -1 ; token_mean over the 4 loss tokens: (-0.6 + 1 - 1 - 1) / 4 = -0.4
    # d/dlogp of -A r / 4 where unclipped: row 0: 0, 1/4, -2 * 0.5 / 4; row 1: 0, -1/4, 0
    prox = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5], [1.0, 1.0, 1.0]])).requires_grad_()
    adv = torch.tensor([[0.5, -1.0, 2.0], [3.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    loss, _ = build_objective(AlgoConfig()).loss(LossInputs(logp, prox, prox.clone(), adv, mask,
                                                            4.0, 2.0))
    assert math.isclose(float(loss.detach()), -0.4, abs_tol=1e-7)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.25, -0.25], [0.0, -0.25, 0.0]]),
                          atol=1e-7)


def plain_group(n, gid, rewards=None):
    g = Group(gid, Example("p", "q", "a"), n)
    for i in range(n):
        r = Rollout("p", gid, [1, 2, 3, 4], 2, index_in_group=i)
        r.loss_mask = [False, False, True, True]
        r.reward = 1.0 if rewards is None else rewards[i]
        r.scores = [Score("s", value=r.reward)]
        g.rollouts.append(r)
    return g


def tree_group(credit_name="segments_once"):
    """The two trees of `test_tree_credit` as records (prompt of 2, every response token
    sampled or inherited, so in the loss mask)."""
    g = Group("t", Example("p", "q", "a"), 8)
    for i in range(8):
        r = Rollout("p", "t", [5] * LENGTHS[i], P, index_in_group=i)
        r.loss_mask = [False] * P + [True] * (LENGTHS[i] - P)
        r.reward, r.scores = REWARDS[i], [Score("s", value=REWARDS[i])]
        r.control["tree"] = {"parent": PARENTS[i], "credit": credit_name, "shared": SHARED[i]}
        if credit_name.startswith("segments"):
            r.control["tree"]["scale"] = False
        g.rollouts.append(r)
    return g


def test_a_segment_tree_groups_rows_train_each_token_once_next_to_untouched_rows():
    groups = [tree_group(), plain_group(2, "x", [1.0, 0.0])]
    rollouts = [r for g in groups for r in g.rollouts]
    batch = collate(rollouts, pad_id=0)  # L = 9: [10, 8], column c predicts token c + 1
    scalar = torch.arange(10, dtype=torch.float32)  # the estimator's, replaced in the tree
    rewards = torch.tensor([r.reward for r in rollouts])  # [10]
    adv, mask, per_sample, m = credit.token_advantages(groups, rewards, scalar, batch.mask)
    # the tree's rows: the hand-computed token advantages and trained positions, shifted
    assert torch.allclose(adv[:8], torch.tensor([row[1:] for row in UNSCALED]), atol=1e-7)
    assert mask[:8].tolist() == [[float(x) for x in row[1:]] for row in TRAINED]
    # the plain group's rows: the scalar over its two response tokens, untouched
    assert torch.equal(adv[8:], scalar[8:, None].expand(2, 8))
    assert torch.equal(mask[8:], batch.mask[8:])
    # a member's entry: its tokens' mean, e.g. member 0 (0.5 * 2 - 0.25 * 2 + 1 * 2) / 6
    expect = [2.5 / 6, -1.0, 2.0 / 3, 0.5, -3.5 / 6, -0.5, 0.5, -1.0, 8.0, 9.0]
    assert torch.allclose(per_sample, torch.tensor(expect), atol=1e-6)
    # held: response tokens of the 8 members (6 + 7 + 5 + 6) * 2; trained: sampled once
    # (6 + 3 + 3 + 2) * 2
    assert m == {"tree/tokens_held": 48.0, "tree/tokens_trained": 28.0,
                 "tree/trained_share": 28 / 48}
    assert batch.mask[:8].sum() == 48  # the caller's mask is not modified


def test_a_leaf_credit_tree_group_is_the_scalar_broadcast_with_every_held_token_trained():
    g = tree_group("leaves")
    batch = collate(g.rollouts, pad_id=0)
    scalar = torch.linspace(-1, 1, 8)
    adv, mask, per_sample, m = credit.token_advantages([g], torch.ones(8), scalar, batch.mask)
    assert torch.equal(adv, scalar[:, None].expand_as(batch.mask).contiguous())
    assert mask is batch.mask and per_sample is scalar
    assert m == {"tree/tokens_held": 48.0, "tree/tokens_trained": 48.0, "tree/trained_share": 1.0}


def test_a_group_whose_members_disagree_on_the_credit_is_refused():
    g = tree_group()
    g.rollouts[3].control["tree"]["credit"] = "leaves"
    with pytest.raises(ValueError, match="group t: its members record different tree credits"):
        credit.token_advantages([g], torch.zeros(8), torch.zeros(8),
                                collate(g.rollouts, 0).mask)



def test_segment_credit_uses_the_rewards_the_estimator_saw():
    # a KL penalty in the reward reaches the step as rewards less the penalty, not in the
    # records: the tree's advantages follow the rewards given (linear in them: twice the
    # rewards, twice every advantage)
    g = tree_group()
    batch = collate(g.rollouts, pad_id=0)
    twice = 2 * torch.tensor(REWARDS)
    adv, _, _, _ = credit.token_advantages([g], twice, torch.zeros(8), batch.mask)
    assert torch.allclose(adv, 2 * torch.tensor([row[1:] for row in UNSCALED]), atol=1e-7)


# ---- TreeRL's per-path loss, each shared token trained once with the paths' weight ---------

# loss weight of each token of the two trees (path count below its node; 0: not trained here)
PATHS = [
    [0, 0, 4, 4, 2, 2, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 2, 2, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 0],
    [0, 0, 4, 4, 2, 2, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 2, 2, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 0],
]


def test_segments_weigh_each_token_by_the_root_to_leaf_paths_through_it():
    """TreeRL trains every root-to-leaf path as its own sequence (the reference assembles one
    training sample per selected leaf path, each token carrying its node's reward), so a
    token of a node shared by n leaves is in the loss n times. "segments" keeps one copy with
    weight n: a tree's top node (4 leaves) weighs 4, a node of 2 leaves 2, a leaf's own
    tokens 1; the mask then sums to the tokens the 8 paths hold (48), the positions trained
    stay the 28 sampled ones."""
    g = tree_group("segments")
    batch = collate(g.rollouts, pad_id=0)
    adv, mask, _, m = credit.token_advantages([g], torch.tensor(REWARDS), torch.zeros(8),
                                              batch.mask)
    assert mask.tolist() == [[float(x) for x in row[1:]] for row in PATHS]
    assert torch.allclose(adv, torch.tensor([row[1:] for row in UNSCALED]), atol=1e-7)
    assert float(mask.sum()) == m["tree/tokens_held"] == 48.0
    assert m["tree/tokens_trained"] == 28.0


class TinyCausal(torch.nn.Module):
    """A causal LM small enough to differentiate exactly in float64: token and position
    embeddings, a running mean over the prefix (position t sees tokens 0..t), a tanh layer
    and an output head."""

    def __init__(self, vocab=11, width=6, length=9):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.tok = torch.nn.Parameter(torch.randn(vocab, width, generator=g, dtype=torch.float64))
        self.pos = torch.nn.Parameter(torch.randn(length, width, generator=g,
                                                  dtype=torch.float64))
        self.mix = torch.nn.Parameter(torch.randn(width, width, generator=g,
                                                  dtype=torch.float64))
        self.head = torch.nn.Parameter(torch.randn(width, vocab, generator=g,
                                                   dtype=torch.float64))

    def logprobs(self, tokens):  # [B, L] -> [B, L-1]: column t is log p(token t+1 | 0..t)
        x = self.tok[tokens] + self.pos[: tokens.shape[1]]  # [B, L, d]
        steps = torch.arange(1, tokens.shape[1] + 1, dtype=torch.float64)[None, :, None]
        h = torch.tanh((x.cumsum(1) / steps) @ self.mix)  # [B, L, d]
        logp = (h @ self.head).log_softmax(-1)[:, :-1]  # [B, L-1, V]
        return logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)


def tree_tokens():
    """Token ids of the two trees, each member's inherited prefix a copy of its parent's."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate(LENGTHS):
        own = torch.randint(0, 11, (n,), generator=g).tolist()
        if PARENTS[i] is not None:
            own[: SHARED[i]] = rows[PARENTS[i]][: SHARED[i]]
        rows.append(own)
    return torch.tensor([r + [0] * (max(LENGTHS) - len(r)) for r in rows])  # [8, 9]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum"])
def test_segments_gradient_equals_the_per_path_loss(aggregation):
    """The gradient of "segments" (each token once, weight = paths through it) equals that of
    TreeRL's loss over every root-to-leaf path as its own sequence (every response token of
    every member, inherited ones included, with the advantage of its node, scaled by
    1/sqrt(leaves)), under PPO-clip with a token-level truncated IS correction; "segments_once"
    does not (it weighs a shared node once). Both losses are float64 sums of the same
    per-token terms, in a different order and with n copies replaced by one copy times n:
    each gradient entry is a sum of at most 8 x 9 terms, so the two differ by a few float64
    roundings (unit 1.1e-16) of the largest partial sum, far under 1e-12 of the gradient's
    scale; a lost or doubled path would move it by a whole term (~1e-2)."""
    from reroll.methods.treerl import segment_advantages, tree_segments

    tokens = tree_tokens()
    rewards = torch.tensor(REWARDS)
    resp = torch.zeros(8, 8, dtype=torch.float64)  # [8, L-1]: every response token a path holds
    for i, n in enumerate(LENGTHS):
        resp[i, P - 1: n - 1] = 1.0
    obj = build_objective(AlgoConfig(aggregation=aggregation))

    def grads(adv, mask):  # one loss's gradient on every parameter, flattened
        model = TinyCausal()
        logp = model.logprobs(tokens)  # [8, 8]
        prox = logp.detach()
        behav = prox - 0.3 * torch.cos(tokens[:, 1:].double() + torch.arange(8.0))  # per token
        loss, _ = obj.loss(LossInputs(logp, prox, behav, adv.double(), mask.double(),
                                      float(mask.sum()), 8.0))
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    # the reference's loss: member k trains all its response tokens, each with its node's A
    # (as float32, the precision the trainer's per-token advantages have)
    segs = tree_segments(PARENTS, SHARED, LENGTHS, P)
    per_path = torch.zeros(8, 9, dtype=torch.float32)
    for s, a in zip(segs, segment_advantages(segs, REWARDS, scale=True)):
        for k in s.leaves:
            per_path[k, s.start:s.end] = a
    want = grads(per_path[:, 1:], resp)
    scale = float(want.abs().max())
    assert scale > 1e-3  # the trees carry a gradient
    for name, equal in (("segments", True), ("segments_once", False)):
        g = tree_group(name)
        for r in g.rollouts:
            r.control["tree"]["scale"] = True
        adv, mask, _, _ = credit.token_advantages([g], rewards, torch.zeros(8),
                                                  resp.float())
        got = grads(adv, mask)
        assert torch.allclose(got, want, rtol=0, atol=1e-12 * scale) == equal, name

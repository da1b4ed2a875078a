"""TreeRL segment credit (`reroll.methods.treerl`) against values computed by hand: two
trees of four leaves (w = 2, forks at response positions 2 and 4) with and without the
1/sqrt(leaves) scale, a member that stopped before a fork position, a fork at response
position 0, a partial tree, and the errors."""

import math

import pytest
import torch

from reroll.methods.treerl import (
    segment_advantages,
    segment_credit,
    segment_credit_once,
    tree_segments,
)

P = 2  # prompt tokens: positions 0 and 1
# Two trees of w = 2, d = (2, 4): members 0..3 and 4..7 with digits 00, 01, 10, 11.
# Member 2 forks from 0 at response position 2 (token P + 2 = 4), members 1 and 3 fork from
# 0 and 2 at response position 4 (token 6).
PARENTS = [None, 0, 0, 2, None, 4, 4, 6]
SHARED = [0, 6, 4, 6, 0, 6, 4, 6]
LENGTHS = [8, 9, 7, 8, 8, 9, 7, 8]
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
# V(root) = 4 / 8 = 0.5.
# Tree 0: V{0,1,2,3} = 0.75, V{0,1} = 0.5, V{2,3} = 1.
#   member 0 tokens 2,3 (node {0,1,2,3}, parent root):  (0.75 - 0.5) + (0.75 - 0.5) = 0.5
#   member 0 tokens 4,5 (node {0,1}, parent {0,1,2,3}):  (0.5 - 0.5) + (0.5 - 0.75) = -0.25
#   member 0 tokens 6,7 (leaf 0, parent {0,1}):          (1 - 0.5) + (1 - 0.5) = 1
#   member 1 tokens 6,7,8 (leaf 1, parent {0,1}):        (0 - 0.5) + (0 - 0.5) = -1
#   member 2 tokens 4,5 (node {2,3}, parent {0,1,2,3}):  (1 - 0.5) + (1 - 0.75) = 0.75
#   member 2 token 6 (leaf 2, parent {2,3}):             (1 - 0.5) + (1 - 1) = 0.5
#   member 3 tokens 6,7 (leaf 3, parent {2,3}):          0.5
# Tree 1: V{4,5,6,7} = 0.25, V{4,5} = 0, V{6,7} = 0.5.
#   member 4 tokens 2,3:   (0.25 - 0.5) * 2 = -0.5
#   member 4 tokens 4,5:   (0 - 0.5) + (0 - 0.25) = -0.75
#   member 4 tokens 6,7:   (0 - 0.5) + (0 - 0) = -0.5
#   member 5 tokens 6,7,8: -0.5
#   member 6 tokens 4,5:   (0.5 - 0.5) + (0.5 - 0.25) = 0.25
#   member 6 token 6:      (1 - 0.5) + (1 - 0.5) = 1
#   member 7 tokens 6,7:   (0 - 0.5) + (0 - 0.5) = -1
# Every other position (prompt, inherited, padding) is 0 and not trained.
UNSCALED = [
    [0, 0, 0.5, 0.5, -0.25, -0.25, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, -1, -1, -1],
    [0, 0, 0, 0, 0.75, 0.75, 0.5, 0, 0],
    [0, 0, 0, 0, 0, 0, 0.5, 0.5, 0],
    [0, 0, -0.5, -0.5, -0.75, -0.75, -0.5, -0.5, 0],
    [0, 0, 0, 0, 0, 0, -0.5, -0.5, -0.5],
    [0, 0, 0, 0, 0.25, 0.25, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, -1, -1, 0],
]
TRAINED = [
    [0, 0, 1, 1, 1, 1, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 1, 1, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 0],
    [0, 0, 1, 1, 1, 1, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 1, 1, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 1, 1, 0],
]
h = 1 / math.sqrt(2)  # nodes of 2 leaves; a tree's top node has 4: / 2; a leaf: / 1
SCALED = [
    [0, 0, 0.25, 0.25, -0.25 * h, -0.25 * h, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, -1, -1, -1],
    [0, 0, 0, 0, 0.75 * h, 0.75 * h, 0.5, 0, 0],
    [0, 0, 0, 0, 0, 0, 0.5, 0.5, 0],
    [0, 0, -0.25, -0.25, -0.75 * h, -0.75 * h, -0.5, -0.5, 0],
    [0, 0, 0, 0, 0, 0, -0.5, -0.5, -0.5],
    [0, 0, 0, 0, 0.25 * h, 0.25 * h, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, -1, -1, 0],
]


@pytest.mark.parametrize("scale, expect", [(False, UNSCALED), (True, SCALED)])
def test_two_trees_of_four_leaves_by_hand(scale, expect):
    adv, own = segment_credit_once(PARENTS, SHARED, LENGTHS, REWARDS, P, scale)
    assert own.tolist() == [[bool(x) for x in row] for row in TRAINED]
    assert torch.allclose(adv, torch.tensor(expect, dtype=torch.float32), atol=1e-7)


def test_the_nodes_of_the_two_trees_are_the_digit_prefixes():
    segs = tree_segments(PARENTS, SHARED, LENGTHS, P)
    got = [(s.member, s.start, s.end, sorted(s.leaves), sorted(s.parent)) for s in segs]
    root = list(range(8))
    assert got == [(0, 2, 4, [0, 1, 2, 3], root), (0, 4, 6, [0, 1], [0, 1, 2, 3]),
                   (0, 6, 8, [0], [0, 1]), (1, 6, 9, [1], [0, 1]),
                   (2, 4, 6, [2, 3], [0, 1, 2, 3]), (2, 6, 7, [2], [2, 3]),
                   (3, 6, 8, [3], [2, 3]),
                   (4, 2, 4, [4, 5, 6, 7], root), (4, 4, 6, [4, 5], [4, 5, 6, 7]),
                   (4, 6, 8, [4], [4, 5]), (5, 6, 9, [5], [4, 5]),
                   (6, 4, 6, [6, 7], [4, 5, 6, 7]), (6, 6, 7, [6], [6, 7]),
                   (7, 6, 8, [7], [6, 7])]


def test_a_member_that_stopped_before_a_fork_position_parts_from_its_children_one_level_up():
    # w = 2, d = (2, 4), one tree. Member 0 stops after 3 response tokens (EOS at token 4),
    # before position 4: member 1's fork happens at its last token (min(6, 5 - 1) = 4) and
    # draws token 4 again. Members 0, 1 and the node {2, 3} part at token 4, all below the
    # tree's top node {0,1,2,3}: there is no node {0, 1} (no token is held by 0 and 1 alone).
    parents, shared, lengths = [None, 0, 0, 2], [0, 4, 4, 6], [5, 7, 7, 8]
    rewards = [1.0, 0.0, 1.0, 1.0]  # V(root) = V{0,1,2,3} = 0.75, V{2,3} = 1
    segs = tree_segments(parents, shared, lengths, P)
    assert [(s.member, s.start, s.end, sorted(s.leaves), sorted(s.parent)) for s in segs] == [
        (0, 2, 4, [0, 1, 2, 3], [0, 1, 2, 3]), (0, 4, 5, [0], [0, 1, 2, 3]),
        (1, 4, 7, [1], [0, 1, 2, 3]), (2, 4, 6, [2, 3], [0, 1, 2, 3]),
        (2, 6, 7, [2], [2, 3]), (3, 6, 8, [3], [2, 3])]
    # top node = the group: 0 + 0; leaf 0: (1 - .75) * 2; leaf 1: (0 - .75) * 2;
    # {2,3}: (1 - .75) * 2; leaves 2 and 3: (1 - .75) + (1 - 1)
    assert segment_advantages(segs, rewards, scale=False) == [0.0, 0.5, -1.5, 0.5, 0.25, 0.25]


def test_a_fork_at_response_position_zero_hangs_from_the_group_root():
    # d = (0,): member 1 forks at the prompt's end and shares no response token
    segs = tree_segments([None, 0], [0, 2], [4, 5], P)
    assert [(s.member, s.start, s.end, sorted(s.leaves), sorted(s.parent)) for s in segs] == [
        (0, 2, 4, [0], [0, 1]), (1, 2, 5, [1], [0, 1])]
    assert segment_advantages(segs, [1.0, 0.0], scale=False) == [1.0, -1.0]  # (+-.5) * 2


def test_a_partial_trees_chain_of_single_children_is_one_node():
    # n = 6 with w = 2, d = (2, 4): the second tree is members 4 and 5 only (digits 00, 01):
    # member 4's tokens 2..5 are held by {4, 5} from the prompt to the fork at token 6
    parents = PARENTS[:6]
    segs = [s for s in tree_segments(parents, SHARED[:6], LENGTHS[:6], P) if s.member == 4]
    assert [(s.start, s.end, sorted(s.leaves), sorted(s.parent)) for s in segs] == [
        (2, 6, [4, 5], list(range(6))), (6, 8, [4], [4, 5])]
    # V(root) = 3 / 6 = 0.5, V{4,5} = 0: (0 - .5) * 2 = -1; leaf 4: (0 - .5) + 0 = -0.5
    assert segment_advantages(segs, REWARDS[:6], scale=False) == [-1.0, -0.5]


def test_each_sampled_token_is_trained_once():
    adv, own = segment_credit_once(PARENTS, SHARED, LENGTHS, REWARDS, P)
    for i, (n, p) in enumerate(zip(LENGTHS, PARENTS)):
        first = P if p is None else SHARED[i]
        assert own[i].nonzero().flatten().tolist() == list(range(first, n))


def test_bad_trees_and_missing_rewards_are_named():
    with pytest.raises(ValueError, match="member 1 has parent 5"):
        tree_segments([None, 5], [0, 3], [4, 4], P)
    with pytest.raises(ValueError, match="cycle"):
        tree_segments([1, 0], [3, 3], [4, 4], P)
    with pytest.raises(ValueError, match="member 1 inherits 6 tokens of member 0"):
        tree_segments([None, 0], [0, 6], [5, 8], P)
    with pytest.raises(ValueError, match="finite reward"):
        segment_credit([None, 0], [0, 3], [4, 5], [1.0, None], P)

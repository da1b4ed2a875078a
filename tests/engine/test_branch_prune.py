"""LATR's lookahead pruning (reroll.engine.branch_prune, the branching plug-in): the three
similarity tests by hand, a pruned child going back to its tree's spares, and a tree whose
first two branches are pruned and replaced."""

import pytest
from engine_helpers import make

from reroll.engine.branch import TreeTable
from reroll.engine.branch_prune import edit_ratio, rouge_l, suffix_share, too_similar
from reroll.engine.fork import inherit
from reroll.engine.torch_engine import TorchEngine
from reroll.rollout import BranchRule, Rollout, Span

PROMPT = "12+34="


def test_the_similarity_tests_by_hand():
    # one substitution in 4: 1/4; a shift by one (delete 1, insert 9): 2/4; all differ: 4/4
    assert edit_ratio([5, 2, 3, 4], [6, 2, 3, 4]) == 0.25
    assert edit_ratio([1, 2, 3, 4], [2, 3, 4, 9]) == 0.5
    assert edit_ratio([1, 2, 3, 4], [5, 6, 7, 8]) == 1.0
    # LCS [2, 3, 4]: P = R = 3/4, F1 = 3/4; reversed: LCS 1, F1 = 1/4; nothing shared: 0
    assert rouge_l([1, 2, 3, 4], [2, 3, 4, 9]) == 0.75
    assert rouge_l([1, 2, 3, 4], [4, 3, 2, 1]) == 0.25
    assert rouge_l([1, 2], [3, 4]) == 0.0
    # a's suffix [3, 4] is inside b ([2, 3, 4] is not), b's suffix [8] is not in a: 2/4
    assert suffix_share([1, 2, 3, 4], [9, 3, 4, 8]) == 0.5
    # b's suffix [1] is inside a ([7, 1] is not), a's [4] is not in b: 1/4
    assert suffix_share([1, 2, 3, 4], [5, 6, 7, 1]) == 0.25
    # the reference's default (edit distance / window < 0.4) and its math runs' tests
    default = BranchRule()
    assert default.prune_at == (20, 30, 50) and default.prune_edit == 0.4
    assert too_similar([5, 2, 3, 4], [6, 2, 3, 4], default)  # 0.25 < 0.4
    assert not too_similar([1, 2, 3, 4], [2, 3, 4, 9], default)  # 0.5
    math = BranchRule(prune_edit=0.0, prune_rouge_l=0.5, prune_suffix=0.2)
    assert too_similar([1, 2, 3, 4], [2, 3, 4, 9], math)  # ROUGE-L 0.75 > 0.5
    assert too_similar([1, 2, 3, 4], [5, 6, 7, 1], math)  # suffix 0.25 > 0.2
    assert not too_similar([1, 2, 3, 4], [5, 6, 7, 8], math)
    with pytest.raises(ValueError, match="prune_at >= 1"):
        BranchRule(prune_at=(0,))


def _member(i: int) -> Rollout:
    return Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=2,
                   sample_id=f"m{i}")


def test_a_pruned_child_is_a_spare_again_and_its_record_its_prompt():
    root, c1, c2 = _member(0), _member(1), _member(2)
    root.tokens += [7, 8, 9]
    table = TreeTable()
    table.plant(root, [c1, c2])
    assert table.spawn(root.sample_id) is c1
    inherit(c1, root, 3)
    c1.append(5, -0.5, 0, "forced")
    assert table.prune(c1) == []  # the root is still in the engine
    assert c1.tokens == [1, 2] and c1.spans == [Span(0, 2, "prompt")]
    assert c1.parent_id is None and c1.prefix_len == 0 and c1.finish == "running"
    assert table.held() == {"m1", "m2"}
    assert table.spawn(root.sample_id) is c1  # first again: spares keep their order
    # the root ends, then its last live member is pruned: the spares run alone
    assert table.end([root.sample_id]) == []
    assert table.prune(c1) == [c1, c2]
    assert not table


def _tree(model, tok, rule):
    eng = TorchEngine(model, tok, max_batch=16)
    root = make(tok, PROMPT, max_new_tokens=12, seed=5, branch_rule=rule)
    spares = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i, branch_rule=rule)
              for i in range(3)]
    eng.branch(root, spares)
    while eng.pending():
        eng.step()
    return eng.stats(), root, spares


def test_branches_too_like_their_parent_are_pruned_and_replaced(lm):
    model, tok = lm
    # the rule fires at response positions 0, 1, 2 (tests/engine/test_branch.py's RULE)
    loose = dict(tau_abs=0.04, tau_rel=0.05)
    _, root, spares = _tree(model, tok, BranchRule(**loose, prune_at=()))
    P = root.prompt_len
    assert [c.prefix_len - P for c in spares] == [0, 1, 2]
    # Without pruning, the 8-token windows from each branch point:
    #   root  [43, 18, 41, 56, 39, 16, 9, 82, 9, ...]
    #   c1 @0 [51, 10, 85, 85, 95, 91, 34, 9]   vs root[0:8]: only 9 shared, LCS 1
    #   c2 @1 [82, 84, 37, 5, 55, 8, 7, 50]     vs root[1:9]: only 82 shared, LCS 1
    #   c3 @2 [24, 21, 85, 7, 88, 67, 74, 68]   vs root[2:10]: nothing shared
    # ROUGE-L F1 = 2 (1/8)(1/8) / (2/8) = 1/8 for c1 and c2, 0 for c3.
    resp = [r.tokens[P:] for r in (root, *spares)]
    assert resp[0][:9] == [43, 18, 41, 56, 39, 16, 9, 82, 9]
    assert [resp[1][:8], resp[2][1:9], resp[3][2:10]] == [
        [51, 10, 85, 85, 95, 91, 34, 9], [82, 84, 37, 5, 55, 8, 7, 50],
        [24, 21, 85, 7, 88, 67, 74, 68]]
    assert [rouge_l(resp[k][k - 1:k + 7], resp[0][k - 1:k + 7]) for k in (1, 2, 3)] == [
        0.125, 0.125, 0.0]
    # With pruning at ROUGE-L > 0 after 8 tokens: c1 and c2 are pruned when their windows
    # end (root positions 7 and 8), c3 is kept; the rule fires on the root again at 8 and 9
    # and the two spares branch off there (their windows would end past the 12-token limit)
    stats, root, spares = _tree(model, tok, BranchRule(
        **loose, prune_at=(8,), prune_edit=0.0, prune_rouge_l=0.0))
    assert stats["branch_pruned"] == 2 and stats["branch_children"] == 5
    assert stats["branch_spares_independent"] == 0
    assert [(c.parent_id, c.prefix_len - P) for c in spares] == [
        (root.sample_id, 8), (root.sample_id, 9), (root.sample_id, 2)]
    for c in (root, *spares):
        assert c.finish == "length" and len(c.tokens) == P + 12
        c.check()
    for c in spares:  # a branch's record is its parent's prefix, then its own tokens
        t = c.prefix_len
        assert c.tokens[:t] == root.tokens[:t] and c.spans[-2].source == "forced"

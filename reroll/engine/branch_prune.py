"""LATR's lookahead pruning as pure functions on token lists: how similar a branch's
continuation is to its parent's over a window, and whether that prunes the branch.

Owns the three measures (`edit_ratio`, `rouge_l`, `suffix_share`) and the decision
(`too_similar`) for a `reroll.rollout.BranchRule`. Knows nothing of requests, trees or
tensors: `reroll.engine.plugins.branches` picks the windows (``prune_at`` tokens after a
branch point, where neither member has finished) and retires the branches pruned.

LATR's reference code (github.com/starreeze/latr, ``model/sample_filter.py``,
``RolloutFilter.__call__``; the measures in ``model/metrics.py``) compares a branch with
the branch it forked from ``rollout_filter_steps`` = 20, 30 and 50 decode steps after its
birth, over the tokens since the branch point, and removes it when any test says the two
are alike: edit distance / window < 0.4 (its default), ROUGE-L F1 > its threshold, the
longest shared suffix / window > its threshold (its math scripts: 0.5 and 0.2, the edit
test off). Written here from that description.
"""

from __future__ import annotations


def edit_ratio(a: list[int], b: list[int]) -> float:
    """Levenshtein distance of ``a`` and ``b`` (insert, delete, substitute: cost 1 each) over
    ``len(a)`` (the window; ``a`` and ``b`` have its length). 0 for an empty window."""
    if not a:
        return 0.0
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1] / len(a)


def lcs_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common subsequence of ``a`` and ``b``."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(a: list[int], b: list[int]) -> float:
    """ROUGE-L F1: with ``l`` the LCS length, ``2 P R / (P + R)`` for ``P = l / len(a)``,
    ``R = l / len(b)``; 0 when they share nothing."""
    if not a or not b:
        return 0.0
    lcs = lcs_len(a, b)
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


def _longest_suffix_inside(a: list[int], b: list[int]) -> int:
    """The largest ``k`` such that ``a[-k:]`` occurs contiguously in ``b`` (0 if none)."""
    best = 0
    for k in range(1, len(a) + 1):
        s = a[len(a) - k:]
        if any(b[i:i + k] == s for i in range(len(b) - k + 1)):
            best = k
        else:
            break  # a longer suffix contains this one, so it cannot occur either
    return best


def suffix_share(a: list[int], b: list[int]) -> float:
    """The longest suffix of either list that occurs contiguously in the other, over
    ``len(a)`` (the window). 0 for an empty window."""
    if not a:
        return 0.0
    return max(_longest_suffix_inside(a, b), _longest_suffix_inside(b, a)) / len(a)


def too_similar(a: list[int], b: list[int], rule) -> bool:
    """Whether branch tokens ``a`` are too close to its parent's ``b`` over one window for a
    `BranchRule` ``rule``: any of its tests (``prune_edit``, ``prune_rouge_l``,
    ``prune_suffix``) says so."""
    return ((rule.prune_edit > 0 and edit_ratio(a, b) < rule.prune_edit)
            or (rule.prune_rouge_l < 1 and rouge_l(a, b) > rule.prune_rouge_l)
            or (rule.prune_suffix < 1 and suffix_share(a, b) > rule.prune_suffix))

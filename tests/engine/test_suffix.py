"""DAS's suffix index (reroll.engine.suffix): proposals computed by hand on small token lists,
the length-aware budget, the source's validation and its round trip through JSON."""

import pytest

from reroll.engine.suffix import SuffixIndex, index_of, majority_path
from reroll.rollout import Rollout, SuffixSource

RESPONSES = ((1, 2, 3, 4), (5, 2, 3, 9), (2, 3, 4, 7))


def test_the_longest_matching_suffix_decides_the_continuation():
    ix = SuffixIndex(RESPONSES)
    # "2 3" is followed by 4 (twice) and 9 (once): 4; then "4" continues with 7 (one of two
    # continuations ends at 4, so 7 is the only token on the path)
    assert ix.propose([8, 2, 3], 5) == [4, 7]
    # "5 2 3" occurs once, in the second response only: its continuation wins over "2 3"'s
    assert ix.propose([5, 2, 3], 5) == [9]
    # "1 2" matches the first response only
    assert ix.propose([7, 1, 2], 5) == [3, 4]
    # the budget cuts the path
    assert ix.propose([8, 2, 3], 1) == [4]
    assert ix.propose([8, 2, 3], 0) == []


def test_no_match_or_a_match_at_the_end_of_every_response_proposes_nothing():
    ix = SuffixIndex(RESPONSES)
    assert ix.propose([6], 4) == []  # 6 occurs nowhere
    assert ix.propose([9], 4) == []  # 9 ends its response: nothing follows it
    assert ix.propose([], 4) == []  # an empty context has no suffix of min_match >= 1


def test_ties_go_to_the_smallest_id_and_min_count_falls_back_to_a_shorter_suffix():
    ix = SuffixIndex(((3, 8, 1), (3, 6, 2), (4, 3, 6, 5)))
    # "3" is followed by 8 once and 6 twice: 6, then 2 and 5 once each: the smaller, 2
    assert ix.propose([3], 4) == [6, 2]
    # with min_count 2: "4 3" occurs once (nothing shared by 2); "3" gives 6 (2 agree), then
    # 2 and 5 once each: the path stops
    ix2 = SuffixIndex(((3, 8, 1), (3, 6, 2), (4, 3, 6, 5)), min_count=2)
    assert ix2.propose([4, 3], 4) == [6]
    # max_match bounds the suffix: with max_match 1, "5 2 3" matches only as "3"
    ix3 = SuffixIndex(RESPONSES, max_match=1)
    assert ix3.propose([5, 2, 3], 5) == [4, 7]
    # min_match 2: a single matching token is not enough
    ix4 = SuffixIndex(RESPONSES, min_match=2)
    assert ix4.propose([8, 3], 5) == [] and ix4.propose([2, 3], 5) == [4, 7]


def test_the_budget_grows_with_the_tokens_generated_past_the_mean_response_length():
    ix = SuffixIndex(((1,) * 4, (2,) * 6), draft_len=3, max_draft=10)  # mean length 5
    assert [ix.budget(g) for g in (0, 4, 5, 9, 10, 15, 40)] == [3, 3, 6, 6, 9, 10, 10]


def test_majority_path_honours_min_count_and_limit():
    assert majority_path([[1, 2, 3], [1, 2, 4], [1, 5]], 2) == [1, 2]
    assert majority_path([[1, 2, 3], [1, 2, 4], [1, 5]], 1, limit=2) == [1, 2]
    assert majority_path([[1, 2, 3], [1, 2, 3]], 1, limit=None) == [1, 2, 3]
    assert majority_path([], 1) == []


def test_a_source_is_validated_shared_and_round_trips_through_json():
    with pytest.raises(ValueError, match="min_match"):
        SuffixSource(((1, 2),), min_match=3, max_match=2)
    with pytest.raises(ValueError, match="draft_len"):
        SuffixSource(((1, 2),), draft_len=0)
    src = SuffixSource([[1, 2], [3]], max_match=4, draft_len=2)
    assert src.responses == ((1, 2), (3,))
    assert index_of(src) is index_of(SuffixSource(((1, 2), (3,)), max_match=4, draft_len=2))
    r = Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=2)
    r.sampling.redraft = src
    assert Rollout.from_json(r.to_json()).sampling.redraft == src

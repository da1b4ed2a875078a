"""Records: invariants, growth by the engine, JSON round trip, and the no-torch rule."""

import subprocess
import sys

import pytest

from reroll.rollout import Example, Group, Rollout, SamplingParams, Score, Span, new_group


def make_rollout() -> Rollout:
    r = Rollout(prompt_id="p1", group_id="g1", tokens=[2, 5, 6], prompt_len=3,
                sampling=SamplingParams(temperature=0.7, seed=3))
    r.append(9, -0.5, version=0)
    r.append(10, -1.25, version=0)
    r.append(11, -2.0, version=1)  # resumed under new weights
    r.append(40, 0.0, version=-1, source="env")
    r.finish = "stop"
    r.scores = [Score("numeric", value=1.0, info={"parsed": "12"}),
                Score("format", error="TimeoutError: 10s")]
    return r


def test_append_keeps_fields_aligned_and_spans_by_version():
    r = make_rollout()
    assert r.tokens == [2, 5, 6, 9, 10, 11, 40]
    assert r.loss_mask == [False, False, False, True, True, True, False]
    assert r.logprobs == [0.0, 0.0, 0.0, -0.5, -1.25, -2.0, 0.0]
    assert r.versions == [-1, -1, -1, 0, 0, 1, -1]
    assert r.spans == [Span(0, 3, "prompt"), Span(3, 5, "sampled", 0), Span(5, 6, "sampled", 1),
                       Span(6, 7, "env", -1)]
    assert r.response_tokens == [9, 10, 11, 40] and r.response_len == 4 and r.n_sampled == 3
    assert r.min_version == 0 and r.finished and r.failed  # one score is an error


def test_json_round_trip_is_exact():
    r = make_rollout()
    back = Rollout.from_json(r.to_json())
    assert back == r
    g = Group("g1", Example("p1", "1+2=", "3", demo="3", fields={"k": [1, 2]}), 1, [r], 0)
    assert Group.from_json(g.to_json()) == g


def test_score_needs_exactly_one_of_value_or_error():
    with pytest.raises(ValueError, match="exactly one"):
        Score("x")
    with pytest.raises(ValueError, match="exactly one"):
        Score("x", value=1.0, error="boom")


def test_misaligned_fields_are_rejected():
    with pytest.raises(ValueError, match="lengths"):
        Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=1, loss_mask=[False],
                logprobs=[0.0, 0.0], versions=[-1, -1])
    with pytest.raises(ValueError, match="unknown Rollout fields"):
        Rollout.from_dict({**make_rollout().to_dict(), "advantage": 1.0})


def test_new_group_gives_independent_rollouts():
    g = new_group(Example("p", "1+1=", "2"), 3, [2, 5], SamplingParams(), version=4)
    g.rollouts[0].append(7, -0.1, 4)
    assert [len(r.tokens) for r in g.rollouts] == [3, 2, 2]
    assert [r.index_in_group for r in g.rollouts] == [0, 1, 2]
    assert not g.complete and g.start_version == 4
    for r in g.rollouts:
        r.finish = "stop"
    assert g.complete


def test_records_import_without_torch_or_ray():
    code = ("import sys, reroll.rollout, reroll.config, reroll.registry; "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)

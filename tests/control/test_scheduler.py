"""The scheduler's bookkeeping, with workflows simulated by hand (which group finishes when is
chosen by the test): a prompt whose scoring keeps failing is retried, then given up with a
warning (never trained as a silent 0) and never drawn again; consecutive-failure counts reset
after a success; counters survive a snapshot/restore; per-group ordering state does not grow
with the run; admission counts samples; a long group overtaken by short ones is waited for at
its last admissible version, not dropped as stale; the drop-run stop names its real reason."""

import pytest

from reroll.control.prompts import PromptStream
from reroll.control.scheduler import Scheduler
from reroll.rollout import Example, SamplingParams, Score, new_group


def starter(group_size):
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    return lambda ex, seq, version, **plan: new_group(ex, group_size, [1, 2, 3], sp, version)


def make(n=4, retries=3, group_size=2, batch_groups=1, max_staleness=0, filters=()):
    exs = [Example(f"p{i}", f"{i}+{i}=", str(2 * i)) for i in range(n)]
    return Scheduler(PromptStream(exs, seed=0), starter(group_size), group_size=group_size,
                     batch_groups=batch_groups, max_staleness=max_staleness,
                     max_score_retries=retries, filters=filters)


def finish(s, g, broken=(), reward=1.0):
    """What a workflow does: one sampled token per rollout, then scores; then close."""
    for r in g.rollouts:
        r.append(7, -1.0, g.start_version)
        r.finish = "stop"
        if g.example.prompt_id in broken:
            r.scores = [Score(name="exact", error="ValueError: cannot parse gold answer")]
        else:
            r.scores, r.reward = [Score(name="exact", value=reward)], reward
    s.close(g)


def run_steps(s, broken, until, steps=50):
    """Admit, finish every group (scripted scores), hand out a batch, next version."""
    got, version = [], 0
    for _ in range(steps):
        for g in s.admit(version):
            finish(s, g, broken=broken)
        part = s.take(s.batch, trainer_version=version)
        got += part
        version += bool(part)
        if until(got):
            return got
    raise AssertionError("the scheduler made no progress")


def test_failing_prompt_is_retried_then_abandoned_with_a_warning_and_never_drawn_again():
    s = make(n=2, retries=2)
    with pytest.warns(RuntimeWarning, match="prompt 'p0': scoring failed 3 times, giving up"):
        run_steps(s, {"p0"}, until=lambda got: s.abandoned)
    # tries 1 and 2 are retried (2 <= retries), the 3rd failure abandons the prompt
    assert s.abandoned == ["p0"] and s.score_failures["p0"] == 3
    assert s.dropped["scoring_error"] == 3 and s.dropped["scoring_abandoned"] == 1
    assert s.score_errors["exact"] == 3 * 2  # 3 groups x 2 samples, each counted
    later = run_steps(s, {"p0"}, until=lambda got: len(got) >= 6)
    assert {g.example.prompt_id for g in later} == {"p1"}  # p0 is never drawn again
    assert s.dropped["scoring_error"] == 3  # so it never fails again


def test_good_prompts_flow_past_a_broken_one():
    s = make(retries=1)
    got, version = [], 0
    with pytest.warns(RuntimeWarning, match="'p1'"):
        while len(got) < 6:
            for g in s.admit(version):
                finish(s, g, broken={"p1"})
            part = s.take(2, trainer_version=version)
            got += part
            version += bool(part)
    assert "p1" not in {g.example.prompt_id for g in got}
    assert s.abandoned == ["p1"] and s.dropped["scoring_error"] == 2


def test_a_success_resets_the_consecutive_failure_count():
    s = make(n=1, retries=2)
    flaky = iter([True, True, False, True, True, False])  # fails twice, then succeeds
    for version in range(2):
        while True:
            (g,) = s.admit(version)
            finish(s, g, broken={"p0"} if next(flaky) else ())
            if s.take(2, version):
                break
    # never 3 failures in a row: not abandoned, and the count is back to 0 after each success
    assert not s.abandoned and s.score_failures["p0"] == 0
    assert s.dropped["scoring_error"] == 4


def test_counters_round_trip_and_order_is_pruned():
    s = make(retries=5)
    with pytest.warns(RuntimeWarning, match="'p2'"):
        run_steps(s, {"p2"}, until=lambda got: len(got) >= 5)
    assert s.admit(5)  # one group left running
    c = s.counters()
    assert c["consumed"] == 5 and c["abandoned"] == ["p2"]
    assert c["dropped"] == {"scoring_error": 6, "scoring_abandoned": 1}
    # only groups still ready or running keep an admission number
    assert set(s.order) == {g.group_id for g in s.ready} | set(s.running)
    assert set(c["order"]) == set(s.order)
    t = make(retries=5)
    rerun = t.restore(s.snapshot(), c)
    assert t.counters() == c  # consumed, dropped, score errors and failures all carried
    assert t.score_errors == s.score_errors and t.score_failures == s.score_failures
    assert [g.group_id for g in rerun] == list(s.running)  # unfinished ones run again


def test_admission_counts_samples():
    # batch = 2 groups x 4 samples = 8; max_staleness 1: (1 + 0 + 1) * 8 = 16 samples = 4 groups
    s = make(n=8, group_size=4, batch_groups=2, max_staleness=1)
    assert len(s.admit(0)) == 4 and s.free_capacity(0) == 0
    g = next(iter(s.running.values()))
    finish(s, g)  # accepted samples still count until consumed: no room yet
    assert s.admit(0) == []
    assert [x.group_id for x in s.take(8, trainer_version=0)] == [g.group_id]  # 4 of 8
    # version 1: (1 + 1 + 1) * 8 = 24 - (4 accepted, consumed ones included, + 12 running)
    # = 8 samples: 2 more groups of 4
    assert len(s.admit(1)) == 2


def staleness_one(n=6, max_staleness=1):
    """One single-sample group per step."""
    return make(n=n, group_size=1, batch_groups=1, max_staleness=max_staleness)


def test_a_long_group_overtaken_by_short_ones_is_waited_for_not_dropped_as_stale():
    s = staleness_one()
    old, young = s.admit(0)  # max_staleness 1: room for (1 + 0 + 1) x 1 = 2 groups
    finish(s, young)  # the short one finishes first
    # trainer version 0: the long group has lag 0 < 1, so the ready young one is trained now
    assert [g.group_id for g in s.take(1, trainer_version=0)] == [young.group_id]
    (third,) = s.admit(1)
    finish(s, third)  # finishes while the long one is still running
    assert len(s.ready) == 1 and old.group_id in s.running
    # trainer version 1: the long group reaches its last admissible version (lag 1), so the
    # one slot is held for it; the ready younger group is not handed out ahead of it
    assert s.take(1, trainer_version=1) == []
    finish(s, old)
    assert [g.group_id for g in s.take(1, trainer_version=1)] == [old.group_id]
    assert s.dropped["stale"] == 0 and s.n_consumed == 2
    assert len(s.ready) == 1  # the younger group waits for the next step, within its bound


def test_a_young_group_is_not_trained_ahead_of_old_ones_that_would_then_miss_their_deadline():
    # max_staleness 2, one group a step: 3 groups start at version 0 (deadline 2); two are long
    s = staleness_one(max_staleness=2)
    a, b, c = s.admit(0)
    finish(s, b)
    assert [g.group_id for g in s.take(1, trainer_version=0)] == [b.group_id]
    (d,) = s.admit(1)  # start 1, deadline 3; it finishes at once
    finish(s, d)
    # version 1: a and c (deadline 2) are still running and version 2 has one slot, so one
    # of them must train now; d would take that slot (a drop-stale scheduler takes d here)
    assert s.take(1, trainer_version=1) == []
    finish(s, a)
    finish(s, c)
    assert [g.group_id for g in s.take(1, trainer_version=1)] == [a.group_id]
    assert [g.group_id for g in s.take(1, trainer_version=2)] == [c.group_id]
    assert [g.group_id for g in s.take(1, trainer_version=3)][0] == d.group_id
    assert s.dropped["stale"] == 0


def test_a_group_already_past_the_bound_is_dropped_counted_and_its_prompt_retried():
    s = staleness_one()
    for g in s.admit(0):
        finish(s, g)
    assert len(s.ready) == 2
    prompts = {g.example.prompt_id for g in s.ready}
    # e.g. resumed with a smaller max_staleness: at trainer version 2 a version-0 group has lag 2
    got = s.take(1, trainer_version=2)
    assert got == [] and s.dropped["stale"] == 2 and s.n_accepted == 0 and s.s_accepted == 0
    assert {s.prompts.next().prompt_id for _ in range(2)} == prompts  # both retried next
    assert s.n_consumed == 0


def test_the_drop_run_stop_names_the_real_reason_and_the_last_error():
    s = make(n=2, retries=10**6)
    s.max_drop_run = 3
    with pytest.raises(RuntimeError, match=r"4 groups in a row.*scoring_error.*cannot parse "
                                           r"gold answer.*verifier is broken"):
        for _ in range(4):
            s.s_accepted = 0
            for g in s.admit(0):
                finish(s, g, broken={"p0", "p1"})
    zero = make(n=2, filters=[lambda g: "zero_variance"])
    zero.max_drop_run = 1
    with pytest.raises(RuntimeError, match="zero_variance.*Dynamic sampling") as e:
        for _ in range(2):
            for g in zero.admit(0):
                finish(zero, g)
    assert "scoring error" not in str(e.value)

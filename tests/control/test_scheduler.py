"""The scheduler's bookkeeping with a scripted engine and scorer: a prompt whose scoring keeps
failing is retried, then given up with a warning (never trained as a silent 0); counters
survive a snapshot/restore; per-group ordering state does not grow with the run; a long group
overtaken by short ones is waited for at its last admissible version, not dropped as stale."""

from concurrent.futures import Future

import pytest

from reroll.control.prompts import PromptStream
from reroll.control.scheduler import Scheduler
from reroll.rollout import Example, SamplingParams, Score


class OneTokenEngine:
    """Finishes every request with one token on the next step."""

    def __init__(self):
        self.version, self.queue = 0, []

    def add(self, rs):
        self.queue += rs

    def pending(self):
        return len(self.queue)

    def step(self):
        done, self.queue = self.queue, []
        for r in done:
            r.tokens.append(7)
            r.logprobs.append(-1.0)
            r.versions.append(self.version)
            r.loss_mask.append(True)
            r.finish = "stop"
        return done

    def abort(self, ids=None):
        return []


class ScriptedScorer:
    """Scores 1.0, except prompts in `broken`, whose verifier raises."""

    def __init__(self, broken=()):
        self.broken = set(broken)

    def submit(self, r, ex):
        f = Future()
        if ex.prompt_id in self.broken:
            f.set_result([Score(name="exact", error="ValueError: cannot parse gold answer")])
        else:
            f.set_result([Score(name="exact", value=1.0)])
        return f

    def combine(self, scores):
        return scores[0].value


def make(broken=(), n=4, retries=3):
    exs = [Example(f"p{i}", f"{i}+{i}=", str(2 * i)) for i in range(n)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=1)
    return Scheduler(OneTokenEngine(), ScriptedScorer(broken), PromptStream(exs, seed=0),
                     lambda t: [1, 2, 3], sp, group_size=2, batch_groups=1,
                     max_staleness=0, max_score_retries=retries)


def run_until(s, n_ready, ticks=200):
    for _ in range(ticks):
        s.tick()
        if len(s.ready) >= n_ready:
            return
    raise AssertionError("scheduler made no progress")


def test_failing_prompt_is_retried_then_abandoned_with_a_warning():
    s = make(broken={"p0", "p1", "p2", "p3"}, n=1, retries=2)
    with pytest.warns(RuntimeWarning, match="prompt 'p0': scoring failed 3 times, giving up"):
        for _ in range(10):
            s.tick()
            if s.abandoned:
                break
    # tries 1 and 2 are retried (2 <= retries), the 3rd failure abandons the prompt
    assert s.abandoned == ["p0"]
    assert s.score_failures["p0"] == 3
    assert s.dropped["scoring_error"] == 3 and s.dropped["scoring_abandoned"] == 1
    assert s.score_errors["exact"] == 3 * 2  # 3 groups x 2 samples, each counted
    assert s.n_accepted == 0 and not s.ready  # nothing trained


def test_good_prompts_flow_past_a_broken_one():
    s = make(broken={"p1"}, retries=1)
    got = []
    with pytest.warns(RuntimeWarning, match="'p1'"):
        while len(got) < 6:
            run_until(s, 1)
            got += s.take(1, trainer_version=s.engine.version)
            s.engine.version += 1
    assert "p1" not in {g.example.prompt_id for g in got}
    assert s.abandoned == ["p1"] and s.dropped["scoring_error"] == 2


def test_counters_round_trip_and_order_is_pruned():
    s = make(broken={"p2"}, retries=5)
    with pytest.warns(RuntimeWarning, match="'p2'"):
        for _ in range(5):
            run_until(s, 1)
            s.take(1, trainer_version=s.engine.version)
            s.engine.version += 1
    c = s.counters()
    assert c["abandoned"] == ["p2"] and c["consumed"] == 5
    # only groups still ready or running keep an admission number
    assert set(s.order) == {g.group_id for g in s.ready} | set(s.running)
    assert set(c["order"]) == set(s.order)
    t = make(broken={"p2"}, retries=5)
    t.restore(s.snapshot(), c)
    assert t.counters() == c  # consumed, dropped, score errors and failures all carried
    assert t.score_errors == s.score_errors and t.score_failures == s.score_failures


class LengthEngine(OneTokenEngine):
    """Finishes a request after `lengths[prompt_id]` steps (default 1), one token a step."""

    def __init__(self, lengths):
        super().__init__()
        self.lengths = lengths

    def step(self):
        done, still = [], []
        for r in self.queue:
            r.tokens.append(7)
            r.logprobs.append(-1.0)
            r.versions.append(self.version)
            r.loss_mask.append(True)
            if len(r.tokens) - r.prompt_len >= self.lengths.get(r.prompt_id, 1):
                r.finish = "stop"
                done.append(r)
            else:
                still.append(r)
        self.queue = still
        return done


def staleness_one(n=6, max_staleness=1):
    """One group per step; every request takes one step until told otherwise."""
    exs = [Example(f"p{i}", f"{i}+{i}=", str(2 * i)) for i in range(n)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    return Scheduler(LengthEngine({}), ScriptedScorer(), PromptStream(exs, seed=0),
                     lambda t: [1, 2, 3], sp, group_size=1, batch_groups=1,
                     max_staleness=max_staleness)


def test_a_long_group_overtaken_by_short_ones_is_waited_for_not_dropped_as_stale():
    s = staleness_one()
    s.admit()  # version 0, max_staleness 1: room for (1 + 0 + 1) x 1 = 2 groups
    old, young = sorted(s.running.values(), key=lambda g: s.order[g.group_id])
    s.engine.lengths = {old.example.prompt_id: 5}  # the first-admitted group is the long one
    s.tick()
    assert [g.group_id for g in s.ready] == [young.group_id]  # the short one finished first
    # trainer version 0: the long group has lag 0 < 1, so the ready young one is trained now
    assert [g.group_id for g in s.take(1, trainer_version=0)] == [young.group_id]
    s.engine.version = 1
    s.tick()  # admits one more (short) group; it finishes while the long one is still running
    assert len(s.ready) == 1 and old.group_id in s.running
    # trainer version 1: the long group reaches its last admissible version (lag 1), so the
    # one slot is held for it; the ready younger group is not handed out ahead of it
    assert s.take(1, trainer_version=1) == []
    for _ in range(5):
        s.tick()
    got = s.take(1, trainer_version=1)
    assert [g.group_id for g in got] == [old.group_id]
    assert s.dropped["stale"] == 0 and s.n_consumed == 2
    assert len(s.ready) == 1  # the younger group waits for the next step, within its bound


def test_a_young_group_is_not_trained_ahead_of_old_ones_that_would_then_miss_their_deadline():
    # max_staleness 2, one group a step: 3 groups start at version 0 (deadline 2); two are long
    s = staleness_one(max_staleness=2)
    s.admit()
    a, b, c = sorted(s.running.values(), key=lambda g: s.order[g.group_id])
    s.engine.lengths = {a.example.prompt_id: 6, c.example.prompt_id: 6}
    s.tick()
    assert [g.group_id for g in s.take(1, trainer_version=0)] == [b.group_id]
    s.engine.version = 1
    s.tick()  # admits d (start 1, deadline 3); it finishes at once
    (d,) = s.ready
    # version 1: a and c (deadline 2) are still running and version 2 has one slot, so one
    # of them must train now; d would take that slot (a drop-stale scheduler takes d here)
    assert s.take(1, trainer_version=1) == []
    for _ in range(6):
        s.tick()
    assert [g.group_id for g in s.take(1, trainer_version=1)] == [a.group_id]
    s.engine.version = 2
    assert [g.group_id for g in s.take(1, trainer_version=2)] == [c.group_id]
    s.engine.version = 3
    assert [g.group_id for g in s.take(1, trainer_version=3)][0] == d.group_id
    assert s.dropped["stale"] == 0


def test_a_group_already_past_the_bound_is_dropped_counted_and_its_prompt_retried():
    s = staleness_one()
    s.admit()
    s.tick()
    assert len(s.ready) == 2
    prompts = {g.example.prompt_id for g in s.ready}
    # e.g. resumed with a smaller max_staleness: at trainer version 2 a version-0 group has lag 2
    got = s.take(1, trainer_version=2)
    assert got == [] and s.dropped["stale"] == 2 and s.n_accepted == 0
    assert {s.prompts.next().prompt_id for _ in range(2)} == prompts  # both retried next
    assert s.n_consumed == 0

"""The scheduler's bookkeeping with a scripted engine and scorer: a prompt whose scoring keeps
failing is retried, then given up with a warning (never trained as a silent 0); counters
survive a snapshot/restore; per-group ordering state does not grow with the run."""

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

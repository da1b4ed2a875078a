"""kill -9 at random points and inside the risky windows (a checkpoint being written, a
resume truncating the logs, the initial model being saved), then resume until the run ends:
no group lost, none trained twice, every step's metrics row exactly once, every group a
checkpoint held later trained. The atomicity of the truncation itself is also tested
directly in tests/faults/test_runs_and_files.py. Twenty kills at random moments run here on
processes forked from a warm interpreter (`harness.Forker`); the longer soak on fresh
interpreters is `benchmarks/faults.py`."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Forker, run_trial  # noqa: E402

CASES = [
    ("random_sync", dict(seed=1, staleness=0, plan=("random",))),
    ("random_async_twice", dict(seed=2, staleness=2, plan=("random", "random"))),
    ("inside_checkpoint_write", dict(seed=3, staleness=2, plan=("checkpoint",))),
    # found by the soak: a kill while the tiny model was being saved left init/ with a
    # config and no weights, and every later start failed on it
    ("inside_building_the_initial_model", dict(seed=5, staleness=0, plan=("init",))),
    # per-version weight snapshots (train.old_snapshots) written with every checkpoint
    ("snapshots_async_inside_checkpoint_write",
     dict(seed=6, staleness=2, plan=("checkpoint", "random"), extra=("train.old_snapshots=4",))),
]


def check(t):
    assert t.rows == list(range(1, t.steps + 1)), t  # each step's row, exactly once, in order
    assert t.groups_twice == 0 and t.groups_lost == 0, t
    assert t.consumed == t.steps * t.batch and t.survived, t


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_kill9_then_resume_loses_nothing_and_repeats_nothing(tmp_path, name, kw):
    t = run_trial(tmp_path, **kw)
    if kw["plan"][-1] in ("checkpoint", "init"):  # these windows last long enough to hit
        assert not t.kills[-1].startswith("missed"), t.kills
    check(t)


def test_kill9_inside_resume_truncation(tmp_path):
    """The resume's logs carry rows past the checkpoint to cut (8 MB, as a long run leaves),
    so the truncation lasts long enough to be hit; a miss is retried (at most 3 runs)."""
    for attempt in range(3):
        t = run_trial(tmp_path / f"try{attempt}", seed=4 + 10 * attempt, staleness=2,
                      plan=("checkpoint", "truncate"))
        if t.kills[-1] == "inside resume truncation":
            break
    assert t.kills == ["inside a checkpoint write", "inside resume truncation"], t.kills
    assert t.logs_cut == 0, t  # each log was the original or its cut, never part of one
    check(t)


def test_twenty_kills_at_random_moments(tmp_path):
    """Runs killed and resumed again and again, each kill at a random moment 0-0.8 s after the
    process started (start-up, resume, truncation, steps, checkpoint writes), sync and async
    runs in turn; a run that ends before its next kill is checked and the next one starts,
    until 20 kills have landed."""
    landed, runs, where = 0, 0, []
    with Forker() as forker:
        while landed < 20:
            assert runs < 12, (landed, where)
            t = run_trial(tmp_path / f"run{runs}", seed=100 + runs, steps=40,
                          staleness=2 * (runs % 2), plan=("random",) * min(10, 20 - landed),
                          kill_s=(0.0, 0.8), forker=forker)
            check(t)
            landed += sum(k == "random" for k in t.kills)
            where += t.kills
            runs += 1
    assert landed == 20 and runs >= 2, where  # both a synchronous and an asynchronous run

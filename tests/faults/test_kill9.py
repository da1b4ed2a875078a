"""kill -9 at random points and inside the two risky windows (a checkpoint being written, a
resume truncating the logs), then resume until the run ends: no group lost, none trained
twice, every step's metrics row exactly once, every group a checkpoint held later trained.
The truncation window is too short to hit reliably on small logs (its atomicity is also
tested directly in tests/test_rundir.py). The 20-trial soak is `benchmarks/faults.py`."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import run_trial  # noqa: E402

CASES = [
    ("random_sync", dict(seed=1, staleness=0, plan=("random",))),
    ("random_async_twice", dict(seed=2, staleness=2, plan=("random", "random"))),
    ("inside_checkpoint_write", dict(seed=3, staleness=2, plan=("checkpoint",))),
    ("inside_resume_truncation", dict(seed=4, staleness=2, plan=("random", "truncate"))),
    # found by the soak: a kill while the tiny model was being saved left init/ with a
    # config and no weights, and every later start failed on it
    ("inside_building_the_initial_model", dict(seed=5, staleness=0, plan=("init",))),
]


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_kill9_then_resume_loses_nothing_and_repeats_nothing(tmp_path, name, kw):
    t = run_trial(tmp_path, **kw)
    if kw["plan"][-1] in ("checkpoint", "init"):  # these windows last long enough to hit
        assert not t.kills[-1].startswith("missed"), t.kills
    assert t.rows == list(range(1, t.steps + 1)), t  # each step's row, exactly once, in order
    assert t.groups_twice == 0 and t.groups_lost == 0, t
    assert t.consumed == t.steps * t.batch and t.survived

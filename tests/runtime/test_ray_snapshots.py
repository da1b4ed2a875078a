"""The loop's referenced-versions call with the trainer in a Ray actor: what the driver-side
`RayTrainer.step` passes is the set computed by hand from the groups the loop held, and the
snapshot metrics the actor returns count what the release rule keeps of it (the trainer
spies and hand computations of `tests/trainer/test_snapshot_loop.py`)."""

import sys
from pathlib import Path

from reroll.models import load
from reroll.runtime import train

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer"))
import test_snapshot_loop as loop  # noqa: E402  (the spies and the hand computations)


def test_the_ray_trainer_gets_the_referenced_versions_and_holds_them(
        ray_session, tmp_path, small_run, monkeypatch):
    from reroll.runtime.ray_trainer import RayTrainer

    seen, steps = loop.spy(monkeypatch, RayTrainer)
    out = tmp_path / "run"
    train(small_run(out, "runtime.kind=ray", "runtime.engine_workers=1", "train.steps=5",
                    "runtime.max_staleness=2", "train.old_snapshots=3"), progress=False)
    assert [s["version"] for s in steps] == list(range(5)) and len(seen) == 5
    for (held, got), s in zip(seen, steps):
        assert held["version"] == s["version"]
        assert got == s["refs"] == loop.by_hand(held, buffer=False)
    loop.referenced_until_trained(steps)
    # the actor's snapshots are copies of the run's starting model's state dict
    loop.check_held(steps, lag=2, cap=3, weight_bytes=loop.state_bytes(load(out / "init")[0]))
    assert any(s["metrics"]["offpol/snapshots_held"] > 1 for s in steps)
    assert all(s["metrics"]["offpol/snapshot_fallback_frac"] == 0.0 for s in steps)

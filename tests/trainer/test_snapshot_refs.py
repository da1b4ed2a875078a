"""Snapshot reference counting: the release rule by hand (referenced versions + held + cap ->
keep / release / evict), the versions the loop's unconsumed groups (and the replay stage's held
samples) reference, a trainer that drops a version as soon as nothing references it (its bytes
counted), and a checkpoint taken while a referenced version is held, resumed bitwise with that
version still used."""

import copy
import sys
from pathlib import Path

import pytest
import torch

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.control.staleness import referenced_versions
from reroll.models import load
from reroll.replay.bank import ResponseBank
from reroll.replay.buffer import ReplayBuffer
from reroll.replay.stage import Replay
from reroll.runlog import read_metrics
from reroll.runtime import train
from reroll.trainer.options import TrainerOptions
from reroll.trainer.snapshots import VersionSnapshots, release_plan
from reroll.trainer.step import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "control"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "replay"))
from test_buffer import group  # noqa: E402  (hand-made scored groups)
from test_scheduler import finish, make  # noqa: E402  (workflows simulated by hand)
from test_snapshot_loop import state_bytes  # noqa: E402  (one snapshot's bytes)
from test_step import groups_of  # noqa: E402  (the same tiny groups as the step's tests)


def test_release_plan_keeps_the_newest_referenced_up_to_the_cap():
    # held 2..6; referenced 3, 5, 6 (and 9, never snapshotted): 2 and 4 are released
    assert release_plan({2, 3, 4, 5, 6}, {3, 5, 6, 9}, cap=5) == ([3, 5, 6], [2, 4], [])
    # a cap of 2: the oldest referenced one (3) is evicted, its tokens will fall back
    assert release_plan({2, 3, 4, 5, 6}, {3, 5, 6, 9}, cap=2) == ([5, 6], [2, 4], [3])
    assert release_plan([], {1}, cap=1) == ([], [], [])
    assert release_plan([7], set(), cap=1) == ([], [7], [])
    with pytest.raises(ValueError, match="cap must be >= 1, got 0"):
        release_plan([1], {1}, cap=0)


def test_needed_is_the_current_version_and_the_referenced_ones_within_the_bound():
    s = VersionSnapshots(torch.nn.Linear(1, 1), max_snapshots=4, lag=3)
    # at version 10 a trained token is at least version 7: 5 and 6 are never needed again
    assert s.needed(10, {5, 6, 8}) == {8, 10}
    assert s.needed(10, set()) == {10}
    assert s.needed(10, None) == {7, 8, 9, 10}  # no loop: the admission bound alone
    assert s.needed(1, None) == {0, 1}


def test_referenced_versions_of_ready_and_running_groups():
    # ready groups' own sampled versions; a running group every version since its oldest
    assert referenced_versions([{1, 2}, {4}], [3], version=5) == {1, 2, 3, 4, 5}
    assert referenced_versions([], [], version=5) == set()
    assert referenced_versions([{0}], [-1], version=1) == {0, 1}  # a start version of -1


def test_the_scheduler_references_what_its_unconsumed_groups_hold():
    s = make(n=8, group_size=2, batch_groups=1, max_staleness=2)
    started = s.admit(0)  # (2 + 0 + 1) batches of one group: three groups at version 0
    assert len(started) == 3
    finish(s, started[0])  # ready, its tokens sampled at version 0
    assert s.referenced_versions(0) == {0}
    assert s.take(2, trainer_version=0) == [started[0]]
    # taken: only the two running groups (started at 0) remain; at version 2 they may hold
    # tokens of versions 0, 1 and 2
    assert s.referenced_versions(2) == {0, 1, 2}


def test_the_replay_stages_held_samples_are_referenced_while_held():
    s = make(n=8, group_size=2, batch_groups=1, max_staleness=2)
    s.replay = Replay(buffer=ReplayBuffer(1), bank=ResponseBank(1), is_success=lambda r:
                      r.reward >= 1.0)
    s.replay.buffer.add([group("p", [1.0, 0.0], version=1)], version=2)  # trained again later
    s.replay.bank.add([group("q", [1.0, 1.0], version=0)], s.replay.is_success)  # injected
    assert s.referenced_versions(3) == {0, 1}  # nothing ready or running: the stage's own
    s.replay.buffer.add([group("r", [0.0, 1.0], version=2)], version=3)  # evicts p's group
    assert s.referenced_versions(3) == {0, 2}
    # the trainer at version 3 with lag 2 keeps 2 (and the current 3); the bank's version-0
    # answer is below the bound: injected later, its tokens fall back to pi_prox
    snaps = VersionSnapshots(torch.nn.Linear(1, 1), max_snapshots=4, lag=2)
    assert snaps.needed(3, s.referenced_versions(3)) == {2, 3}


def groups_at(version):
    """`groups_of`'s two groups, their sampled tokens made at ``version``."""
    groups = groups_of([[1.0, 0.0], [0.0, 1.0]])
    for g in groups:
        for r in g.rollouts:
            r.versions = [version if m else -1 for m in r.loss_mask]
    return groups


def trainer(model, tok):
    return Trainer(model, build_objective(AlgoConfig()),
                   TrainerOptions(pad_id=0, lr=1e-2, old_snapshots=3, snapshot_lag=4),
                   tokenizer=tok)


def test_a_version_is_released_once_nothing_references_it(tiny):
    model, tok = tiny
    t = trainer(model, tok)
    m = t.step(groups_at(0), referenced={0})
    assert m["offpol/snapshots_held"] == 1.0  # version 0: the loop still holds tokens of it
    assert m["offpol/snapshot_bytes"] == float(state_bytes(model))
    # version 1 trains version-0 tokens under version 0's weights; after it nothing
    # references version 0 (the lag bound alone would hold it 4 more versions): released
    m = t.step(groups_at(0), referenced=set())
    assert m["offpol/snapshot_frac"] == 1.0 and m["offpol/snapshots_held"] == 1.0
    assert sorted(t.snapshots.weights) == [1] and m["offpol/snapshots_evicted"] == 0.0
    m = t.step(groups_at(0), referenced=set())  # a version-0 token now has none: falls back
    assert m["offpol/snapshot_fallback_frac"] == 1.0 and m["offpol/snapshot_frac"] == 0.0


def test_a_checkpoint_holding_a_referenced_version_resumes_bitwise(tiny, tmp_path):
    """Run a: 3 updates; run b: the first 2, a checkpoint, a fresh trainer resumed from it,
    the third. Version 0 is referenced at update 2, so it is in the checkpoint and update 3
    trains its tokens under it in both runs (had update 2 not referenced it, update 3
    would have fallen back: the control)."""
    model, tok = tiny
    w0 = copy.deepcopy(model.state_dict())
    a = trainer(model, tok)
    a.step(groups_at(0), referenced={0})
    a.step(groups_at(1), referenced={0, 1})
    ma = a.step(groups_at(0), referenced={2})
    wa = {k: v.clone() for k, v in model.state_dict().items()}
    assert ma["offpol/snapshot_frac"] == 1.0 and ma["offpol/snapshot_fallback_frac"] == 0.0

    model.load_state_dict(w0)
    b = trainer(model, tok)
    b.step(groups_at(0), referenced={0})
    b.step(groups_at(1), referenced={0, 1})
    ckpt = b.save_checkpoint(tmp_path, 2, {"version": b.version}, [])
    fresh = load(ckpt / "model")[0]  # as a new process would: weights from the checkpoint
    c = trainer(fresh, tok)
    c.resume(ckpt)
    assert sorted(c.snapshots.weights) == [0, 1] and c.version == 2  # 2: taken at update 3
    mc = c.step(groups_at(0), referenced={2})
    assert all(torch.equal(wa[k], v) for k, v in fresh.state_dict().items())
    assert mc == {k: v for k, v in ma.items() if k in mc} and mc.keys() == ma.keys()
    assert sorted(c.snapshots.weights) == sorted(a.snapshots.weights) == [2]

    model.load_state_dict(w0)  # the control: version 0 unreferenced at update 2
    d = trainer(model, tok)
    d.step(groups_at(0), referenced={0})
    d.step(groups_at(1), referenced={1})
    assert d.step(groups_at(0), referenced={2})["offpol/snapshot_fallback_frac"] == 1.0


def test_an_asynchronous_run_holds_only_referenced_snapshots(tmp_path, small_run):
    out = tmp_path / "run"
    train(small_run(out, "train.steps=5", "runtime.max_staleness=2", "train.old_snapshots=3"),
          progress=False)
    rows = [r for r in read_metrics(out) if r.get("step", 0) > 0]
    assert len(rows) == 5 and all(r["offpol/snapshot_fallback_frac"] == 0.0 for r in rows)
    held = [r["offpol/snapshots_held"] for r in rows]
    # the current version and the referenced ones below it: within the cap, never evicted
    assert all(1 <= h <= 3 for h in held) and rows[-1]["offpol/snapshots_evicted"] == 0.0
    per = rows[0]["offpol/snapshot_bytes"] / held[0]  # one copy of the weights
    assert all(r["offpol/snapshot_bytes"] == per * h for r, h in zip(rows, held))

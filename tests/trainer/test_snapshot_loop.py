"""The loop's referenced-versions call, pinned on real asynchronous runs: a spy on the
scheduler records the groups the loop holds when it computes the set (ready groups, groups in
flight, the replay stage's), a spy on the real trainer records what ``Trainer.step`` receives
and holds after each update. Checked against hand computations: the set from the held groups,
every version a later update trains was referenced at each step in between, the snapshots
held are the needed ones under the cap (`release_plan`'s rule written out), and the
``offpol/snapshots_held`` / ``offpol/snapshot_bytes`` metrics count them."""

import pytest

from reroll.control.scheduler import Scheduler
from reroll.runtime import train
from reroll.trainer.step import Trainer


def versions_of(rollouts) -> set[int]:
    """The versions the sampled (loss-masked) tokens of ``rollouts`` were generated at."""
    return {v for r in rollouts for v, m in zip(r.versions, r.loss_mask) if m}


def spy(monkeypatch, trainer=Trainer):
    """Record, per loop step, the held groups and the set the scheduler returned (``seen``),
    and what ``trainer.step`` got, returned and (a `Trainer` in this process) kept
    (``steps``)."""
    seen, steps = [], []
    referenced, step = Scheduler.referenced_versions, trainer.step

    def scheduler_refs(self, version):
        replay = self.replay
        held = {"version": version,
                "ready": [versions_of(g.rollouts) for g in self.ready],
                "running": [g.start_version for g in self.running.values()],
                "buffer": [versions_of(e["group"].rollouts) for e in replay.buffer.entries]
                if replay is not None and replay.buffer is not None else []}
        seen.append((held, referenced(self, version)))
        return seen[-1][1]

    def trainer_step(self, groups, referenced=None):
        version = self.version
        m = step(self, groups, referenced)
        rollouts = [r for g in groups for r in g.rollouts if r.loss_exclusion is None]
        tokens = [(v, r.reused) for r in rollouts  # the trained targets (position 0 never is)
                  for v, sampled in zip(r.versions[1:], r.loss_mask[1:]) if sampled]
        steps.append({"version": version, "refs": referenced, "metrics": m, "tokens": tokens,
                      "trained": {v for v, _ in tokens}})
        if isinstance(self, Trainer):
            # one snapshot is a clone of every state-dict entry: the model's parameter
            # bytes, a tied embedding/head counted twice (cloned twice)
            steps[-1].update(held=sorted(self.snapshots.weights), weight_bytes=state_bytes(
                self.model))
        return m

    monkeypatch.setattr(Scheduler, "referenced_versions", scheduler_refs)
    monkeypatch.setattr(trainer, "step", trainer_step)
    return seen, steps


def state_bytes(model) -> int:
    """One snapshot's bytes: each tensor of the state dict once (a tied embedding is one
    tensor under two names)."""
    unique = {t.untyped_storage().data_ptr(): t for t in model.state_dict().values()}
    return sum(t.numel() * t.element_size() for t in unique.values())


def by_hand(held: dict, *, buffer: bool) -> set[int]:
    """Ready groups: their tokens' versions; running groups: every version from their start
    (-1: 0) to the trainer's; with ``buffer``, the replay buffer's groups' versions."""
    out = set().union(*held["ready"], *(held["buffer"] if buffer else []))
    for since in held["running"]:
        out |= set(range(max(since, 0), held["version"] + 1))
    return out


def check_held(steps, *, lag: int, cap: int, weight_bytes: int | None = None) -> None:
    """The update at version i snapshots i, keeps the newest ``cap`` of the versions it
    still had that are needed (the current one and the referenced ones within the lag) or
    trained by its batch (the rest of those are evicted), and after its old log-probs drops
    those only the batch needed. Checked against the trainer's store where the spy saw it,
    and against the metrics (``weight_bytes``: one snapshot's, where the spy did not)."""
    prev, evicted = [], 0
    for s in steps:
        i = s["version"]
        needed = {v for v in s["refs"] if i - lag <= v <= i} | {i}
        during = sorted((needed | s["trained"]) & (set(prev) | {i}))[-cap:]
        evicted += len((needed | s["trained"]) & (set(prev) | {i})) - len(during)
        held = [v for v in during if v in needed]
        assert s.get("held", held) == held, (i, s["refs"], prev)
        m = s["metrics"]
        assert m["offpol/snapshots_held"] == len(held)
        assert m["offpol/snapshot_bytes"] == len(held) * s.get("weight_bytes", weight_bytes)
        assert m["offpol/snapshots_evicted"] == evicted
        prev = held


def referenced_until_trained(steps) -> None:
    """Every version v < j that the update at version j trains was referenced by every
    update strictly between v and j (at v itself it is the current version)."""
    refs = {s["version"]: s["refs"] for s in steps}
    for s in steps:
        j = s["version"]
        for v in s["trained"]:
            assert all(v in refs[i] for i in range(v + 1, j)), (v, j, refs)


@pytest.mark.parametrize("staleness,partial,over,cap", [
    (2, "true", 1.0, 3), (3, "false", 1.0, 2),
    (1, "true", 1.5, 3)])  # APRIL: the extra groups carry over, their lag one more
def test_the_loop_passes_the_versions_of_the_groups_it_holds(
        tmp_path, small_run, monkeypatch, staleness, partial, over, cap):
    seen, steps = spy(monkeypatch)
    train(small_run(tmp_path / "run", "train.steps=6", f"runtime.max_staleness={staleness}",
                    f"runtime.partial_rollouts={partial}", f"runtime.overprovision={over}",
                    f"train.old_snapshots={cap}"), progress=False)
    lag = staleness + (over > 1)
    assert [s["version"] for s in steps] == list(range(6)) and len(seen) == 6
    for (held, got), s in zip(seen, steps):
        assert held["version"] == s["version"] and got == s["refs"] == by_hand(held,
                                                                                 buffer=False)
    referenced_until_trained(steps)
    check_held(steps, lag=lag, cap=cap)
    assert any(len(s["held"]) > 1 for s in steps)  # an older version was held at some step
    if cap > lag:  # room for every version a token can carry: none ever falls back
        assert all(s["metrics"]["offpol/snapshot_fallback_frac"] == 0.0 for s in steps)


def test_the_replay_buffers_groups_are_referenced_until_replayed(tmp_path, small_run,
                                                                  monkeypatch):
    """Rollout replay holds consumed groups across steps and trains them again: their
    versions are referenced while buffered, so a replayed token within the lag has its own
    version's snapshot; one older than the lag falls back to the update's pi_prox."""
    seen, steps = spy(monkeypatch)
    train(small_run(tmp_path / "run", "train.steps=6", "runtime.max_staleness=2",
                    "train.old_snapshots=3", "replay.buffer_size=8", "replay.fresh_fraction=0.5"),
          progress=False)
    for (held, got), s in zip(seen, steps):
        assert got == s["refs"] == by_hand(held, buffer=True)
    referenced_until_trained(steps)
    check_held(steps, lag=2, cap=3)
    replayed = [(s["version"], v) for s in steps for v, reused in s["tokens"] if reused]
    assert any(j - 2 <= v < j for j, v in replayed)  # replayed within the lag: their own
    for s in steps:  # the tokens older than the lag (replayed ones) fall back, no other
        j, tokens = s["version"], s["tokens"]
        old = sum(v < j - 2 for v, _ in tokens)
        assert s["metrics"]["offpol/snapshot_fallback_frac"] == old / len(tokens)
        assert s["metrics"]["offpol/snapshot_frac"] == sum(
            j - 2 <= v < j for v, _ in tokens) / len(tokens)

"""The Replay stage of the rollout pipeline: rollout replay (`ReplayBuffer`), response
reuse (`ResponseBank`) and speculative drafts (`DraftPlanner`), as the pipeline calls them.

- When a group starts or grows (`prepare`): its fresh samples get drafts.

- When a group completes (`inject`), before filters and the controller see it: a group with
  no correct answer gets a banked one (AR3PO).
- At a step boundary (`mix`), after the controller folded in the fresh groups: this step's
  batch gets up to ``replay_groups`` groups drawn from the buffer (prompts not already in
  the batch), then the fresh groups go into the buffer, their correct answers into the
  bank and their responses into the drafter's store. So a step never replays its own groups, and both stores change only at step
  boundaries, in consumption order: a synchronous run's decisions repeat exactly and
  resume bitwise from checkpoints. Asynchronously (max_staleness > 0) a group of the next
  step may complete, or be admitted and drafted, before or after a boundary, depending
  on how fast the engine runs against the trainer: which banked answer or draft it
  meets is then timing-dependent, like any async run's batch composition.

Replayed and reused samples are not "stale" for the admission rule (they were never
admitted again); their off-policy weight is the objective's (`pi_prox / mu`, truncated by the
configured correction); the versions of the samples it holds are referenced for the trainer's
per-version snapshots (`Replay.held_versions`). Knows nothing of engines, threads or the
trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reroll.replay.bank import IsSuccess, ResponseBank
from reroll.replay.buffer import ReplayBuffer
from reroll.replay.drafts import DraftPlanner, build_draft_planner
from reroll.rollout import Group, Rollout

if TYPE_CHECKING:
    from reroll.config import ReplayConfig, RolloutConfig


class Replay:
    def __init__(self, *, buffer: ReplayBuffer | None = None, bank: ResponseBank | None = None,
                 replay_groups: int = 0, is_success: IsSuccess,
                 drafting: DraftPlanner | None = None):
        self.buffer, self.bank, self.replay_groups = buffer, bank, replay_groups
        self.is_success = is_success
        self.drafting = drafting
        self._versions: dict[str, set[int]] = {}  # sample_id -> its tokens' versions

    def held_versions(self) -> list[set[int]]:
        """The versions the held samples were generated at, one set per sample: the
        buffer's groups (trained again when drawn) and the bank's answers (injected into a
        later group), each keeping its own. The loop references them (`reroll.control.
        scheduler.Scheduler.referenced_versions`); read once per sample, then cached."""
        held = [r for e in (self.buffer.entries if self.buffer is not None else [])
                for r in e["group"].rollouts]
        held += [r for rs in (self.bank.bank.values() if self.bank is not None else [])
                 for r in rs]
        cache = {r.sample_id: self._versions.get(r.sample_id) for r in held}
        for r in held:
            if cache[r.sample_id] is None:
                cache[r.sample_id] = set(r.sampled_versions)
        self._versions = cache
        return list(cache.values())

    def prepare(self, rollouts: list[Rollout]) -> None:
        """Fresh samples get their drafts (speculative rollouts, `reroll.replay.drafts`)."""
        if self.drafting is not None:
            self.drafting.prepare(rollouts)

    def inject(self, g: Group) -> bool:
        """Response reuse for a completed group (see `ResponseBank.inject`)."""
        if self.bank is None:
            return False
        newest = max((v for r in g.rollouts for v in r.sampled_versions),
                     default=g.start_version)
        return self.bank.inject(g, self.is_success, newest)

    def mix(self, fresh: list[Group], version: int) -> list[Group]:
        """The step's batch: the fresh groups, then replayed ones; then store the fresh."""
        out = list(fresh)
        if self.buffer is not None:
            if self.replay_groups:
                out += self.buffer.draw(self.replay_groups, version,
                                        exclude={g.prompt_id for g in fresh})
            self.buffer.add(fresh, version)
        if self.bank is not None:
            self.bank.add(fresh, self.is_success)
        if self.drafting is not None:
            self.drafting.add(fresh)
        return out

    def state(self) -> dict:
        return {"buffer": self.buffer.state() if self.buffer is not None else {},
                "bank": self.bank.state() if self.bank is not None else {},
                "drafts": self.drafting.state() if self.drafting is not None else {}}

    def load_state(self, d: dict | None) -> None:
        if not d:
            return
        if self.buffer is not None:
            self.buffer.load_state(d.get("buffer"))
        if self.bank is not None:
            self.bank.load_state(d.get("bank"))
        if self.drafting is not None:
            self.drafting.load_state(d.get("drafts"))

    def metrics(self) -> dict[str, float]:
        out = self.buffer.metrics() if self.buffer is not None else {}
        out.update(self.bank.metrics() if self.bank is not None else {})
        out.update(self.drafting.metrics() if self.drafting is not None else {})
        return out


def fresh_groups(rollout: RolloutConfig, replay: ReplayConfig) -> int:
    """Groups a step generates: all of ``rollout.batch_groups``, or with rollout replay
    the ``replay.fresh_fraction`` of them (at least one; the rest is drawn from the buffer)."""
    b = rollout.batch_groups
    if replay.buffer_size <= 0:
        return b
    return min(b, max(1, round(replay.fresh_fraction * b)))


def build_replay(c: ReplayConfig, rollout: RolloutConfig, is_success: IsSuccess,
                 state: dict | None, *, seed: int) -> Replay | None:
    """The run's Replay stage (None when neither replay, reuse nor drafts are on), restored
    from a checkpoint's ``state["replay"]``; ``seed``: the buffer's draws (``train.seed``)."""
    if c.buffer_size <= 0 and not c.reuse and c.draft == "none":
        return None
    buf = (ReplayBuffer(c.buffer_size, max_age=c.max_age, seed=seed)
           if c.buffer_size > 0 else None)
    bank = ResponseBank(c.reuse_per_prompt, max_age=c.reuse_max_age) if c.reuse else None
    replayed = rollout.batch_groups - fresh_groups(rollout, c) if buf is not None else 0
    out = Replay(buffer=buf, bank=bank, is_success=is_success, replay_groups=replayed,
                 drafting=build_draft_planner(c, None))
    out.load_state((state or {}).get("replay"))
    return out

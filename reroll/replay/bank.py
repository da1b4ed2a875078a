"""AR3PO response reuse (docs/algorithms.md): a bank of past correct answers per prompt, one
of which replaces a member of a group that has no correct answer, so the group has reward
variance and the prompt still teaches something.

The bank fills at step boundaries from the fresh samples a step consumed (the latest
``per_prompt`` successes of each prompt are kept, with their recorded tokens, behaviour
log-probs and versions). A group with no success when it completes gets the latest banked
answer of its prompt in place of its last member (same index and round, so sizes, the
admission count and the group's layout do not change); the copy is marked as reused
(`reroll.replay.buffer.replay_rollout`: ``parent_id``, spans ``replayed``) and keeps the
displaced sample in ``control["reuse"]["replaced"]``, so statistics and metrics still see
what the policy generated (`Group.generated`). A DOT penalty the answer got in its own group
is taken off (it was relative to that group), and its sample weight is reset to 1 (a DUET
1/q weight belonged to that group's keep draw); pruned samples are never banked. ``max_age``
(versions, 0: none) ignores answers sampled longer ago than that.

Off-policy handling (the method leaves it open; both conventions are recorded): the
reused sample keeps the behaviour log-probs it was sampled with, so the decoupled
objective weighs it by ``pi_prox / mu`` (truncated by the configured correction), the same
as every other off-policy token. Knows nothing of engines, schedulers or the trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from reroll.replay.buffer import replay_rollout
from reroll.rollout import Group, Rollout

IsSuccess = Callable[[Rollout], bool]


class ResponseBank:
    def __init__(self, per_prompt: int = 1, *, max_age: int = 0):
        if per_prompt < 1:
            raise ValueError(f"ResponseBank: per_prompt must be >= 1, got {per_prompt}")
        if max_age < 0:
            raise ValueError(f"ResponseBank: max_age must be >= 0, got {max_age}")
        self.per_prompt, self.max_age = per_prompt, max_age
        self.bank: dict[str, list[Rollout]] = {}  # prompt -> its correct answers, oldest first
        self.injected = 0

    def add(self, groups: list[Group], is_success: IsSuccess) -> None:
        """Bank the successful fresh samples of a step's consumed groups (in order)."""
        for g in groups:
            wins = [r for r in g.rollouts if not r.reused and not r.failed
                    and r.loss_exclusion is None and is_success(r)]
            if wins:
                kept = self.bank.setdefault(g.prompt_id, []) + wins
                self.bank[g.prompt_id] = kept[-self.per_prompt:]

    def pick(self, prompt_id: str, version: int) -> Rollout | None:
        """The latest banked answer of ``prompt_id`` no older than ``max_age`` versions."""
        for r in reversed(self.bank.get(prompt_id, [])):
            if not self.max_age or version - r.min_version <= self.max_age:
                return r
        return None

    def inject(self, g: Group, is_success: IsSuccess, version: int) -> bool:
        """Replace the last member of a group with no success by a banked answer; returns
        whether it did. Groups with a failed score are left alone (no decision on errors)."""
        if not g.rollouts or any(r.failed or r.reward is None for r in g.rollouts):
            return False
        if any(is_success(r) for r in g.rollouts):
            return False
        src = self.pick(g.prompt_id, version)
        if src is None:
            return False
        last = g.rollouts[-1]
        new = replay_rollout(src, group_id=g.group_id, index=last.index_in_group)
        new.group_round = last.group_round
        # what belonged to the answer's original group does not carry over: DOT's penalty
        # (relative to that group's lengths) and DUET's 1/q keep weight (that group's draw)
        new.reward = (new.reward or 0.0) - new.shaping.pop("dot", 0.0)
        new.shaping.pop("dot_threshold", None)
        new.sample_weight, new.loss_exclusion = 1.0, None
        new.control["reuse"] = {"replaced": last.to_dict(), "source_weight": src.sample_weight}
        g.rollouts[-1] = new
        self.injected += 1
        return True

    # ---- checkpoints and metrics -------------------------------------------------------
    def state(self) -> dict:
        return {"bank": {p: [r.to_dict() for r in rs] for p, rs in self.bank.items()},
                "injected": self.injected}

    def load_state(self, d: dict | None) -> None:
        if not d:
            return
        self.bank = {p: [Rollout.from_dict(r) for r in rs] for p, rs in d.get("bank", {}).items()}
        self.injected = d.get("injected", 0)

    def metrics(self) -> dict[str, float]:
        return {"replay/bank_prompts": float(len(self.bank)),
                "replay/injected": float(self.injected)}

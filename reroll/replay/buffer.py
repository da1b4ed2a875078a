"""Rollout replay (DOTS+RR, docs/algorithms.md): a bounded buffer of recent informative groups
from which part of every step's batch is drawn instead of being generated.

A group enters the buffer when a step consumed it and its rewards vary (0 < accuracy < 1:
an all-equal group has zero advantage and teaches nothing), replacing any older group of
the same prompt (the latest is kept). Eviction: first in, first out beyond ``capacity``
groups, and any group whose oldest token is more than ``max_age`` policy versions old (0:
no age limit). A draw takes groups uniformly without replacement, from a generator seeded
by (seed, draw number), so it repeats exactly and resumes with the checkpointed state.

A drawn group is a *copy* (`replay_copy`): new group and sample ids, ``parent_id`` naming
the original sample, and the policy spans relabelled ``replayed`` (their versions kept), so
the record says what was trained twice. Its behaviour log-probs are the recorded ones: the
decoupled objective's ``pi_prox / mu`` weight is the off-policy correction.
Knows nothing of engines, schedulers or the trainer.
"""

from __future__ import annotations

import random
from dataclasses import replace

from reroll.rollout import POLICY_SOURCES, Group, Rollout, new_id


def informative(g: Group) -> bool:
    """Rewards that vary within the group (a non-zero advantage for someone)."""
    rewards = [r.reward for r in g.rollouts]
    return None not in rewards and len(set(rewards)) > 1


def replay_rollout(r: Rollout, *, group_id: str, index: int | None = None) -> Rollout:
    """A copy of ``r`` for reuse in another group: new sample id, ``parent_id`` = the
    original's, every token inherited (``prefix_len``), policy spans relabelled
    ``replayed`` with their versions. Tokens, masks, behaviour log-probs, versions, scores
    and reward are unchanged."""
    d = Rollout.from_dict(r.to_dict())
    spans = [replace(s, source="replayed") if s.source in POLICY_SOURCES else s for s in d.spans]
    return replace(d, sample_id=new_id(), group_id=group_id, parent_id=r.sample_id,
                   prefix_len=len(r.tokens), spans=spans,
                   index_in_group=r.index_in_group if index is None else index)


def replay_copy(g: Group) -> Group:
    """A trainable copy of a consumed group (see module docstring)."""
    gid = new_id()
    out = Group.from_dict(g.to_dict())
    out.group_id = gid
    out.rollouts = [replay_rollout(r, group_id=gid) for r in g.rollouts]
    return out


class ReplayBuffer:
    def __init__(self, capacity: int, *, max_age: int = 0, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"ReplayBuffer: capacity must be >= 1, got {capacity}")
        if max_age < 0:
            raise ValueError(f"ReplayBuffer: max_age must be >= 0, got {max_age}")
        self.capacity, self.max_age, self.seed = capacity, max_age, seed
        self.entries: list[dict] = []  # oldest first: {"group", "added", "times"}
        self.draws = 0  # draws made (seeds the next one)
        self.added = self.evicted = self.replayed = 0  # counters, for metrics

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, groups: list[Group], version: int) -> None:
        """Keep the informative ones of a step's consumed fresh groups (in order), latest
        per prompt, then evict by age and capacity."""
        for g in groups:
            if not informative(g) or any(r.reused for r in g.rollouts):
                continue
            before = len(self.entries)
            self.entries = [e for e in self.entries if e["group"].prompt_id != g.prompt_id]
            self.evicted += before - len(self.entries)
            self.entries.append({"group": Group.from_dict(g.to_dict()), "added": version,
                                 "times": 0})
            self.added += 1
        self.expire(version)
        extra = len(self.entries) - self.capacity
        if extra > 0:
            self.entries, self.evicted = self.entries[extra:], self.evicted + extra

    def expire(self, version: int) -> None:
        """Drop groups whose oldest token is more than ``max_age`` versions behind."""
        if self.max_age:
            keep = [e for e in self.entries
                    if version - e["group"].min_version <= self.max_age]
            self.evicted += len(self.entries) - len(keep)
            self.entries = keep

    def draw(self, k: int, version: int, exclude: set[str] = frozenset()) -> list[Group]:
        """Up to ``k`` replay copies, uniformly without replacement among the groups whose
        prompt is not in ``exclude`` (e.g. prompts already fresh in this batch), in buffer
        order."""
        self.expire(version)
        pool = [i for i, e in enumerate(self.entries) if e["group"].prompt_id not in exclude]
        rng = random.Random(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        picked = sorted(rng.sample(pool, min(k, len(pool))))
        out = []
        for i in picked:
            e = self.entries[i]
            e["times"] += 1
            out.append(replay_copy(e["group"]))
        self.replayed += len(out)
        return out

    # ---- checkpoints and metrics -------------------------------------------------------
    def state(self) -> dict:
        return {"entries": [{"group": e["group"].to_dict(), "added": e["added"],
                             "times": e["times"]} for e in self.entries],
                "draws": self.draws, "added": self.added, "evicted": self.evicted,
                "replayed": self.replayed}

    def load_state(self, d: dict | None) -> None:
        if not d:
            return
        self.entries = [{"group": Group.from_dict(e["group"]), "added": e["added"],
                         "times": e["times"]} for e in d.get("entries", [])]
        self.draws = d.get("draws", 0)
        self.added, self.evicted = d.get("added", 0), d.get("evicted", 0)
        self.replayed = d.get("replayed", 0)

    def metrics(self) -> dict[str, float]:
        times = [e["times"] for e in self.entries]
        return {"replay/buffer_groups": float(len(self.entries)),
                "replay/added": float(self.added), "replay/evicted": float(self.evicted),
                "replay/replayed_groups": float(self.replayed),
                "replay/times_replayed_mean": sum(times) / len(times) if times else 0.0}

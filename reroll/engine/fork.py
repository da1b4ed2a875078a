"""Forks: a running sequence split into children that share its prefix (tree rollouts).

Owns the bookkeeping of forks that wait for their parent to reach their point, the rule for
where a fork happens, and what a child's record inherits. Knows nothing of tensors, caches
or the model: `reroll.engine.torch_engine.TorchEngine` copies the parent's cache rows into
the children's slots (no forward over the shared prefix) and samples each child with its own
counter-based seed.

A fork ``(parent, children, at)``: every child inherits the parent's first ``at`` tokens
(prompt + response tokens up to ``at``) and samples token ``at`` on from its own seed, so a
child equals an independent request whose record holds those ``at`` tokens (a resumed
prefix) and the same seed. When the parent finishes before its sequence reaches ``at``
tokens the fork happens at ``len - 1`` (the children draw the parent's last token again).

Children's records: ``parent_id`` = the parent's sample id, ``prefix_len`` = ``at``; the
inherited response tokens keep the parent's log-probs, versions and loss mask, in spans of
source ``"inherited"`` (with the parent's version of each run).
"""

from __future__ import annotations

from dataclasses import dataclass

from reroll.rollout import Rollout, Span


@dataclass
class Fork:
    parent_id: str
    children: list[Rollout]
    at: int  # tokens every child inherits from the parent (prompt included)


class ForkTable:
    """Forks waiting for their parent (by sample id); a parent may itself be a child that
    has not been forked yet."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Fork]] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, fork: Fork) -> None:
        self.pending.setdefault(fork.parent_id, []).append(fork)
        self.pending[fork.parent_id].sort(key=lambda f: f.at)

    def waiting_children(self) -> set[str]:
        return {c.sample_id for fs in self.pending.values() for f in fs for c in f.children}

    def due(self, parent_id: str, length: int, finished: bool) -> list[tuple[Fork, int]]:
        """Forks of ``parent_id`` to make now, each with its point: those with ``at <=
        length`` (the parent's sequence length now), and all of them when the parent has
        finished (at ``min(at, length - 1)``)."""
        forks = self.pending.get(parent_id)
        if not forks:
            return []
        now = forks if finished else [f for f in forks if f.at <= length]
        rest = [] if finished else [f for f in forks if f.at > length]
        if rest:
            self.pending[parent_id] = rest
        else:
            del self.pending[parent_id]
        return [(f, min(f.at, length - 1) if finished else f.at) for f in now]

    def drop(self, sample_ids: set[str]) -> list[Rollout]:
        """Remove the waiting children named in ``sample_ids`` or whose parent is named (a
        parent stopped for good), and, recursively, the forks waiting on those children;
        returns the removed children."""
        out: list[Rollout] = []
        gone = set(sample_ids)
        while True:
            hit = []
            for pid, forks in list(self.pending.items()):
                keep = []
                for f in forks:
                    if pid in gone:
                        hit += f.children
                        continue
                    mine = [c for c in f.children if c.sample_id in gone]
                    hit += mine
                    f.children = [c for c in f.children if c.sample_id not in gone]
                    if f.children:
                        keep.append(f)
                if keep:
                    self.pending[pid] = keep
                else:
                    del self.pending[pid]
            new = [c for c in hit if c not in out]
            if not new:
                return out
            out += new
            gone |= {c.sample_id for c in new}


def check_fork(parent: Rollout, children: list[Rollout], at: int, live: set[str],
               what: str = "fork") -> None:
    """A fork's (or a ``what``'s) arguments, before anything changes; errors name the parent
    and the child."""
    where = f"{what} of rollout {parent.sample_id} (prompt {parent.prompt_id})"
    if not parent.prompt_len <= at:
        raise ValueError(f"{where}: at={at} is inside the prompt ({parent.prompt_len} tokens)")
    prompt = parent.tokens[:parent.prompt_len]
    for r in (parent, *children):  # a draft would carry a parent past the fork's position
        if r.sampling.redraft is not None:
            raise ValueError(f"{where}: rollout {r.sample_id} re-drafts (sampling.redraft), "
                             f"which forks do not support")
    for c in children:
        if c.sample_id in live or c.sample_id == parent.sample_id:
            raise ValueError(f"{where}: child {c.sample_id} is already in the engine")
        if c.finished or c.prompt_len != parent.prompt_len or c.tokens != prompt:
            raise ValueError(f"{where}: child {c.sample_id} must be an unstarted rollout of "
                             f"the parent's prompt ({parent.prompt_len} tokens)")


def inherit(child: Rollout, parent: Rollout, at: int) -> None:
    """Make ``child``'s record the parent's first ``at`` tokens (see the module docstring)."""
    p = parent.prompt_len
    child.tokens = list(parent.tokens[:at])
    child.loss_mask = list(parent.loss_mask[:at])
    child.logprobs = list(parent.logprobs[:at])
    child.versions = list(parent.versions[:at])
    child.spans = [Span(0, p, "prompt")] if p else []
    for s in parent.spans:
        lo, hi = max(s.start, p), min(s.end, at)
        if lo >= hi:
            continue
        # every policy token the parent holds is the child's inherited prefix, its forced
        # branch tokens too (a forced span names the member whose own token it is)
        src = ("inherited" if s.source in ("sampled", "draft", "inherited", "forced")
               else s.source)
        last = child.spans[-1] if child.spans else None
        if last is not None and last.end == lo and last.source == src and last.version == s.version:
            last.end = hi
        else:
            child.spans.append(Span(lo, hi, src, s.version))
    child.parent_id, child.prefix_len = parent.sample_id, at
    child.start_version = parent.start_version
    child.finish = "running"

"""The forking plug-in (tree rollouts): a running sequence split into children that take free
slots with a copy of its cache rows, so the shared prefix is never run again.

Owns the engine side of `reroll.engine.fork` (which decides where a fork happens and what a
child inherits) and the forks that wait for a parent still generating (its `ForkTable`):
placing children into slots (the engine's `seat`: a copy of the parent's cache rows, or the
re-prefill fallback when no slot is free). Knows nothing of the other plug-ins.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from reroll.engine.fork import Fork, ForkTable, check_fork, inherit
from reroll.engine.plugin import EnginePlugin
from reroll.rollout import Rollout


class Forks(EnginePlugin):
    """`fork` and the bookkeeping of due forks."""

    counters = ("fork_children", "fork_tokens_shared", "fork_children_prefilled")

    def __init__(self, core) -> None:
        super().__init__(core)
        self.table = ForkTable()

    def fork(self, parent: Rollout, children: list[Rollout], at: int) -> None:
        """Fork ``parent`` into ``children`` (unstarted rollouts of its prompt, each sampled
        with its own ``sampling``) at ``at`` tokens, see `reroll.engine.fork`: at once when
        the parent runs and is that long already, else when it gets there (a waiting or
        running parent, or a child still waiting for its own fork). A finished parent (its
        cache is gone) gives children that re-prefill its prefix. The children finish
        through `step` like any request."""
        core = self.core
        live = core.live()
        check_fork(parent, children, at, live)
        now = time.time()
        for c in children:
            c.finish, c.timings["engine_add"] = "running", now
        core.count("requests_added", len(children))
        fk = Fork(parent.sample_id, list(children), at)
        slot = next((i for i, q in enumerate(core.rows)
                     if q.rollout.sample_id == parent.sample_id), None)
        with torch.inference_mode():
            if slot is not None and at <= core.length(core.rows[slot]):
                core.emit(self._make_children(fk, core.rows[slot].rollout, at, slot))
            elif parent.sample_id in live:
                self.table.add(fk)
            elif parent.finished:
                core.emit(self._make_children(fk, parent, min(at, len(parent.tokens) - 1), None))
            else:
                raise ValueError(f"fork of rollout {parent.sample_id}: the parent is neither "
                                 f"in the engine nor finished ({parent.finish!r})")

    # ---- hooks -----------------------------------------------------------------------------
    def held(self) -> set[str]:
        return self.table.waiting_children() if self.table else set()

    def sampled(self, sl: slice, logits: Tensor, tok: Tensor, ban: Tensor | None,
                fin: list[int]) -> list[Rollout]:
        if not self.table:
            return []
        done, core = [], self.core
        for j, q in enumerate(core.rows[sl]):
            if q.rollout.sample_id in self.table.pending:
                i = sl.start + j
                done += self._fire(q.rollout, core.length(q), i, i in fin)
        return done

    def ended(self, r: Rollout) -> list[Rollout]:
        return self._fire(r, len(r.tokens), None, True) if self.table else []

    def aborted(self, wanted: set[str]) -> list[Rollout]:
        """Children waiting for a fork, named or of a named parent."""
        out = self.table.drop(wanted)
        for c in out:
            c.finish = "abort"
        return out

    # ---- making children -------------------------------------------------------------------
    def _fire(self, parent: Rollout, length: int, slot: int | None,
              finished: bool) -> list[Rollout]:
        """Make the forks of ``parent`` that are due (its sequence is ``length`` tokens; in
        slot ``slot``, None: no cache to share); returns the children that finished at once."""
        done = []
        for fk, at in self.table.due(parent.sample_id, length, finished):
            done += self._make_children(fk, parent, at, slot)
        return done

    def _make_children(self, fk: Fork, parent: Rollout, at: int,
                       slot: int | None) -> list[Rollout]:
        """Children of ``fk`` at ``at`` tokens of ``parent``: free slots get a copy of
        ``slot``'s first ``at - 1`` cache rows and the parent's token ``at - 1`` to feed
        next; the rest go to the front of the queue and re-prefill the prefix."""
        core = self.core
        if slot is not None:
            core.rows[slot].flush(core.version)
        at = max(at, parent.prompt_len)
        reqs, done = [], []
        for c in fk.children:
            inherit(c, parent, at)
            q = core.request(c)
            if q.budget > 0:
                reqs.append(q)
                continue
            done.append(core.finish(q, "length"))
            done += self._fire(c, len(c.tokens), None, True)
        k = core.seat(reqs, slot, at - 1, parent.tokens[at - 1])
        core.count("fork_children", k)
        core.count("fork_tokens_shared", k * (at - 1))
        core.count("fork_children_prefilled", len(reqs) - k)
        return done

"""TorchEngine's forking (tree rollouts): a running sequence split into children that take
free slots with a copy of its cache rows, so the shared prefix is never run again.

Owns the engine side of `reroll.engine.fork` (which decides where a fork happens and what
a child inherits): placing children into slots, copying cache rows, the re-prefill fallback
when no slot is free, and forks that wait for a parent still generating. A mixin of
`reroll.engine.torch_engine.TorchEngine`; uses its slots, cache and counters.
"""

from __future__ import annotations

import time

import torch

from reroll.engine.fork import Fork, check_fork, inherit
from reroll.engine.requests import Request, make_request
from reroll.engine.sampling import seed_key
from reroll.rollout import Rollout


class Forking:
    """`fork` and the bookkeeping of due forks, for `TorchEngine`."""

    def fork(self, parent: Rollout, children: list[Rollout], at: int) -> None:
        """Fork ``parent`` into ``children`` (unstarted rollouts of its prompt, each sampled
        with its own ``sampling``) at ``at`` tokens, see `reroll.engine.fork`: at once when
        the parent runs and is that long already, else when it gets there (a waiting or
        running parent, or a child still waiting for its own fork). A finished parent (its
        cache is gone) gives children that re-prefill its prefix. The children finish
        through `step` like any request."""
        live = self._live()
        check_fork(parent, children, at, live)
        now = time.time()
        for c in children:
            c.finish, c.timings["engine_add"] = "running", now
        self.counts["requests_added"] += len(children)
        fk = Fork(parent.sample_id, list(children), at)
        slot = next((i for i, q in enumerate(self.rows)
                     if q.rollout.sample_id == parent.sample_id), None)
        with torch.inference_mode():
            if slot is not None and at <= self._length(self.rows[slot]):
                self.unclaimed += self._make_children(fk, self.rows[slot].rollout, at, slot)
            elif parent.sample_id in live:
                self.forks.add(fk)
            elif parent.finished:
                self.unclaimed += self._make_children(fk, parent, min(at, len(parent.tokens) - 1),
                                                      None)
            else:
                raise ValueError(f"fork of rollout {parent.sample_id}: the parent is neither "
                                 f"in the engine nor finished ({parent.finish!r})")

    def _fire(self, parent: Rollout, length: int, slot: int | None,
              finished: bool) -> list[Rollout]:
        """Make the forks of ``parent`` that are due (its sequence is ``length`` tokens; in
        slot ``slot``, None: no cache to share); returns the children that finished at once."""
        done = []
        for fk, at in self.forks.due(parent.sample_id, length, finished):
            done += self._make_children(fk, parent, at, slot)
        return done

    def _make_children(self, fk: Fork, parent: Rollout, at: int,
                       slot: int | None) -> list[Rollout]:
        """Children of ``fk`` at ``at`` tokens of ``parent``: free slots get a copy of
        ``slot``'s first ``at - 1`` cache rows and the parent's token ``at - 1`` to feed
        next; the rest go to the front of the queue and re-prefill the prefix."""
        if slot is not None:
            self.rows[slot].flush(self.version)
        at = max(at, parent.prompt_len)
        reqs, done = [], []
        for c in fk.children:
            inherit(c, parent, at)
            q = self._child_request(c)
            if q.budget > 0:
                reqs.append(q)
                continue
            done.append(q.finish("length", self.version, self._decode_text))
            done += self._fire(c, len(c.tokens), None, True)
        k = self._seat(reqs, slot, at - 1, parent.tokens[at - 1])
        self.counts["fork_children"] += k
        self.counts["fork_tokens_shared"] += k * (at - 1)
        self.counts["fork_children_prefilled"] += len(reqs) - k
        return done

    def _child_request(self, c: Rollout) -> Request:
        """The request of a child whose record holds its inherited prefix (not a resume)."""
        seed = c.sampling.seed
        seed = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
        q = make_request(c, vocab=self.vocab, max_seq_len=self.max_seq_len, seed=seed_key(seed))
        q.resume = False  # its prefix is inherited, not a resume of its own
        return q

    def _seat(self, reqs: list[Request], slot: int | None, cached: int, feed: int) -> int:
        """Free slots take ``reqs`` with a copy of ``slot``'s first ``cached`` cache rows and
        ``feed`` as the token to decode next; the rest (all when ``slot`` is None) go to the
        front of the queue and re-prefill their prefix. Returns how many took a slot."""
        k = 0 if slot is None else min(len(reqs), self.max_batch - len(self.rows))
        if k:
            n0 = len(self.rows)
            self._place(n0, [(q, cached) for q in reqs[:k]])
            dst = torch.arange(n0, n0 + k, device=self.device)
            self.cache.move(dst, torch.full((k,), slot, device=self.device), cached)
            self.next_tok[dst] = feed
        for q in reversed(reqs[k:]):
            self.waiting.appendleft(q)
        return k

"""One simulated generation device: continuous batching of rows (samples), advanced a chunk
of decode steps at a time.

Between two events nothing changes the batch but its rows' growth, so the device decodes a
chunk of ``k`` steps in one event (until its first row finishes or reaches its checkpoint, a
position where its owner decides about it, or a known event of the run comes first) and the chunk's time is summed in closed form. The run cuts a chunk short when
an earlier event appears (a training step that will end sooner, a weight update). Knows the
cost model and nothing of groups, versions or the scheduler: rows carry an opaque key.
"""

from __future__ import annotations

from dataclasses import dataclass

from reroll.sim.settings import SimSettings


@dataclass
class Row:
    key: object  # the owner's handle of the sample
    ctx: int  # prompt + tokens generated so far
    left: int  # tokens still to generate
    prefill: int  # tokens to prefill before its next decode step (0: cached)
    resumed: bool = False  # interrupted by a weight update, not yet decoding again
    check: int = 0  # tokens to generate until its checkpoint (0: none ahead)
    fresh: bool = True  # admitted, not yet decoded: pays row_s
    group: object = None  # rows with the same one are added back together after an update


class GenDevice:
    def __init__(self, s: SimSettings, slots: int = 256):
        self.s = s
        self.slots = s.max_rows or slots
        # the engine places waiting requests only once this many slots are free (or all of
        # them fit), as `reroll.engine.core.DecodeCore` sizes it by default
        self.admit_batch = s.admit_batch or max(1, self.slots // 8)
        self.rows: list[Row] = []
        self.queue: list[Row] = []
        self.t = 0.0  # time up to which the device's state is accounted
        self.chunk: tuple[float, int] | None = None  # (start, steps) being decoded
        self.busy_s = 0.0  # decoding and prefilling
        self.sync_s = 0.0  # stopped for weight updates
        self.tokens = 0
        self.resumed = 0  # rows interrupted and resumed by weight updates
        self.resumed_tokens = 0  # their prompt and prefix tokens, prefilled again
        self.arrived: list[Row] = []  # rows the last chunk brought to their checkpoint
        # wall time per unit of work: 1 on a core of its own, 1 / (1 - share) while the
        # driver's work takes that share of it (2 at half and half)
        self.share = 1.0
        self._since = 0.0  # when the running chunk last changed speed (its start, else)
        self._done = 0.0  # the chunk's work (at full speed) done before ``_since``
        self.add_work = 0.0  # the driver's adds since the chunk under way began: the next's
        self._chunk_add = 0.0  # the adds done before the chunk under way

    @property
    def load(self) -> int:
        return len(self.rows) + len(self.queue)

    def add(self, rows: list[Row]) -> None:
        """Submit rows: they wait for slots (`place`); the driver's add of each
        (``add_row_s``) holds the device before its next decode step, placed or not."""
        self.queue += rows
        self.add_work += self.s.add_row_s * len(rows)

    def set_share(self, share: float, now: float) -> float | None:
        """Wall time per unit of work from ``now`` on: a processor's share changes at once,
        in the middle of a decode step too (the running chunk's work done so far stays done,
        the rest goes at the new speed). Returns the running chunk's new end (None: none
        runs)."""
        if self.chunk is not None:
            self._done += (now - self._since) / self.share
            self._since = now
        self.share = share
        return None if self.chunk is None else self.end(self.chunk[1])

    # ---- cost model ----------------------------------------------------------------------
    def _prefill_s(self) -> float:
        return (self.s.prefill_token_s * sum(r.prefill for r in self.rows)
                + self.s.resume_row_s * sum(r.resumed for r in self.rows)
                + self.s.resume_token_s * sum(r.prefill for r in self.rows if r.resumed)
                + self.s.row_s * sum(r.fresh for r in self.rows))

    def elapsed(self, j: int) -> float:
        """Work of the current batch's first ``j`` decode steps (with its pending prefill
        and the adds before it), at full speed."""
        s, n = self.s, len(self.rows)
        ctx = sum(r.ctx for r in self.rows)
        return (self._chunk_add + self._prefill_s() + j * (s.decode_base_s + s.decode_row_s * n)
                + s.decode_ctx_s * (j * ctx + n * j * (j - 1) / 2))

    def end(self, j: int) -> float:
        """When the current batch's ``j``-th decode step ends: the chunk's work after
        ``_since`` at the present speed (a chunk not yet started begins at ``self.t``)."""
        if self.chunk is None:
            return self.t + self.share * self.elapsed(j)
        return self._since + self.share * (self.elapsed(j) - self._done)

    def steps_to(self, t: float, most: int) -> int:
        """Decode steps of the current batch, from ``self.t``, until the one under way at
        ``t`` has finished (the first that ends at or after ``t``), at least one and at most
        ``most``."""
        lo, hi = 1, most
        while lo < hi:  # the smallest j in [1, most] with end(j) >= t
            mid = (lo + hi) // 2
            if self.end(mid) >= t - 1e-12:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- chunks --------------------------------------------------------------------------
    def place(self) -> bool:
        """Place queued rows into free slots, in order, as the engine admits before a decode
        step (`reroll.engine.torch_engine.TorchEngine._admit`): nothing unless
        ``admit_batch`` slots are free or every queued row fits; then until the slots are
        full or the next row's prefill would take the step's packed prefill past
        ``prefill_budget`` tokens (the first always goes). A group's rows not yet resumed
        share one prefill of their prompt (the engine prefills each distinct sequence once);
        a resumed row's prompt and prefix are its own. Returns whether rows are left that
        the next step may place (the budget stopped it: the engine tries again after one
        step)."""
        if not self.queue or self.slots - len(self.rows) < min(self.admit_batch,
                                                               len(self.queue)):
            return False
        seen: set = set()
        tokens, budget = 0, self.s.prefill_budget
        while self.queue and len(self.rows) < self.slots:
            r = self.queue[0]
            key = ("prompt", r.group) if r.group is not None and not r.resumed else id(r)
            if key not in seen:
                if seen and budget and tokens + r.prefill > budget:
                    return True
                seen.add(key)
                tokens += r.prefill
            self.rows.append(self.queue.pop(0))
        return False

    def plan(self, horizon: float | None) -> float | None:
        """Place queued rows (`place`) and start a chunk: decode until the first row
        finishes, or until the step under way at ``horizon`` has finished, or for one step
        where the prefill budget left rows for the next. Returns when the chunk ends (None:
        nothing to run)."""
        more = self.place()
        if not self.rows:
            self.chunk = None
            return None
        self._chunk_add, self.add_work = self.add_work, 0.0
        k = 1 if more else min(min(r.left, r.check or r.left) for r in self.rows)
        if horizon is not None and self.end(k) > horizon:
            k = self.steps_to(horizon, k)
        self.chunk, self._since, self._done = (self.t, k), self.t, 0.0
        return self.end(k)

    def cut(self, t: float) -> float | None:
        """Shorten the running chunk to end with the decode step under way at ``t``;
        returns its new end, or None if no chunk runs."""
        if self.chunk is None:
            return None
        k = self.steps_to(t, self.chunk[1])
        self.chunk = (self.t, k)
        return self.end(k)

    def finish_chunk(self) -> list[Row]:
        """Apply the chunk: every row gains its tokens; returns the rows that finished (the
        ones still running that reached their checkpoint go to ``arrived``)."""
        _, k = self.chunk
        end = self.end(k)
        self.busy_s += end - self.t
        self.t = end
        self.arrived = []
        for r in self.rows:
            r.ctx, r.left, r.prefill, r.resumed, r.fresh = r.ctx + k, r.left - k, 0, False, False
            self.tokens += k
            if r.check:
                r.check = max(0, r.check - k)
                if r.check == 0 and r.left > 0:
                    self.arrived.append(r)
        done = [r for r in self.rows if r.left <= 0]
        self.rows = [r for r in self.rows if r.left > 0]
        self.chunk, self._chunk_add = None, 0.0
        return done

    def drop(self, which) -> list[Row]:
        """Retire the rows (running or queued) whose key ``which(key)`` names, between
        chunks; returns them."""
        if self.chunk is not None:
            raise RuntimeError("GenDevice.drop: rows are retired between chunks")
        out = [r for r in self.rows + self.queue if which(r.key)]
        self.rows = [r for r in self.rows if not which(r.key)]
        self.queue = [r for r in self.queue if not which(r.key)]
        return out

    def pause(self, until: float, *, reprefill: bool, stop: float | None = None) -> None:
        """A weight update: stopped until ``until`` (for ``stop``, else ``sync_s``). With
        partial rollouts every request is aborted and added back as the engine and its
        driver do it: the running rows are interrupted (each prefills its prompt and prefix
        again when placed), the waiting ones come back first and the running ones after
        them (`reroll.engine.torch_engine.TorchEngine.abort`), a group's rows together at
        its first place (`reroll.runtime.ray.RayEnginePool.add` adds a group at a time);
        free slots take them in that order."""
        self.sync_s += self.s.sync_s if stop is None else stop
        self.t = max(self.t, until)
        if reprefill:
            for r in self.rows:
                r.prefill, r.resumed = r.ctx, True
            self.resumed += len(self.rows)
            self.resumed_tokens += sum(r.ctx for r in self.rows)
            back, first = self.queue + self.rows, {}
            for i, r in enumerate(back):
                first.setdefault(id(r) if r.group is None else r.group, i)
            back.sort(key=lambda r: first[id(r) if r.group is None else r.group])
            self.queue, self.rows = back, []

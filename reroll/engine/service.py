"""EngineService: the asynchronous `Engine` over a step-wise `EngineCore`.

Owns the thread the core decodes in and the futures of the requests it holds. Lives in one
asyncio event loop (the one that calls `generate`): requests submitted there are added to the
core between decode steps, and the core steps in a single worker thread, several steps per
hand-off while nothing finishes and nothing new arrives, so the event loop stays free for
workflows, scoring and the trainer's calls. Knows nothing of groups, rewards or staleness.

Requests submitted in one pass of the event loop are all added before the next step: the
driver task wakes only after the tasks that woke it have run, so a batch admitted together is
prefilled together, exactly as a synchronous ``generate(batch)`` would (this is what keeps a
``max_staleness = 0`` run bitwise equal to the textbook synchronous loop).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reroll import timeline as tl
from reroll.engine.base import EngineCore, Turn
from reroll.rollout import Rollout


def _adopt(orig: Rollout, got: Rollout) -> None:
    """A core in another process returns copies: the copy is the truth."""
    if got is not orig:
        orig.__dict__.update(got.__dict__)


def _decode_threads(n: int) -> None:
    """The decode thread's torch intra-op threads (a count is per thread under OpenMP)."""
    import torch

    torch.set_num_threads(n)
    torch.get_num_threads()  # taken now: a later set elsewhere leaves this thread's alone


class EngineService:
    def __init__(self, core: EngineCore, *, max_steps_per_call: int = 64, threads: int = 0):
        """``threads``: torch intra-op threads of the decode thread (0: the count it
        inherits, the creating thread's)."""
        self.core = core
        self.max_steps = max_steps_per_call
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reroll-engine",
                                        **({"initializer": _decode_threads,
                                            "initargs": (threads,)} if threads > 0 else {}))
        self._futures: dict[str, tuple[Rollout, asyncio.Future, Turn | None]] = {}
        self._submitted: list[str] = []
        self._forks: list[tuple[Rollout, list[Rollout], int]] = []  # for the core's next add
        self._branches: list[tuple[Rollout, list[Rollout]]] = []  # likewise, trees to plant
        self._yield = False  # read by the worker thread: return to the event loop soon
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._driver: asyncio.Task | None = None
        self._error: BaseException | None = None

    @property
    def version(self) -> int:
        return self.core.version

    # ---- Engine protocol ---------------------------------------------------------------
    def generate(self, rollout: Rollout, turn: Turn | None = None) -> asyncio.Future:
        self._start()
        if self._error is not None:
            raise RuntimeError(f"the engine failed earlier: {self._error}") from self._error
        if rollout.sample_id in self._futures:
            raise ValueError(f"rollout {rollout.sample_id} is already being generated")
        fut = asyncio.get_running_loop().create_future()
        self._futures[rollout.sample_id] = (rollout, fut, turn)
        self._submitted.append(rollout.sample_id)
        self._yield = True
        self._wake.set()
        return fut

    def fork(self, parent: Rollout, children: list[Rollout], at: int) -> list[asyncio.Future]:
        """Fork ``parent`` (being generated here, or finished) into ``children`` at ``at``
        tokens (`reroll.engine.fork`); one awaitable per child, resolved when it finishes.
        Forks submitted in one pass of the event loop reach the core after that pass's
        ``generate`` calls, in order, so a fork may name a parent submitted just before it or
        a child of an earlier fork."""
        self._check_can("fork", "fork sequences")
        if parent.sample_id not in self._futures and not parent.finished:
            raise ValueError(f"fork of rollout {parent.sample_id}: the parent is neither being "
                             f"generated nor finished ({parent.finish!r})")
        futs = self._register(children)
        self._forks.append((parent, list(children), at))
        self._yield = True
        self._wake.set()
        return futs

    def branch(self, root: Rollout, spares: list[Rollout]) -> list[asyncio.Future]:
        """Generate ``root`` (with its ``sampling.branch_rule``) as a tree whose children
        take ``spares`` in order (`TorchEngine.branch`, `reroll.engine.branch`); one
        awaitable per member, the root's first, each resolved when that member finishes: as
        a child, or as an independent request when the tree had no use for it. Handed to
        the core after the pass's ``generate`` calls and forks."""
        self._check_can("branch", "branch sequences")
        futs = self._register([root, *spares])
        self._branches.append((root, list(spares)))
        self._yield = True
        self._wake.set()
        return futs

    def _register(self, rollouts: list[Rollout]) -> list[asyncio.Future]:
        """One future per rollout (none of them already being generated here)."""
        for r in rollouts:
            if r.sample_id in self._futures:
                raise ValueError(f"rollout {r.sample_id} is already being generated")
        futs = []
        for r in rollouts:
            fut = asyncio.get_running_loop().create_future()
            self._futures[r.sample_id] = (r, fut, None)
            futs.append(fut)
        return futs

    def _check_can(self, method: str, what: str) -> None:
        self._start()
        if self._error is not None:
            raise RuntimeError(f"the engine failed earlier: {self._error}") from self._error
        if not hasattr(self.core, method):
            raise ValueError(f"{type(self.core).__name__} cannot {what} (the torch engine in "
                             "this process can)")

    async def update_weights(self, weights: Any, version: int, interrupt: bool = True) -> None:
        self._start()
        self._yield = True
        async with self._lock:
            aborted = self.core.abort() if interrupt else []
            tl.mark("interrupt", version=version, aborted=len(aborted))
            for r in aborted:
                _adopt(self._futures[r.sample_id][0], r)
            await asyncio.get_running_loop().run_in_executor(
                self._pool, self._swap, weights, version)
            if aborted:  # re-prefilled under the new weights: a resume
                self._submitted = [r.sample_id for r in aborted] + self._submitted
                self._wake.set()

    async def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        """Stop the named requests (all if None) between decode steps. Their awaitables
        resolve to their records with ``finish = "abort"`` and every token sampled so far
        (log-probs and versions kept); generating such a record again resumes it."""
        self._start()
        self._yield = True
        wanted = None if sample_ids is None else set(sample_ids)
        async with self._lock:
            ids = sample_ids
            if ids is None and hasattr(self.core, "fork"):  # abort(None) keeps waiting forks
                ids = list(self._futures)
            aborted = self.core.abort(ids)
            # submitted but not yet handed to the core: nothing sampled, finish "abort"
            queued = [i for i in self._submitted if wanted is None or i in wanted]
            self._submitted = [i for i in self._submitted if i not in set(queued)]
            for _, kids, _ in self._forks:  # forks not yet handed to the core
                queued += [c.sample_id for c in kids if wanted is None or c.sample_id in wanted]
            self._forks = [(p, [c for c in kids if c.sample_id not in set(queued)], at)
                           for p, kids, at in self._forks]
            queued += self._drop_branches(wanted)
        out = []
        for r in aborted:
            out.append(self._resolve(r))
        for i in queued:
            if i in self._futures:
                r = self._futures[i][0]
                r.finish = "abort"
                out.append(self._resolve(r))
        return out

    def _drop_branches(self, wanted: set[str] | None) -> list[str]:
        """Trees not yet handed to the core lose the named members (returned); the spares
        of a named root are generated as independent requests instead."""
        named, keep = [], []
        for root, spares in self._branches:
            hit = [r.sample_id for r in (root, *spares) if wanted is None or r.sample_id in wanted]
            named += hit
            rest = [c for c in spares if c.sample_id not in hit]
            if root.sample_id in hit:
                self._submitted += [c.sample_id for c in rest]
            else:
                keep.append((root, rest))
        self._branches = keep
        return named

    def _resolve(self, r: Rollout) -> Rollout:
        orig, fut, _ = self._futures.pop(r.sample_id)
        _adopt(orig, r)
        if not fut.done():
            fut.set_result(orig)
        return orig

    async def sync(self) -> None:
        self._start()
        self._yield = True
        async with self._lock:
            for r in self.core.sync():
                if r.sample_id in self._futures:
                    _adopt(self._futures[r.sample_id][0], r)

    def stats(self) -> dict[str, float]:
        return self.core.stats()

    async def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        self._pool.shutdown(wait=True)
        shutdown = getattr(self.core, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ---- the driver --------------------------------------------------------------------
    def _start(self) -> None:
        if self._driver is None:
            self._wake, self._lock = asyncio.Event(), asyncio.Lock()
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while True:
                    async with self._lock:
                        self._add_submitted()
                        if not self.core.pending():
                            break
                        self._yield = False
                        finished = await loop.run_in_executor(self._pool, self._run)
                    for r in finished:
                        self._resolve(r)
                    await asyncio.sleep(0)  # let the workflows that were woken submit more
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # every waiting workflow sees the engine's error
            self._error = e
            for _, fut, _ in self._futures.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"the engine failed: {e!r}"))
            self._futures.clear()

    def _swap(self, weights: Any, version: int) -> None:
        with tl.span("update weights", version=version):
            self.core.update_weights(weights, version)

    def _add_submitted(self) -> None:
        if self._submitted:
            ids, self._submitted = self._submitted, []
            entries = [self._futures[i] for i in ids if i in self._futures]
            with tl.span("add", requests=len(entries)):
                self.core.add([e[0] for e in entries], [e[2] for e in entries])
        forks, self._forks = self._forks, []
        for parent, kids, at in forks:
            if kids:
                self.core.fork(parent, kids, at)
        branches, self._branches = self._branches, []
        for root, spares in branches:
            self.core.branch(root, spares)

    def _run(self) -> list[Rollout]:
        """In the engine thread: step until something finishes or the loop wants the core."""
        done: list[Rollout] = []
        with tl.span("decode", pending=self.core.pending()) as sp:
            steps = 0
            while steps < self.max_steps:
                done += self.core.step()
                steps += 1
                if done or self._yield or not self.core.pending():
                    break
            sp.set(steps=steps, finished=len(done))
        return done

"""Hosting the asynchronous rollout pipeline for a synchronous trainer.

`RolloutSource` runs `reroll.control.rollouts.Rollouts` in an asyncio event loop on a
background thread ("reroll-rollout") and offers the loop's `BatchSource` and
`WeightTransport` calls as plain blocking methods. The engine decodes in its own thread (the
`EngineService` worker), the trainer runs in the caller's thread, and the event loop in
between runs workflows and scoring callbacks. torch releases the GIL inside its kernels, so
generation and training do run concurrently. Knows nothing of Ray or of the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from reroll import timeline as tl
from reroll.control.rollouts import Rollouts
from reroll.rollout import Group


class RolloutSource:
    def __init__(self, make: Callable[[], Rollouts], rerun: list[Group] = (),
                 timeout_s: float = 3600.0):
        """``make`` builds the pipeline inside the event loop's thread (asyncio objects
        belong to one loop); ``rerun``: restored groups whose workflows must run again."""
        self.timeout_s = timeout_s
        self._publishing = None  # the concurrent future of the last publish, until settled
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="reroll-rollout",
                                        daemon=True)
        self._thread.start()
        try:
            self.rollouts: Rollouts = self._call(self._make(make, list(rerun)))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(make, rerun):
        r = make()
        await r.start(rerun)
        return r

    def _call(self, coro: Coroutine) -> Any:
        self._settle()
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def _settle(self) -> None:
        """Wait for the last publish (it ran before anything submitted after it: the event
        loop runs callbacks in order) and raise its error, if any, here."""
        pending, self._publishing = self._publishing, None
        if pending is not None:
            with tl.span("settle publish"):
                pending.result(self.timeout_s)

    # ---- BatchSource ---------------------------------------------------------------------
    def next_batch(self, trainer_version: int) -> list[Group]:
        r = self.rollouts
        return self._call(r.next_batch(r.scheduler.batch, trainer_version))

    def snapshot(self) -> tuple[list[Group], dict]:
        return self._call(self.rollouts.snapshot())

    def referenced_versions(self, trainer_version: int) -> set[int]:
        return self._call(self._referenced(trainer_version))

    async def _referenced(self, trainer_version: int) -> set[int]:
        return self.rollouts.referenced_versions(trainer_version)

    def stats(self) -> dict:
        return self._call(self._stats())

    async def _stats(self) -> dict:
        return self.rollouts.stats()

    # ---- weights -----------------------------------------------------------------------
    def publish(self, weights: Any, version: int) -> None:
        """Hand the new weights to the pipeline and return without waiting: the swap and the
        admission of the next batch run in the loop thread while this one logs; the next
        call (next_batch, snapshot, ...) waits for it first and raises what it raised.
        ``weights`` must be a copy the caller no longer changes."""
        self._settle()
        self._publishing = asyncio.run_coroutine_threadsafe(
            self.rollouts.publish(weights, version), self.loop)

    def close(self) -> None:
        try:
            # let the last publish finish first (its admissions must exist to be cancelled);
            # its error, if any, changes nothing now that the run is closing
            pending, self._publishing = self._publishing, None
            if pending is not None:
                with contextlib.suppress(Exception):
                    pending.result(self.timeout_s)
            self._call(self.rollouts.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()

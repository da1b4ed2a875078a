"""The local runtime: one process, the scheduler (engine + scoring) driven by a background
thread, the trainer in the caller's thread. Holds no algorithm logic: it only decides what
runs where and guards the scheduler with a lock.

With ``max_staleness = 0`` the admission rule lets the generation thread start exactly one
batch per policy version, so the same code is synchronous RL; with ``max_staleness > 0``
generation of the next batches overlaps training. torch releases the GIL inside its
kernels, so the two threads do run concurrently.
"""

from __future__ import annotations

import threading
import time

from reroll.control.scheduler import Scheduler


class LocalRuntime:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.lock = threading.Lock()
        self._ready = threading.Event()  # set by the generation thread when groups are ready
        self._stop = False
        self._error: BaseException | None = None
        self.idle_s = 0.0  # generation thread time with nothing to do
        self._want = 0  # trainer-side callers waiting for the lock (the thread yields to them)
        self._thread = threading.Thread(target=self._run, name="reroll-generate", daemon=True)

    def start(self) -> LocalRuntime:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while True:
                while self._want:  # a Lock is not fair: let the trainer's call in
                    time.sleep(0.0002)
                with self.lock:
                    if self._stop:
                        return
                    busy = self.scheduler.tick()
                    if self.scheduler.ready:
                        self._ready.set()
                if not busy:
                    t0 = time.perf_counter()
                    time.sleep(0.002)
                    self.idle_s += time.perf_counter() - t0
        except BaseException as e:  # surfaced in the trainer's thread by next_batch / call
            self._error = e
            self._ready.set()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"generation thread failed: {self._error}") from self._error

    def _acquire(self):
        self._want += 1
        self.lock.acquire()
        self._want -= 1

    def next_batch(self, n: int, trainer_version: int, timeout_s: float = 3600.0):
        """Block until ``n`` groups are ready; returns them (oldest first)."""
        deadline = time.monotonic() + timeout_s
        out: list = []
        while True:
            self._ready.clear()
            out += self.call(Scheduler.take, n - len(out), trainer_version)
            if len(out) >= n:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"only {len(out)}/{n} groups ready after {timeout_s}s")
            self._ready.wait(timeout=min(left, 0.5))  # lock not held: generation goes on

    def publish(self, state_dict, version: int) -> None:
        self.call(lambda s: s.update_weights(state_dict, version))

    def call(self, fn, *args, **kwargs):
        """Run ``fn(scheduler, ...)`` while the generation thread is paused. Refuses once the
        generation thread has failed, so a broken scheduler is never checkpointed."""
        self._acquire()
        try:
            self._check()
            return fn(self.scheduler, *args, **kwargs)
        finally:
            self.lock.release()

    def stop(self) -> None:
        with self.lock:
            self._stop = True
        self._thread.join(timeout=30)

"""The scoring pool: score finished rollouts off the main thread, with timeouts and crash
containment, so that scoring overlaps generation.

Owns dispatching ``submit(rollout, example)`` calls to workers, the per-call timeout,
replacing dead or hung workers, and counting what went wrong. Must not know what the
verifiers do (``reroll.verifiers.combine`` builds the Reward) nor import torch.

``workers >= 1``: each worker is a fresh interpreter (``python -m reroll.verifiers.worker``:
spawn semantics, never fork, since the parent runs torch threads; unlike the
multiprocessing ``spawn`` context it does not re-import the parent's ``__main__``, which
would drag torch into every worker). One dispatcher thread per worker sends it one call at
a time. A verifier that raises gives an error Score (inside the worker); one that hangs
past ``timeout_s`` or kills its worker (``os._exit``, segfault) gives an error Score with
the reason, the worker is killed and replaced, and the pool keeps going. Components that
finished before the culprit keep their scores; those after it get an error "not run".
Workers die with the pool's process (`reroll.verifiers.worker`), also after ``kill -9``.

Some failures are not the sample's but the reward's, and scoring cannot go on: a reward the
workers cannot build (a module they cannot import), or more than ``max_worker_crashes``
worker deaths (a reward that kills its own process). Then every Future from then on fails
with a `reroll.errors.RewardError` naming the reason, which stops the run with that message
(instead of respawning workers forever). A reward that can only run in this process (a
function defined in ``__main__``) is refused when the pool is built.

``inline = True``: ``submit`` scores in the caller's thread and returns a finished Future:
no hand-off, no process, no timeout. Only for verifiers registered ``cheap`` (pure, bounded,
microseconds); `reroll.build_rollout.build_scorer` decides (``reward.inline``). Exceptions still
become error Scores.

``workers = 0``: calls run in a background thread of this process, each call in its own
daemon thread joined with the timeout. Exceptions are still captured, but a call that hangs
can only be *abandoned* (its thread keeps running), not killed, and a verifier that calls
``os._exit`` or crashes takes the whole process with it. Use it for cheap, trusted
verifiers.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from reroll.errors import RewardError
from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.combine import Reward, build_reward, score_one

STARTUP_TIMEOUT_S = 120.0


@dataclass
class _Job:
    job_id: int
    rollout: Rollout
    example: Example
    future: Future | None  # None: scored inline by `score`
    submitted: float


class _Worker:
    """One worker process and its two pipe ends."""

    def __init__(self, specs: list[dict], default: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reroll.verifiers.worker", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True)
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)  # type: ignore[union-attr]
        self.rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)  # type: ignore[union-attr]
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.fatal: str | None = None
        self.broken = False  # the reward itself cannot be built: no use in a new worker
        try:
            self.tx.send(("init", list(sys.path), specs, default))
        except OSError:
            self.fatal = f"scoring worker died at startup ({self.exit_reason()})"
            return
        if not self.rx.poll(STARTUP_TIMEOUT_S):
            self.fatal = f"scoring worker did not start within {STARTUP_TIMEOUT_S:g}s"
            return
        try:
            kind, payload = self.rx.recv()
        except (EOFError, OSError):
            kind, payload = "fatal", f"scoring worker died at startup ({self.exit_reason()})"
        if kind == "fatal":
            self.fatal = f"scoring worker could not build the reward: {payload}"
            self.broken = True

    def exit_reason(self) -> str:
        try:
            rc = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self.tx.close()
        self.rx.close()

    def stop(self) -> None:
        try:
            self.tx.send(None)
            self.proc.wait(timeout=5.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class Scorer:
    """What every scorer shares: the Reward that names and combines the components. The
    subclasses add ``submit(rollout, example) -> Future[list[Score]]``, ``stats``, ``close``."""

    reward: Reward

    @property
    def names(self) -> list[str]:
        return self.reward.names

    def combine(self, scores: list[Score]) -> float | None:
        return self.reward.combine(scores)


class ScoringPool(Scorer):
    """``submit(rollout, example) -> Future[list[Score]]``; see the module docstring."""

    def __init__(self, reward_specs: list[dict], default_spec: dict, *, workers: int = 1,
                 timeout_s: float = 10.0, inline: bool = False, max_worker_crashes: int = 10):
        if workers < 0:
            raise ValueError(f"ScoringPool: workers must be >= 0, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"ScoringPool: timeout_s must be > 0, got {timeout_s}")
        self.reward: Reward = build_reward(reward_specs, default_spec)  # validates specs here
        self._specs, self._default = list(reward_specs), dict(default_spec)
        self.workers, self.timeout_s, self.inline = workers, timeout_s, inline
        self.max_worker_crashes = max_worker_crashes
        self._broken: str | None = None  # why scoring cannot go on (see the module docstring)
        if workers > 0 and not inline:
            for comp in self.reward.components:
                why = getattr(comp.verifier, "caller_only", None)
                if why:
                    raise RewardError(f"reward component {comp.label}: {why} "
                                      f"(reward.workers={workers}).")
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False
        self._stats: dict[str, Any] = {"calls": 0, "errors": Counter(), "timeouts": 0,
                                       "crashes": 0, "worker_restarts": 0, "skipped": 0, "latency_s": 0.0,
                                       "wait_s": 0.0}
        self._threads = [threading.Thread(target=self._slot, args=(i,), daemon=True,
                                          name=f"reroll-scoring-{i}")
                         for i in range(0 if inline else max(workers, 1))]
        for t in self._threads:
            t.start()

    # ---- public ---------------------------------------------------------------------
    def submit(self, rollout: Rollout, example: Example) -> Future:
        """Queue one finished rollout; the Future resolves to one Score per component
        (already resolved when the pool scores inline)."""
        fut: Future = Future()
        if self.inline:
            fut.set_result(self.score(rollout, example))
            return fut
        with self._lock:  # the put under the lock: never after close()'s stop sentinels
            self._jobs.put(_Job(self._new_id(locked=True), rollout, example, fut,
                                time.perf_counter()))
        return fut

    def score(self, rollout: Rollout, example: Example) -> list[Score]:
        """Inline scorers only: the Scores now, in the caller's thread (no Future)."""
        if not self.inline:
            raise RuntimeError("ScoringPool.score is for inline scoring; use submit")
        job = _Job(self._new_id(), rollout, example, None, time.perf_counter())
        scores = [score_one(c, rollout, example) for c in self.reward.components]
        self._finish(job, scores, None, job.submitted)
        return scores

    def _new_id(self, locked: bool = False) -> int:
        if not locked:
            with self._lock:
                return self._new_id(locked=True)
        if self._closed:
            raise RuntimeError("ScoringPool.submit after close()")
        self._next_id += 1
        return self._next_id

    def stats(self) -> dict[str, Any]:
        """calls, errors per component (the culprits), timeouts, crashes, worker restarts,
        skipped components (not run after a culprit), mean latency (dispatch to result)
        and mean queue wait, in seconds."""
        with self._lock:
            s = dict(self._stats)
            n = max(s["calls"], 1)
            return {"calls": s["calls"], "errors": dict(s["errors"]),
                    "error_total": sum(s["errors"].values()), "timeouts": s["timeouts"],
                    "crashes": s["crashes"], "worker_restarts": s["worker_restarts"],
                    "skipped": s["skipped"],
                    "mean_latency_s": s["latency_s"] / n, "mean_wait_s": s["wait_s"] / n,
                    "pending": self._jobs.qsize(), "workers": 0 if self.inline else self.workers,
                    "inline": self.inline}

    def close(self) -> None:
        """Finish the calls already submitted, then stop the workers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- dispatch -------------------------------------------------------------------
    def _slot(self, index: int) -> None:
        # workers start at once, so the first calls do not wait for an interpreter
        worker = _Worker(self._specs, self._default) if self.workers > 0 else None
        while True:
            job = self._jobs.get()
            if job is None:
                break
            if not job.future.set_running_or_notify_cancel():
                continue
            if self._broken is not None:
                job.future.set_exception(RewardError(self._broken))
                continue
            if self.workers == 0:
                t0 = time.perf_counter()
                scores, failure = self._in_thread(job)
            else:
                if worker is None:  # replaced after a timeout or a crash
                    worker = _Worker(self._specs, self._default)
                    self._count("worker_restarts")
                t0 = time.perf_counter()
                scores, failure = self._in_worker(worker, job)
                if failure is not None:
                    self._give_up_if_hopeless(worker, failure, scores)
                    worker.kill()
                    worker = None
            self._finish(job, scores, failure, t0)
        if worker is not None:
            worker.stop()

    def _give_up_if_hopeless(self, worker: _Worker, failure: str, scores: list[Score]) -> None:
        """After a failed call: stop scoring when the reward cannot be built, or when
        workers died more than ``max_worker_crashes`` times (this death included)."""
        with self._lock:
            crashes = self._stats["crashes"] + (failure == "crash")
        why = next((s.error for s in scores if not s.ok), failure)
        if worker.broken:
            self._broken = f"scoring stopped: {worker.fatal}"
        elif failure == "crash" and crashes > self.max_worker_crashes:
            self._broken = (f"scoring stopped: scoring workers died {crashes} times, more "
                            f"than reward.max_worker_crashes={self.max_worker_crashes} (a "
                            f"reward that kills its own process, or crashes it); last: {why}")

    def _in_thread(self, job: _Job) -> tuple[list[Score], str | None]:
        got: dict[int, Score] = {}

        def run() -> None:
            for i, comp in enumerate(self.reward.components):
                got[i] = score_one(comp, job.rollout, job.example)

        t = threading.Thread(target=run, daemon=True, name=f"reroll-score-call-{job.job_id}")
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            why = f"timed out after {self.timeout_s:g}s (thread abandoned: it cannot be killed)"
            return self._partial(dict(got), why), "timeout"
        return [got[i] for i in range(len(self.reward.components))], None

    def _in_worker(self, w: _Worker, job: _Job) -> tuple[list[Score], str | None]:
        if w.fatal is not None:
            return self._partial({}, w.fatal), "crash"
        got: dict[int, Score] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            w.tx.send((job.job_id, job.rollout, job.example))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not w.rx.poll(remaining):
                    return self._partial(got, f"timed out after {self.timeout_s:g}s"), "timeout"
                msg = w.rx.recv()
                if msg[0] == "score" and msg[1] == job.job_id:
                    got[msg[2]] = msg[3]
                elif msg[0] == "done" and msg[1] == job.job_id:
                    return [got[i] for i in range(len(self.reward.components))], None
        except (EOFError, OSError):
            return self._partial(got, f"scoring worker died ({w.exit_reason()})"), "crash"

    def _partial(self, got: dict[int, Score], why: str) -> list[Score]:
        """Scores for a call cut short: finished components kept, the running one blamed."""
        out, culprit = [], None
        for i, comp in enumerate(self.reward.components):
            if i in got:
                out.append(got[i])
            elif culprit is None:
                culprit = comp.name
                out.append(Score(name=comp.name, error=f"verifier {comp.label}: {why}",
                                 info={"reason": why}))
            else:
                out.append(Score(name=comp.name, error=f"not run: verifier {culprit!r} {why}",
                                 info={"reason": "not run"}))
        return out

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _finish(self, job: _Job, scores: list[Score], failure: str | None, t0: float) -> None:
        now = time.perf_counter()
        with self._lock:
            st = self._stats
            st["calls"] += 1
            st["latency_s"] += now - t0
            st["wait_s"] += t0 - job.submitted
            if failure == "timeout":
                st["timeouts"] += 1
            elif failure == "crash":
                st["crashes"] += 1
            for s in scores:
                if s.ok:
                    continue
                if s.info.get("reason") == "not run":
                    st["skipped"] += 1
                else:
                    st["errors"][s.name] += 1
        if job.future is not None and failure is not None and self._broken is not None:
            job.future.set_exception(RewardError(self._broken))
        elif job.future is not None:
            job.future.set_result(scores)

"""Scoring on Ray: verifier work spread over `ScoringActor`s, behind the scorer interface the
scheduler already uses (``submit(rollout, example) -> Future[list[Score]]``, ``combine``,
``names``, ``stats``, ``close``), so nothing above it changes.

Each actor runs a `reroll.verifiers.ScoringPool` (worker processes, per-call timeouts, the
sandbox), so a verifier that raises, hangs or crashes gives an error Score exactly as on the
local runtime. What Ray adds is placement: on a cluster the actors run on other nodes, and the
driver only routes. A killed actor loses nothing: every call it had not answered is sent again
to a fresh actor (counted in ``stats()["requeued"]`` and ``["restarts"]``); a verifier's own
failure is never retried here, it is data.

Enabled with ``runtime.kind = "ray"`` and ``runtime.scoring_workers = N`` (actors), each with
``reward.workers`` processes.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any

import ray
from ray.exceptions import RayActorError

from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.combine import Reward, build_reward
from reroll.verifiers.pool import Scorer


# num_cpus=0: verifier work happens in the pool's own worker processes, which Ray does not
# count either; reserving CPUs here would starve the engine actors on a small machine.
@ray.remote(num_cpus=0)
class ScoringActor:
    def __init__(self, specs: list[dict], default: dict, workers: int, timeout_s: float,
                 max_worker_crashes: int = 10):
        from reroll.verifiers import ScoringPool

        self.pool = ScoringPool(specs, default, workers=workers, timeout_s=timeout_s,
                                max_worker_crashes=max_worker_crashes)

    def score(self, rollout: Rollout, example: Example) -> list[Score]:
        return self.pool.submit(rollout, example).result()

    def stats(self) -> dict:
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()


class RayScoringPool(Scorer):
    """The scorer interface over `actors` ScoringActors (least outstanding calls first)."""

    def __init__(self, reward_specs: list[dict], default_spec: dict, *, actors: int = 1,
                 workers: int = 1, timeout_s: float = 10.0, max_worker_crashes: int = 10):
        if actors < 1:
            raise ValueError(f"RayScoringPool: actors must be >= 1, got {actors}")
        self.reward: Reward = build_reward(reward_specs, default_spec)  # validates specs here
        # a thread per pool worker inside each actor, so its calls run concurrently
        self._args = (list(reward_specs), dict(default_spec), workers, timeout_s,
                      max_worker_crashes)
        self._concurrency = max(1, workers)
        self._lock = threading.RLock()  # a ref already done runs its callback inside _dispatch
        self.actors = [self._spawn() for _ in range(actors)]
        self._outstanding: list[dict[int, tuple[Rollout, Example, Future]]] = [{} for _ in self.actors]
        self._next_id = 0
        self.requeued = self.restarts = 0
        self._closed = False

    def _spawn(self):
        return ScoringActor.options(max_concurrency=self._concurrency).remote(*self._args)

    # ---- the scorer interface (names and combine come from Scorer) ----------------------
    def submit(self, rollout: Rollout, example: Example) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("RayScoringPool.submit after close()")
            self._next_id += 1
            self._dispatch(self._next_id, rollout, example, fut)
        return fut

    def stats(self) -> dict[str, Any]:
        """The actors' pool statistics summed (calls, errors per component, timeouts,
        crashes, worker restarts) over the live actors, plus actor restarts and the calls
        re-sent after one."""
        agg: Counter = Counter()
        errors: Counter = Counter()
        for a in list(self.actors):
            try:
                s = ray.get(a.stats.remote())
            except RayActorError:
                continue
            errors.update(s["errors"])
            for k in ("calls", "timeouts", "crashes", "worker_restarts", "skipped"):
                agg[k] += s[k]
        return {**{k: agg[k] for k in ("calls", "timeouts", "crashes", "worker_restarts",
                                       "skipped")},
                "errors": dict(errors), "error_total": sum(errors.values()),
                "actors": len(self.actors), "restarts": self.restarts, "requeued": self.requeued,
                "pending": sum(len(o) for o in self._outstanding)}

    def close(self) -> None:
        """Wait for the calls already submitted, then stop the actors."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = [f for o in self._outstanding for (_, _, f) in o.values()]
        for f in waiting:
            f.exception()  # blocks until answered (a dead actor's calls are re-sent first)
        for a in self.actors:
            try:
                ray.get(a.close.remote())
            except RayActorError:
                pass
            ray.kill(a, no_restart=True)

    # ---- routing and fault handling ---------------------------------------------------
    def _dispatch(self, call_id: int, rollout: Rollout, example: Example, fut: Future) -> None:
        """Send one call to the least busy actor (lock held)."""
        i = min(range(len(self.actors)), key=lambda k: len(self._outstanding[k]))
        actor = self.actors[i]
        self._outstanding[i][call_id] = (rollout, example, fut)
        ref = actor.score.remote(rollout, example)
        ref.future().add_done_callback(lambda f: self._answered(i, actor, call_id, f))

    def _answered(self, i: int, actor, call_id: int, done: Future) -> None:
        err = done.exception()
        with self._lock:
            rollout, example, fut = self._outstanding[i].pop(call_id)
            if isinstance(err, RayActorError):
                if self.actors[i] is actor:  # first call to notice: replace the actor once
                    self._replace(i)
                self.requeued += 1
                self._dispatch(call_id, rollout, example, fut)
                return
        if err is not None:  # not a dead actor: a bug on our side, surfaced to the caller
            fut.set_exception(err)
        else:
            fut.set_result(done.result())

    def _replace(self, i: int) -> None:
        self.restarts += 1
        self.actors[i] = self._spawn()

    def kill_actor(self, i: int = 0) -> None:
        """Kill actor i now, whatever it is doing (for fault-injection tests)."""
        ray.kill(self.actors[i], no_restart=True)

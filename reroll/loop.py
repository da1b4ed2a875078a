"""The RL loop, written once: take a batch of complete groups, update the policy, checkpoint,
publish the new weights, log. Synchronous RL is ``runtime.max_staleness = 0`` of this same
loop (the admission rule then lets exactly one batch be generated per version).

Written against small protocols, so it knows no runtime, engine or scheduler: a
`BatchSource` (the rollout pipeline, wherever it runs), a `TrainerHandle` (in this process or
a Ray actor), a `WeightTransport` (trainer -> engines, by version), an evaluator, and the run
directory, and a `Cadence` (when to stop, log, checkpoint, record and evaluate). `reroll.runtime`
builds those and calls `run`. Holds no algorithm logic and knows no config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from reroll import timeline as tl
from reroll.rollout import Group
from reroll.runlog import RunDir
from reroll.stopping import StopFlag, Stopped
from reroll.trainer.metrics import batch_metrics, progress_bar
from reroll.trainer.step import TrainerHandle


class BatchSource(Protocol):
    def next_batch(self, trainer_version: int) -> list[Group]:
        """Block until one step's worth of complete, scored groups is ready for the update
        at ``trainer_version`` (within the staleness bound)."""
        ...

    def snapshot(self) -> tuple[list[Group], dict[str, Any]]:
        """Every unconsumed group (partial rollouts included) and the state that goes with
        it (data cursor, counters), consistent with each other."""
        ...

    def referenced_versions(self, trainer_version: int) -> set[int] | None:
        """The policy versions the unconsumed groups (buffered or in flight) may still hold
        tokens of, after the last `next_batch` (None: unknown). The trainer keeps old
        weights for exactly these (`reroll.trainer.snapshots`)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Monotone counters and times (engine, pipeline, score errors) for metrics."""
        ...


@dataclass(frozen=True)
class Cadence:
    """The loop's clock, in steps: train up to ``steps``; log every ``log_every`` and
    checkpoint every ``ckpt_every`` steps (and at the last); record the consumed groups every
    ``record_every`` and evaluate every ``eval_every`` steps (0: never; evaluation also
    runs once before the first step, unless ``eval_at_start`` is false: row 0 is then logged
    without it, the start of the clock). Built from the config by `reroll.build.cadence`."""

    steps: int
    log_every: int
    ckpt_every: int
    record_every: int = 0
    eval_every: int = 0
    eval_at_start: bool = True


class WeightTransport(Protocol):
    def publish(self, version: int) -> None:
        """Send the trainer's current weights to the engines as ``version``."""
        ...


def run(cadence: Cadence, *, trainer: TrainerHandle, source: BatchSource,
        transport: WeightTransport, run_dir: RunDir, evaluate: Callable[[], dict[str, float]],
        start_step: int = 0, progress: bool = True, stop: StopFlag | None = None
        ) -> dict[str, float]:
    """Train from ``start_step`` to ``cadence.steps``; returns the last step's metrics.

    A step's metrics row is logged before its checkpoint, so no row is ever lost between
    the two (a kill after the row and before the checkpoint redoes the step on resume, and
    the resume truncates the row). With ``stop`` requested (a signal), the loop checkpoints
    at the end of the current step and raises `Stopped`."""
    c, step, last = cadence, start_step, {}
    bar = progress_bar(c.steps, step, enabled=progress, every=c.log_every)
    try:
        if c.eval_every and step == 0:  # the starting point of the accuracy curve
            with tl.span("evaluate", step=0):
                run_dir.log(0, timed(evaluate) if c.eval_at_start else {})
        before = source.stats()  # counters are monotone: a step's delta is after - before
        while step < c.steps:
            t0 = time.perf_counter()
            with tl.span("wait for batch", step=step + 1):
                groups = source.next_batch(trainer.version)
                refs = source.referenced_versions(trainer.version)
            t1 = time.perf_counter()
            with tl.span("train", step=step + 1):
                metrics = trainer.step(groups, refs)
            t2 = time.perf_counter()
            step += 1
            if c.record_every and step % c.record_every == 0:
                with tl.span("record", step=step):
                    run_dir.record(step, groups)
            after = source.stats()
            metrics.update(batch_metrics(groups, before, after, wait_s=t1 - t0,
                                         train_s=t2 - t1, step_s=time.perf_counter() - t0))
            before = after
            if c.eval_every and step % c.eval_every == 0:
                with tl.span("evaluate", step=step):
                    metrics.update(timed(evaluate))
            stopping = stop is not None and stop.requested
            log = step % c.log_every == 0 or step == c.steps or stopping
            if step % c.ckpt_every == 0 or step == c.steps or stopping:
                if log:  # the row goes before its checkpoint, never lost between the two
                    run_dir.log(step, metrics)
                    log = False
                # before publishing: with max_staleness = 0 nothing is in flight now
                with tl.span("checkpoint", step=step):
                    save_checkpoint(run_dir.path, step, trainer, source)
            with tl.span("publish", step=step, version=trainer.version):
                transport.publish(trainer.version)
            if log:  # after publishing: written while the next batch is generated
                with tl.span("log", step=step):
                    run_dir.log(step, metrics)
            last = metrics
            bar.update(step, metrics)
            if stopping:
                raise Stopped(step, stop.signum)
    finally:
        bar.close()
    return last


def timed(evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Evaluation metrics plus how long they took (``time/eval_s``: wall time that is not
    training, e.g. for time-to-accuracy comparisons)."""
    t0 = time.perf_counter()
    out = evaluate()
    return {**out, "time/eval_s": time.perf_counter() - t0}


def save_checkpoint(run_dir: Path, step: int, trainer: TrainerHandle, source: BatchSource) -> Path:
    """Weights, optimiser, RNG, data cursor and every unconsumed group, captured together so
    that nothing is lost or counted twice on resume."""
    groups, state = source.snapshot()
    return trainer.save_checkpoint(run_dir, step, {**state, "version": trainer.version}, groups)

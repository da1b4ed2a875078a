"""`runtime.pin_cores`: which core each actor of the Ray runtime is pinned to, and the
pinning itself (os.sched_setaffinity in the actor's own process). Engine replica i takes the
i-th of the cores its process may use, the trainer actor the one after the replicas, so the
two sides never share a core; the driver, whose work is generation's (it steps the engines
and scores), shares replica 0's core for the run (`pin_driver`). Knows no Ray and no model.
"""

from __future__ import annotations

import os


def pinned_core(slot: int, cores: set[int] | list[int], workers: int) -> int:
    """The core of actor ``slot`` (engine replica 0 .. workers-1, the trainer ``workers``)
    among ``cores`` (this process' allowed cores); refuses too few cores, naming the keys."""
    allowed = sorted(cores)
    if workers + 1 > len(allowed):
        raise ValueError(f"runtime.pin_cores: {workers} engine worker(s) + the trainer need "
                         f"{workers + 1} cores, this process may use {len(allowed)} "
                         f"({allowed}); set runtime.pin_cores = false or fewer engine_workers")
    return allowed[slot]


def pin(slot: int, workers: int) -> int:
    """Pin this process to its core (`pinned_core`); returns the core."""
    core = pinned_core(slot, os.sched_getaffinity(0), workers)
    os.sched_setaffinity(0, {core})
    return core


def _set_threads(cores: set[int]) -> None:
    """Every thread of this process to ``cores`` (an affinity is per thread on Linux)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread gone, or not ours
            pass


def pin_driver(workers: int):
    """Pin every thread of this process (the driver) to engine replica 0's core; returns a
    function that gives them back the cores they had."""
    before = os.sched_getaffinity(0)
    _set_threads({pinned_core(0, before, workers)})
    return lambda: _set_threads(before)

"""`runtime.pin_cores`: which core each actor of the Ray runtime is pinned to, and the
pinning itself (os.sched_setaffinity in the actor's own process). Engine replica i takes the
i-th of the cores its process may use, the trainer actor the one after the replicas, so the
two sides never share a core; the driver keeps every core. Knows no Ray and no model.
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

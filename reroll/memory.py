"""A run's process and its heaps: glibc keeps the memory it frees (a step does not page it in
again), and Python's collector leaves alone what set-up made (a step is not held up by it).

With glibc's defaults, memory freed at the top of a heap beyond ``M_TRIM_THRESHOLD`` goes back
to the OS and blocks of ``M_MMAP_THRESHOLD`` or more are separate mappings unmapped on free;
both thresholds move with the sizes seen. An RL step allocates and frees the same tensors
every step, so memory handed back is faulted in again on the next one. When the trainer's
shapes vary from step to step (samples left out of the update, varying lengths), the
thresholds keep moving and the engine's decode steps, in the same process, pay page faults:
on the 2-core box the main job's generation took 20 ms instead of 15 ms a step
(`benchmarks/skip_inert.py`). Fixing both thresholds (as setting ``MALLOC_MMAP_THRESHOLD_``
and ``MALLOC_TRIM_THRESHOLD_`` in the environment would) keeps the memory; the process'
resident size then stays at its peak. Elsewhere than glibc (macOS, musl) this does nothing.

The same goes for Python's own heap (`freeze_heap`): a full garbage collection scans every
object the process holds, and a process that has loaded torch, transformers, Ray and a
model holds several hundred thousand that live until it ends. The interpreter starts one
whenever enough long-lived objects have piled up, at a moment no one chooses, and it holds
every thread of the process while it scans. Moving everything alive once set-up is done to
the permanent generation (`gc.freeze`) leaves later collections only the objects made
since.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import sys
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
TRIM_THRESHOLD = 2**31 - 1  # an int: in practice never trim


@functools.lru_cache(maxsize=1)
def _mallopt():
    """glibc's ``mallopt``, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None  # macOS's libc has no mallopt; Windows no libc
    try:
        fn = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):  # musl: no mallopt
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see the module docstring);
    True where they were set, False where the C library is not glibc."""
    fn = _mallopt()
    if fn is None:
        return False
    done = [fn(M_MMAP_THRESHOLD, MMAP_THRESHOLD), fn(M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    return all(x == 1 for x in done)  # mallopt returns 1 on success


def freeze_heap() -> int:
    """Collect what set-up left behind, then exempt every object still alive from later
    collections (`gc.freeze`; see the module docstring): they are never scanned again, and
    a cycle among them is not freed while frozen. Returns how many objects are frozen. For
    a process that ends with its work (a Ray actor); one that goes on uses `frozen_heap`."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[None]:
    """Every object alive exempt from collections for the block (`gc.freeze`), then back
    under collection (`gc.unfreeze`), so a process that runs one run after another (a
    notebook, a test session) frees each run's cycles once it is over. Unlike
    `freeze_heap` it does not collect first: garbage frozen with the rest is freed after
    the block, and a process with a large heap (a long test session) pays no full
    collection to start a run. ``enabled`` False, or the heap frozen already (by the
    caller, or a run under way on another thread, which unfreezes it when it ends):
    nothing."""
    if not enabled or gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

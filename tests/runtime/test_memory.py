"""`runtime.keep_freed_memory`: with glibc's thresholds fixed, a freed 20 MiB block stays in
the process (its pages are not faulted in again next time); with glibc's defaults it goes
back to the OS. Each case in a fresh interpreter, since the setting is process-wide.
`runtime.gc_freeze` (`frozen_heap`): what is alive at the freeze is left alone by every
collection until the block ends, what comes after is collected as usual."""

import gc
import subprocess
import sys
import weakref

import pytest

from reroll.memory import _mallopt, frozen_heap

PROBE = """
import sys
from reroll.memory import keep_freed_memory

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = rss_mib()
block = b"x" * (20 * 2**20)  # malloc'd and written: every page resident
held = rss_mib()
del block
print(round(held - before), round(rss_mib() - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_stays_in_the_process_only_when_asked():
    if _mallopt() is None:  # asked without changing this test process' own settings
        pytest.skip("the C library is not glibc")
    got = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        got[mode] = [int(x) for x in out]  # MiB resident: while held, after the free
    assert got["keep"][0] >= 19 and got["keep"][1] >= 19  # kept after the free
    assert got["default"][0] >= 19 and got["default"][1] <= 1  # handed back to the OS



class Node:
    pass


def _dropped_cycle() -> weakref.ref:
    """A weak reference to a cycle no one holds: garbage only a collection frees."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def no_automatic_gc():
    """Only the collections a test asks for (an automatic one could free a cycle early)."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_a_frozen_heap_scans_only_what_comes_after_and_frees_the_rest_at_its_end(
        no_automatic_gc):
    assert gc.get_freeze_count() == 0
    before = _dropped_cycle()  # garbage already, frozen with the rest
    with frozen_heap():
        assert gc.get_freeze_count() > 1000  # the interpreter's and this session's objects
        inside = _dropped_cycle()
        gc.collect()
        assert inside() is None  # made after the freeze: collected as usual
        assert before() is not None  # frozen: no collection looks at it
    assert gc.get_freeze_count() == 0  # everything back under collection
    gc.collect()
    assert before() is None


def test_freeze_heap_collects_first_for_a_process_that_never_unfreezes():
    code = ("import gc, weakref\n"
            "gc.disable()\n"
            "from reroll.memory import freeze_heap\n"
            "class N: pass\n"
            "a, b = N(), N(); a.o, b.o = b, a; r = weakref.ref(a); del a, b\n"
            "assert freeze_heap() == gc.get_freeze_count() > 1000\n"
            "assert r() is None\n")  # collected before the freeze, not frozen with the rest
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_cycle_alive_at_the_freeze_is_freed_only_after_the_block(no_automatic_gc):
    held = [Node()]
    held[0].self = held[0]
    ref = weakref.ref(held[0])
    with frozen_heap():
        held.clear()  # garbage now, but frozen: no collection looks at it
        gc.collect()
        assert ref() is not None
    gc.collect()
    assert ref() is None


def test_a_frozen_heap_can_be_turned_off():
    with frozen_heap(enabled=False):
        assert gc.get_freeze_count() == 0


def test_a_frozen_heap_leaves_a_freeze_it_did_not_make():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == frozen  # still the caller's
    finally:
        gc.unfreeze()

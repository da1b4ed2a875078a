"""`runtime.keep_freed_memory`: with glibc's thresholds fixed, a freed 20 MiB block stays in
the process (its pages are not faulted in again next time); with glibc's defaults it goes
back to the OS. Each case in a fresh interpreter, since the setting is process-wide."""

import subprocess
import sys

import pytest

from reroll.memory import _mallopt

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

"""runtime.threads: an explicit count is used as given; 0 gives each side every core in a
synchronous run (the trainer and the engine take turns) and half of them in an async run
(they work at once), and threads started later inherit the count. runtime.engine_threads
gives the engine's decode thread its own count, leaving the trainer's thread at its own."""

import asyncio
import os
import threading

import pytest
import torch

from reroll import build
from reroll.config_checks import load_checked
from reroll.engine import EngineService


@pytest.mark.parametrize("threads, staleness, cores, want", [
    (3, 0, 4, 3), (3, 2, 4, 3),  # explicit: as given
    (0, 0, 4, 4), (0, 1, 4, 2),  # auto: all cores in turn / half each at once
    (0, 0, 1, 1), (0, 3, 1, 1), (0, 2, 3, 1),
])
def test_threads_per_side(monkeypatch, threads, staleness, cores, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    cfg = load_checked(None, [f"runtime.threads={threads}", f"runtime.max_staleness={staleness}"])
    assert build.torch_threads(cfg) == want


def test_the_engine_thread_inherits_the_count_set_before_it_starts():
    before = torch.get_num_threads()
    seen = []
    try:
        build.prepare_process(load_checked(None, ["runtime.threads=1"]))
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


@pytest.mark.parametrize("engine, threads, staleness, want", [
    (0, 3, 0, 3), (0, 0, 0, 4), (0, 0, 1, 2),  # 0: the trainer's count
    (1, 0, 0, 1), (2, 1, 1, 2),  # as given, whatever the trainer's
])
def test_engine_threads(monkeypatch, engine, threads, staleness, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    cfg = load_checked(None, [f"runtime.engine_threads={engine}", f"runtime.threads={threads}",
                              f"runtime.max_staleness={staleness}"])
    assert build.engine_threads(cfg) == want


class _Counting:
    """A core that records the torch thread count of the thread it steps in."""

    def __init__(self):
        self.seen = []

    def step(self):
        self.seen.append(torch.get_num_threads())
        return []


def test_the_decode_thread_takes_engine_threads_and_leaves_the_trainers_alone():
    before = torch.get_num_threads()
    core = _Counting()
    try:
        build.prepare_process(load_checked(None, ["runtime.threads=2",
                                                  "runtime.engine_threads=1"]))

        async def main():
            svc = EngineService(core, threads=1)
            await asyncio.get_running_loop().run_in_executor(svc._pool, core.step)
            await svc.close()

        asyncio.run(main())
        # the trainer's thread keeps its 2 after the decode thread set 1 (the count is per
        # thread once a thread has asked for it, which prepare_process does)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert core.seen == [1] and after == 2

"""runtime.threads: an explicit count is used as given; 0 gives each side every core in a
synchronous run (the trainer and the engine take turns) and half of them in an async run
(they work at once), and threads started later (the engine's) inherit the count."""

import os
import threading

import pytest
import torch

from reroll import build
from reroll.config_checks import load_checked


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

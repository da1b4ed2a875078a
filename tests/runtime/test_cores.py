"""`runtime.pin_cores`: which core each Ray actor takes (engine replicas first, the trainer
after them), the refusal of too few cores, and the pinning of a real process."""

import os

import pytest

from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.runtime.cores import pin, pin_driver, pinned_core


def test_replicas_take_the_first_cores_and_the_trainer_the_next():
    cores = {5, 2, 9}  # a process allowed cores 2, 5 and 9
    assert [pinned_core(i, cores, 2) for i in range(3)] == [2, 5, 9]  # engines 0, 1; trainer
    assert pinned_core(1, [3, 4], 1) == 4  # one replica on core 3, the trainer on 4


def test_too_few_cores_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"runtime.pin_cores: 2 engine worker\(s\) \+ the "
                                         r"trainer need 3 cores, this process may use 2"):
        pinned_core(0, {0, 1}, 2)


def test_pin_restricts_this_process_to_its_core():
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two cores")
    try:
        core = pin(1, 1)  # the trainer's core with one replica: the second allowed one
        assert core == sorted(before)[1] and os.sched_getaffinity(0) == {core}
    finally:
        os.sched_setaffinity(0, before)


def test_pin_driver_pins_every_thread_and_gives_them_back():
    import threading

    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two cores")
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def other():
        started.set()
        stop.wait()
        seen["other"] = os.sched_getaffinity(0)  # this thread's own affinity

    t = threading.Thread(target=other)
    t.start()
    started.wait()
    undo = pin_driver(1)
    try:
        assert os.sched_getaffinity(0) == {sorted(before)[0]}  # engine replica 0's core
    finally:
        stop.set()
        t.join()
        undo()
    assert seen["other"] == {sorted(before)[0]}  # a thread started before was pinned too
    assert os.sched_getaffinity(0) == before


def test_pin_cores_needs_the_ray_runtime():
    with pytest.raises(ConfigError, match="runtime.pin_cores .* needs runtime.kind = \"ray\""):
        load_checked(None, ["runtime.pin_cores=true"])
    assert load_checked(None, ["runtime.pin_cores=true", "runtime.kind=ray"]).runtime.pin_cores

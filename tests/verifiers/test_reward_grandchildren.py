"""A reward's own child processes die with its scoring worker: when the pool kills the
worker for a timeout, on a clean close, and when the run itself is killed -9 (the worker
leads its own process group, and that group is killed, not only the worker)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from procs import alive

from reroll.rollout import Example, Rollout
from reroll.verifiers import ScoringPool

SPAWNS = textwrap.dedent('''
    import os, subprocess, time

    def spawn_then(prompts, completions, pid_file, **kw):
        # a grandchild of the pool: the reward's own process, which would outlive it
        child = subprocess.Popen(["sleep", "1000"])
        with open(pid_file[0] + ".tmp", "w") as f:
            f.write(str(child.pid))
        os.replace(pid_file[0] + ".tmp", pid_file[0])
        if completions[0] == "hang":
            time.sleep(600)
        return [1.0]
''')


@pytest.fixture
def spawning(tmp_path, monkeypatch):
    (tmp_path / "reroll_spawning_reward.py").write_text(SPAWNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return [{"name": "python", "args": {"fn": "reroll_spawning_reward:spawn_then"}}]


def _gone_within(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while alive(pid):
        assert time.monotonic() < deadline, f"the reward's child {pid} outlived its worker"
        time.sleep(0.05)


def _pid(pid_file, seconds: float = 120) -> int:
    deadline = time.monotonic() + seconds
    while not pid_file.is_file():
        assert time.monotonic() < deadline, "the reward never ran"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert alive(pid)  # it did start: the test would prove nothing otherwise
    return pid


def _job(text: str, pid_file) -> tuple[Rollout, Example]:
    return (Rollout("p", "g", [0], 0, completion=text),
            Example("p", "q", "a", fields={"pid_file": str(pid_file)}))


def test_a_reward_child_dies_when_its_worker_is_killed_for_a_timeout(spawning, tmp_path):
    pid_file = tmp_path / "child.pid"
    with ScoringPool(spawning, {}, workers=1, timeout_s=5.0) as pool:
        future = pool.submit(*_job("hang", pid_file))
        child = _pid(pid_file)
        scores = future.result(timeout=120)
        assert not scores[0].ok and "timed out after 5s" in scores[0].error
        _gone_within(child, 10)


def test_a_reward_child_dies_when_the_pool_closes(spawning, tmp_path):
    pid_file = tmp_path / "child.pid"
    with ScoringPool(spawning, {}, workers=1, timeout_s=60.0) as pool:
        assert pool.submit(*_job("return", pid_file)).result(timeout=120)[0].value == 1.0
        child = _pid(pid_file)
    _gone_within(child, 10)


RUN = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {rewards!r})
    from reroll.rollout import Example, Rollout
    from reroll.verifiers import ScoringPool
    pool = ScoringPool([{{"name": "python",
                         "args": {{"fn": "reroll_spawning_reward:spawn_then"}}}}], {{}},
                       workers=1, timeout_s=600)
    pool.submit(Rollout("p", "g", [0], 0, completion="hang"),
                Example("p", "q", "a", fields={{"pid_file": {pid_file!r}}}))
    time.sleep(600)
''')


def test_a_reward_child_dies_with_a_run_killed_by_sigkill(spawning, tmp_path):
    pid_file = tmp_path / "child.pid"
    run = subprocess.Popen([sys.executable, "-c",
                            RUN.format(rewards=str(tmp_path), pid_file=str(pid_file))],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = _pid(pid_file)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    _gone_within(child, 10)

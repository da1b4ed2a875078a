"""A reward the scoring pool cannot go on with: one the workers cannot import, one that keeps
killing its worker, one defined in ``__main__``; and a worker whose run is killed -9 does not
survive it."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest
from procs import alive

from reroll.errors import RewardError
from reroll.rollout import Example, Rollout
from reroll.verifiers import ScoringPool

EX = Example("p", "q", "ok")


def rollout(text: str = "x") -> Rollout:
    return Rollout("p", "g", [0], 0, completion=text)


def test_a_reward_workers_cannot_import_stops_scoring_at_once(monkeypatch):
    ghost = types.ModuleType("reroll_ghost_rewards")  # importable here, not in a worker
    ghost.fn = lambda prompts, completions, **kw: [1.0]
    monkeypatch.setitem(sys.modules, "reroll_ghost_rewards", ghost)
    specs = [{"name": "python", "args": {"fn": "reroll_ghost_rewards:fn"}}]
    with ScoringPool(specs, {}, workers=1, timeout_s=20) as pool:
        futs = [pool.submit(rollout(), EX) for _ in range(3)]
        for f in futs:
            with pytest.raises(RewardError, match="could not build the reward.*reroll_ghost"):
                f.result(timeout=120)
        st = pool.stats()
    assert st["worker_restarts"] == 0  # no respawning a worker that can never work


def test_a_reward_that_keeps_killing_its_worker_stops_after_max_worker_crashes(rewards_module):
    specs = [{"name": "python", "args": {"fn": f"{rewards_module}:die"}}]
    with ScoringPool(specs, {}, workers=1, timeout_s=20, max_worker_crashes=2) as pool:
        got = [pool.submit(rollout(), EX) for _ in range(5)]
        errors = [f.result(timeout=120)[0].error for f in got[:2]]
        for f in got[2:]:
            with pytest.raises(RewardError, match=r"died 3 times, more than "
                               r"reward.max_worker_crashes=2.*exit code 7"):
                f.result(timeout=120)
        st = pool.stats()
    assert all("scoring worker died (exit code 7)" in e for e in errors)
    assert st["crashes"] == 3 and st["worker_restarts"] == 2


def test_a_reward_defined_in_main_is_refused_for_workers_and_works_in_a_thread(monkeypatch):
    monkeypatch.setattr(sys.modules["__main__"], "reroll_main_reward",
                        lambda prompts, completions, **kw: [2.0], raising=False)
    specs = [{"name": "python", "args": {"fn": "__main__:reroll_main_reward"}}]
    with pytest.raises(RewardError, match=r"defined in the script being run.*"
                       r"'my_rewards:reroll_main_reward'.*reward.workers=0"):
        ScoringPool(specs, {}, workers=1)
    with ScoringPool(specs, {}, workers=0) as pool:
        assert pool.submit(rollout(), EX).result(timeout=60)[0].value == 2.0


RUN = textwrap.dedent('''
    import sys
    sys.path.insert(0, {rewards!r})
    from reroll.rollout import Example, Rollout
    from reroll.verifiers import ScoringPool
    pool = ScoringPool([{{"name": "python", "args": {{"fn": "pid_hang:hang"}}}}], {{}},
                       workers=1, timeout_s=600)
    pool.submit(Rollout("p", "g", [0], 0, completion="x"), Example("p", "q", "a"))
    import time
    time.sleep(600)
''')


def test_a_hung_worker_dies_with_a_run_killed_by_sigkill(tmp_path):
    pid_file = tmp_path / "worker.pid"
    (tmp_path / "pid_hang.py").write_text(textwrap.dedent(f'''
        import os, time
        def hang(prompts, completions, **kw):
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
    '''))
    run = subprocess.Popen([sys.executable, "-c", RUN.format(rewards=str(tmp_path))],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 120
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and run.poll() is None, "the reward never ran"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        assert worker != run.pid
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    deadline = time.monotonic() + 10
    while alive(worker):
        assert time.monotonic() < deadline, f"scoring worker {worker} outlived its run"
        time.sleep(0.1)

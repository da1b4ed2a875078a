"""The scoring worker process: ``python -m reroll.verifiers.worker`` (started by the pool).

Owns one loop: build the Reward from the specs it is sent, then score jobs, sending each
component's Score as soon as it is ready (so that when a verifier hangs or kills the
process, the pool knows which one it was). Must not import torch, and knows nothing about
the pool's timeouts or restarts.

The worker never outlives the run, also after ``kill -9`` of it: on Linux the kernel kills
it when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), and a watchdog thread checks
the parent every half second (other platforms, and a parent that died before the
``prctl``), then kills the worker's process group (it leads one). Nor do the processes a
reward starts itself (``subprocess.Popen(...)`` in the user's function) outlive the worker:
they are in its process group, and a guardian process forked before anything else waits
for the worker to die, however it dies (killed by the pool for a timeout, by the kernel with
the run, a crash, a clean exit), and then kills the group. A process that leaves the group
on purpose (``setsid``) is beyond this; the ``code`` verifier's sandbox bounds its own.

Protocol, pickled frames (``multiprocessing.connection.Connection``) over the process's
original stdin/stdout; fd 1 is pointed at stderr so a verifier's prints cannot corrupt it:
    in : ("init", sys_path, specs, default)  then  (job_id, rollout, example) ...  then None
    out: ("ready", pid) | ("fatal", message);  per job ("score", job_id, i, Score) ...
         ("done", job_id)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection


def serve(conn: Connection) -> None:
    from reroll.verifiers.combine import build_reward, score_one

    _, sys_path, specs, default = conn.recv()
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        from reroll.plugins import import_inherited

        import_inherited()  # the run's plug-in modules (`reroll.plugins`): its verifiers
        reward = build_reward(specs, default)
        for comp in reward.components:
            warm = getattr(comp.verifier, "warmup", None)
            if warm is not None:
                warm()
    except Exception as e:
        conn.send(("fatal", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        job_id, rollout, example = msg
        for i, comp in enumerate(reward.components):
            conn.send(("score", job_id, i, score_one(comp, rollout, example)))
        conn.send(("done", job_id))


def _pdeathsig(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _guard_group() -> None:
    """Fork the guardian: a process of this worker's group that waits for the worker to die
    (a signal from the kernel on Linux, else a poll of its parent pid every 0.2 s), then kills
    the whole group, the reward's own children with it. Call before any thread starts."""
    worker = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    if os.fork() != 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # holds no end of the protocol pipes: the pool sees the worker's EOF
        os.dup2(null, 1)
        _pdeathsig(signal.SIGUSR1)
        while os.getppid() == worker:
            signal.sigtimedwait({signal.SIGUSR1}, 0.2)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(0)


def _die_with(parent: int) -> None:
    """Kill this worker's process group when ``parent`` is gone (see the module docstring)."""
    _pdeathsig(signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    if os.getppid() != parent:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="reroll-parent-watch").start()


def main() -> None:
    if len(sys.argv) > 1:  # the pool's pid
        if os.getpgrp() == os.getpid():  # it leads its group (the pool starts it so)
            _guard_group()  # first: a fork before any thread
        _die_with(int(sys.argv[1]))
    rd, wr = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # prints from verifiers go to stderr, never into the protocol stream
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    with Connection(rd, writable=False) as cin, Connection(wr, readable=False) as cout:
        serve(_Duplex(cin, cout))  # type: ignore[arg-type]


class _Duplex:
    """send on one one-way Connection, recv on another."""

    def __init__(self, cin: Connection, cout: Connection):
        self.recv, self.send = cin.recv, cout.send


if __name__ == "__main__":
    main()

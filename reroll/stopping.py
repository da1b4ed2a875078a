"""Clean stops on SIGINT / SIGTERM: the first signal asks the loop to stop at the end of the
current step (after a checkpoint); a second one stops at once (KeyboardInterrupt).

Owns only the flag and the handlers; the loop reads ``StopFlag.requested`` between steps
and raises `Stopped`, which the CLI turns into one line and exit code 130 / 143.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Stopped(Exception):
    """The run stopped on a signal at a safe point; a checkpoint of ``step`` was written."""

    def __init__(self, step: int, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.step, self.signum = step, signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_on_signals(flag: StopFlag):
    """Install the handlers for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag.requested:  # the second signal: stop now
            raise KeyboardInterrupt
        flag.signum = signum

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)

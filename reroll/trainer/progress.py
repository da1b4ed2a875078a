"""The progress display of an RL run, on stderr (stdout is kept for the command's result).

With a terminal: a rich bar with reward, accuracy, length, held-out accuracy, steps/s and
ETA, redrawn every step. Without one (a pipe, a log file, a batch job): one plain line
every ``every`` steps and at the last step, flushed at once, so the log shows progress
while the run goes on. Knows the metric names it shows; no training logic.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO


def rate_and_eta(done: int, elapsed_s: float, remaining: int) -> tuple[float, float]:
    """Steps per second over the run so far and the seconds the ``remaining`` steps take at
    that rate (0, inf before any step has been timed)."""
    if done <= 0 or elapsed_s <= 0:
        return 0.0, float("inf")
    rate = done / elapsed_s
    return rate, remaining / rate


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (``?`` when unknown)."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(m: dict, eval_acc: float | None) -> str:
    """The metrics part of a progress line."""
    text = (f"reward {m.get('reward/mean', 0):.3f} acc {m.get('reward/accuracy', 0):.3f}"
            f" len {m.get('length/mean', 0):.1f}")
    return text + (f" eval {eval_acc:.3f}" if eval_acc is not None else "")


class Progress(Protocol):
    def update(self, step: int, m: dict) -> None: ...

    def close(self) -> None: ...


class _Timing:
    """Steps/s and ETA from the steps done since the display started; the last held-out
    accuracy seen (evaluation runs every eval.every steps, not every step)."""

    def __init__(self, total: int, start: int):
        self.total, self.start, self.t0 = total, start, time.perf_counter()
        self.eval_acc: float | None = None

    def tick(self, step: int, m: dict) -> tuple[str, float, float]:
        if "eval/greedy_accuracy" in m:
            self.eval_acc = m["eval/greedy_accuracy"]
        rate, eta = rate_and_eta(step - self.start, time.perf_counter() - self.t0,
                                 self.total - step)
        return describe(m, self.eval_acc), rate, eta


class PlainProgress(_Timing):
    """A line every ``every`` steps (and at the last), e.g.
    ``step 20/200 reward 0.512 acc 0.438 len 3.9 eval 0.600 | 8.31 steps/s ETA 0:00:22``."""

    def __init__(self, total: int, start: int, every: int, stream: TextIO):
        super().__init__(total, start)
        self.every, self.stream = max(1, every), stream

    def update(self, step: int, m: dict) -> None:
        text, rate, eta = self.tick(step, m)
        if step % self.every == 0 or step == self.total:
            self.stream.write(f"step {step}/{self.total} {text} | {rate:.2f} steps/s "
                              f"ETA {format_duration(eta)}\n")
            self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


class RichProgress(_Timing):
    def __init__(self, total: int, start: int, stream: TextIO):
        super().__init__(total, start)
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(TextColumn("[bold]RL[/]"), BarColumn(),
                          TextColumn("{task.completed}/{task.total}"),
                          TextColumn("{task.description}"),
                          TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                          TextColumn("ETA {task.fields[eta]}"),
                          console=Console(file=stream))
        self.task = self.p.add_task("", total=total, completed=start, rate="", eta="?")
        self.p.start()

    def update(self, step: int, m: dict) -> None:
        text, rate, eta = self.tick(step, m)
        self.p.update(self.task, completed=step, description=text,
                      rate=f"{rate:.2f} steps/s", eta=format_duration(eta))

    def close(self) -> None:
        self.p.stop()


class NoProgress:
    def update(self, step: int, m: dict) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, start: int = 0, enabled: bool = True, every: int = 10,
                 stream: TextIO | None = None) -> Progress:
    """The display for a run of ``total`` steps resumed at ``start``: rich on a terminal,
    plain lines every ``every`` steps otherwise (``stream``: stderr by default)."""
    if not enabled:
        return NoProgress()
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        return RichProgress(total, start, stream)
    return PlainProgress(total, start, every, stream)

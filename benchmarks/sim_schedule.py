"""How a run's schedule compares with the simulated one, beyond throughput
(benchmarks/sim_validate.py prints these): the time between updates (mean, spread, and
whether long and short ones alternate) and each update's marks from the runs' timelines
(`reroll.timeline.steps`)."""

from __future__ import annotations

import statistics
from pathlib import Path

from reroll import timeline


def intervals(ends: list[float]) -> tuple[float, float, float | None]:
    """The time between consecutive updates (``ends``: each step's end, in seconds): mean,
    population standard deviation and lag-1 autocorrelation (Pearson's r of each interval
    with the next; None with fewer than 3 intervals or a constant run of them). Near -1:
    long and short intervals alternate (generation ahead of the trainer one interval, behind
    it the next)."""
    d = [b - a for a, b in zip(ends, ends[1:])]
    if not d:
        return 0.0, 0.0, None
    try:  # fewer than two pairs, or a constant run: no correlation
        r = statistics.correlation(d[:-1], d[1:])
    except statistics.StatisticsError:
        r = None
    return statistics.fmean(d), statistics.pstdev(d), r


def intervals_text(ends: list[float]) -> str:
    mean, sd, r = intervals(ends)
    return f"{1e3 * mean:.0f} ms, sd {1e3 * sd:.0f}, r {'-' if r is None else f'{r:+.2f}'}"


def step_marks(run_dirs: list[Path], skip: int) -> list[dict]:
    """Each update's marks after the warm-up (`reroll.timeline.steps`) in the runs that
    recorded a timeline (RUN/timeline.json), pooled."""
    return [m for d in run_dirs if (d / "timeline.json").exists()
            for m in timeline.steps(timeline.read(d / "timeline.json")) if m["step"] > skip]


def marks_text(marks: list[dict]) -> str:
    """Medians of an update's marks: interval, train, loop, take (ms) and decode busy."""
    if not marks:
        return "-"
    med = {k: statistics.median(m[k] for m in marks) for k in marks[0] if k != "step"}
    return (f"{1e3 * med['interval']:.0f} = train {1e3 * med['train']:.0f} + loop "
            f"{1e3 * med['loop']:.0f} + take {1e3 * med['take']:.0f} ms, decoding "
            f"{100 * med['decode_busy']:.0f}%")

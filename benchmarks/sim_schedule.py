"""How a measured run compares with the simulated one (benchmarks/sim_validate.py prints
these, `report`): its throughput and trained samples by step (`measured`,
`samples_by_step`), the time between updates (mean, spread, and
whether long and short ones alternate), each update's marks from the runs' timelines
(`reroll.timeline.steps`), and a measured run's counts (requests resumed a step, by age,
quiet steps, lags, re-adds) read as the simulator's are."""

from __future__ import annotations

import statistics
from pathlib import Path

from reroll import timeline
from reroll.runlog import read_metrics, read_rollouts
from reroll.sim.calibrate import readds, resumed_tokens, resumes_by_age


def measured(run_dir: Path, skip: int) -> float:
    """Samples per second over the steps after ``skip``, from the rows' wall times."""
    rows = [r for r in read_metrics(run_dir) if "pipeline/samples_in_batch" in r]
    rows = rows[skip - 1:] if skip else rows
    n = sum(r["pipeline/samples_in_batch"] for r in rows[1:])
    return n / (rows[-1]["time"] - rows[0]["time"])


def samples_by_step(run_dir: Path) -> dict[int, float]:
    """Each logged step's trained samples."""
    return {r["step"]: r["pipeline/samples_in_batch"] for r in read_metrics(run_dir)
            if "pipeline/samples_in_batch" in r}


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


def counts(run_dir: Path, skip: int) -> dict:
    """The measured schedule after the first ``skip`` steps: requests resumed per step
    (engine/requests_resumed is cumulative), the quiet steps among them (`quiet_steps`)
    and the mean lag of a trained group (trainer version - start version, from the recorded
    rollouts)."""
    rows = [r for r in read_metrics(run_dir) if "pipeline/samples_in_batch" in r]
    res = [r.get("engine/requests_resumed", 0.0) for r in rows]
    toks = resumed_tokens(run_dir)
    lags: dict[int, dict[int, int]] = {}
    for step, g in read_rollouts(run_dir):
        if step > skip:
            lag = step - 1 - g["start_version"]
            lags.setdefault(step, {}).setdefault(lag, 0)
            lags[step][lag] += 1
    # an update's resumes are all recorded once the groups it caught are trained: the
    # updates after the warm-up up to the last step less the largest lag
    last = len(rows) - max((k for h in lags.values() for k in h), default=0)
    return {"resumed_per_step": (res[-1] - res[skip - 1]) / (len(res) - skip),
            "quiet_steps": quiet_steps([b - a for a, b in zip(res[skip - 1:], res[skip:])]),
            "resumed_tokens_per_step": (toks[-1] - toks[skip - 1]) / (len(toks) - skip),
            "lag": mean_lag(list(lags.values())),
            # spans split where new weights came: resumes only where the run resumed any
            "by_age": resumes_by_age(run_dir) if res and res[-1] > 0 else {},
            "updates": (skip + 1, last),
            "ends": [r["time"] for r in (rows[skip - 1:] if skip else rows)]}


def by_age(hists: dict[int, dict[int, int]], updates: tuple[int, int]) -> str:
    """Mean requests resumed at an update, by age (1, 2, ...), over ``updates`` (first and
    last, inclusive), e.g. "117+100"; "-" where none resumed."""
    vs = range(updates[0], updates[1] + 1)
    ages = sorted({a for v in vs for a in hists.get(v, {})})
    if not ages or not vs:
        return "-"
    return "+".join(f"{sum(hists.get(v, {}).get(a, 0) for v in vs) / len(vs):.0f}"
                    for a in range(1, ages[-1] + 1))


def quiet_steps(resumed: list[float]) -> int:
    """Steps (after the first of ``resumed``, the requests resumed a step) that neither
    they nor the step before resumed anything: generation kept ahead of the trainer, each
    step's new groups done before the next update. A lone step without resumes is not
    quiet: its batch was the last update's resumed requests, drained before the next."""
    return sum(a == 0 and b == 0 for a, b in zip(resumed, resumed[1:]))


def mean_lag(hists: list[dict[int, int]]) -> float:
    """The mean lag over histograms ``{lag: groups}``."""
    n = sum(c for h in hists for c in h.values())
    return sum(k * c for h in hists for k, c in h.items()) / max(1, n)


def readd_line(run_dir: Path, skip: int) -> str:
    """Groups re-added an update, the driver's time a group, and the last re-add to the
    first placement (least and most), over the updates after ``skip`` ("" if the run
    resumed nothing: without partial rollouts a span also begins at a weight load)."""
    rows = read_metrics(run_dir)
    if not rows or not rows[-1].get("engine/requests_resumed"):
        return ""
    u = [x for v, x in readds(run_dir).items() if v > skip]
    per = sorted(x["add_span_s"] / (x["groups"] - 1) for x in u if x["groups"] > 1)
    if not per:
        return ""
    after = [x["place_after_s"] for x in u]
    return (f"{sum(x['groups'] for x in u) / len(u):.1f} groups, "
            f"{1e3 * per[len(per) // 2]:.2f} ms a group (median), first placement "
            f"{1e3 * min(after):.0f}-{1e3 * max(after):.0f} ms after the last re-add")


def report(rows: list[tuple[str, float, dict, Path]], marks: dict[str, list[dict]],
           resuming: list[tuple[str, Path]], skip: int, fitted: set[str]) -> None:
    """Print each variant measured against simulated (``rows``: name, measured samples/s
    (its seeds' mean), `sim_validate.predicted`'s result and its run directory, the first
    the synchronous reference; ``fitted`` the ones the cost model was fitted on): the
    table, the speed-ups over the first, the largest miss, then the schedule after ``skip``
    warm-up steps (the resuming calibration runs' and the variants' re-adds, the time
    between updates, and each update's marks from ``marks``, the runs' `step_marks`)."""
    print("\n| variant | measured samples/s | predicted | predicted/measured | "
          "sim gen idle | sim train idle | resumed a step, measured / sim | "
          "resumed tokens a step, measured / sim | resumed at an update by age, measured / sim | "
          "quiet steps, measured / sim | "
          "mean lag, measured / sim |\n|---|---|---|---|---|---|---|---|---|---|---|")
    cs = {name: counts(d, skip) for name, _, _, d in rows}  # each run's read once
    for name, m, p, _ in rows:
        c = cs[name]
        print(f"| {name}{' (fitted on)' if name in fitted else ''} | {m:.1f} | {p['samples_per_s']:.1f} | "
              f"{p['samples_per_s'] / m:.3f} | {p['gen_idle']:.2f} | {p['train_idle']:.2f} | "
              f"{c['resumed_per_step']:.1f} / {p['resumed_per_step']:.1f} | "
              f"{c['resumed_tokens_per_step']:.0f} / {p['resumed_tokens_per_step']:.0f} | "
              f"{by_age(c['by_age'], c['updates'])} / {by_age(p['by_age'], c['updates'])} | "
              f"{c['quiet_steps']} / {p['quiet_steps']} | "
              f"{c['lag']:.2f} / {p['lag']:.2f} |")
    sync_m, sync_p = rows[0][1], rows[0][2]["samples_per_s"]
    print("\nspeed-up over sync, measured / predicted: " + ", ".join(
        f"{n} {m / sync_m:.2f} / {p['samples_per_s'] / sync_p:.2f}" for n, m, p, _ in rows[1:]))
    worst = max(abs(p["samples_per_s"] / m - 1) for _, m, p, _ in rows)
    print(f"max |predicted/measured - 1| = {100 * worst:.1f}%")
    print("\nresumed requests' way back into the engine (`calibrate.readds`, updates after "
          "the warm-up):")
    for name, d in [*resuming, *[(n, d) for n, _, _, d in rows]]:
        if line := readd_line(d, skip):
            print(f"  {name}: {line}")
    print("\ntime between updates after the warm-up (`intervals`: mean, sd, lag-1 "
          "autocorrelation r), measured / simulated:")
    for name, _, p, _ in rows[1:]:
        print(f"  {name}: {intervals_text(cs[name]['ends'])} / "
              f"{intervals_text(p['ends'])}")
    print("\nan update after the warm-up (`reroll.timeline.steps`, medians; the runs' "
          "timelines), measured / simulated:")
    for name, _, p, _ in rows:
        print(f"  {name}: {marks_text(marks[name])} / {marks_text(p['marks'])}")

"""The cost model's terms that a run's timeline (``log.timeline``, `reroll.timeline.read`)
gives and its metrics do not: how the loop's work shares the engine's core
(`loop_windows`, `loop_share`), the first step's extra loop work (`first_loop`), what
a weight update with partial rollouts costs a request in the engine (`update_stop`), and
where a sample's fixed cost falls (`row_costs`: the driver's add and its handling of a
finished sample; `handle_share`: that handling's share of the core beside decoding). The
rest of the calibration is `reroll.sim.calibrate`.

Knows timeline events (by their span and mark names) and the cost model's fields, nothing
else.
"""

from __future__ import annotations

import statistics
import warnings

from reroll.sim.calibrate import nnls, unstalled
from reroll.timeline import covered


def update_stop(timelines: list[list[dict]], *, skip: int = 1) -> dict[str, float]:
    """What a weight update with partial rollouts costs a request in the engine, off runs'
    timelines (``log.timeline``) of one engine each, the updates to versions after ``skip``:

    - ``abort_row_s``: from the rollout thread's ``publish begins`` mark, or from the end
      of the ``decode`` call under way then (the abort waits for it, and the simulator
      waits for the decode step under way before its stop), to the ``interrupt`` mark (the
      driver aborts every request in the engine, an engine call), against the requests
      aborted: the slope of a non-negative least-squares line (its intercept is the
      abort's fixed cost, which every update pays: ``sync_s`` has it);
    - ``readd_row_s``: the first ``add`` span after an update that aborted requests (the
      engine service adds them back at once, before the engine steps again) over the
      requests it added, summed over the updates.

    The two hold the engine (nothing is stepped before the re-add ends) and the trainer
    (its batch waits for them), so ``update_row_s`` (`SimSettings`) is their sum."""
    aborts, readd_s, readded = [], 0.0, 0
    for events in timelines:
        begun: dict[int, float] = {}
        waiting = False  # an update aborted requests: its re-add is the next add span
        decode_end = float("-inf")  # the end of the latest decode call begun so far
        for e in events:
            v = e["args"].get("version")
            if e["name"] == "decode" and "end" in e:
                decode_end = max(decode_end, e["end"])
            elif e["name"] == "publish begins":
                begun[v], waiting = e["t"], False
            elif e["name"] == "interrupt" and v in begun and v > skip:
                start = max(begun[v], min(decode_end, e["t"]))
                aborts.append((e["args"]["aborted"], e["t"] - start))
                waiting = e["args"]["aborted"] > 0
            elif e["name"] == "add" and waiting and "end" in e:
                readd_s += e["end"] - e["t"]
                readded += e["args"]["requests"]
                waiting = False
    if not readded:
        raise ValueError("update_stop: the timelines hold no update that aborted requests: "
                         "runs with partial rollouts, max_staleness > 0 and "
                         "log.timeline = true")
    if len({n for n, _ in aborts}) < 2:
        raise ValueError("update_stop: every update aborted the same number of requests, "
                         "which cannot separate the abort's cost a request from its fixed "
                         "cost: longer runs, or runs of other batch sizes")
    _, per = nnls([[1.0, n] for n, _ in aborts], [s for _, s in aborts])
    return {"abort_row_s": per, "readd_row_s": readd_s / readded}


def loop_windows(events: list[dict]) -> list[dict]:
    """Each update's loop work as a run's timeline (`reroll.timeline.read`) shows it: from
    the end of the trainer's ``train`` span of step k to the start of its next ``wait for
    batch`` (recording, metrics, the publish call, logging: what `fit` calls the loop's
    work), ``step``, its length ``s`` and ``decoding_s``, how much of it some ``decode``
    span covers (the engine had work beside it)."""
    waits_all = [e for e in events if e["name"] == "wait for batch"]
    trains = [e for e in events if e["name"] == "train"]
    if not trains or not waits_all:
        return []
    who = waits_all[0]["thread"]  # the trainer's: it waits for batches
    waits = sorted(e["t"] for e in waits_all if e["thread"] == who)
    decodes = sorted((e["t"], e["end"]) for e in events if e["name"] == "decode")
    out = []
    for tr in (e for e in trains if e["thread"] == who):
        lo = tr["end"]
        hi = next((t for t in waits if t >= lo), None)
        if hi is None:
            continue
        out.append({"step": tr["args"].get("step"), "s": hi - lo,
                    "decoding_s": covered(decodes, lo, hi)})
    return out


def loop_share(runs: list[tuple[list[dict], dict[int, float]]], *, loop_s: float,
               loop_row_s: float, skip: int = 1) -> float:
    """The share of a shared processor the loop's work gets while the engine beside it
    decodes (`SimSettings.loop_share`), from runs that generate during it (asynchronous):
    each is its timeline's `loop_windows` and its samples by step. Each window of the steps
    after ``skip`` does the fitted work ``W = loop_s + loop_row_s * samples`` (`fit`, from
    synchronous runs, where nothing decodes beside it) at full speed where nothing decodes
    and at the share where something does: ``W = (s - decoding_s) + share * decoding_s``.
    Solved over every window together (the work done beside decoding over the time spent
    beside it), stalled windows (`unstalled`) left out."""
    work = beside = 0.0
    for windows, samples in runs:
        kept = [w for w in windows if w["step"] is not None and w["step"] > skip
                and w["step"] in samples]
        for w, keep in zip(kept, unstalled([w["s"] for w in kept])):
            if keep:
                work += loop_s + loop_row_s * samples[w["step"]] - (w["s"] - w["decoding_s"])
                beside += w["decoding_s"]
    if beside <= 0:
        raise ValueError("loop_share: no loop work beside decoding in the runs' timelines "
                         "(they need max_staleness > 0 and log.timeline = true)")
    share = work / beside
    if not 0.05 <= share <= 0.95:
        warnings.warn(f"loop_share: the timelines give {share:.3f}, outside (0, 1) with room "
                      f"to spare: the synchronous fit's loop work and these runs' windows "
                      f"disagree; kept within [0.05, 0.95]", stacklevel=2)
    return float(min(0.95, max(0.05, share)))


def first_loop(runs: list[tuple[list[dict], dict[int, float]]], *, loop_s: float,
               loop_row_s: float) -> float:
    """The loop's work after a run's first step beyond its usual ``loop_s + loop_row_s *
    samples`` (`SimSettings.first_loop_s`: the first recording and logging set themselves
    up), from runs whose loop has its core to itself (synchronous: nothing decodes while it
    works): each is its timeline's `loop_windows` and its samples by step. The median over
    the runs of the first window's time not beside decoding, less the usual work; 0 where
    that is negative."""
    extra = []
    for windows, samples in runs:
        w = min((w for w in windows if w["step"] in samples), key=lambda w: w["step"],
                default=None)
        if w is not None:
            extra.append(w["s"] - w["decoding_s"] - loop_s - loop_row_s * samples[w["step"]])
    if not extra:
        raise ValueError("first_loop: no run's timeline has a loop window of a logged step "
                         "(log.timeline = true)")
    return max(0.0, float(statistics.median(extra)))


def _after_warmup(events: list[dict], skip: int) -> float | None:
    """When the publish of version ``skip`` + 1 was done (None: never)."""
    return next((e["t"] for e in events if e["name"] == "publish done"
                 and e["args"].get("version", 0) > skip), None)


def handout_gaps(events: list[dict], *, skip: int = 1) -> list[float]:
    """Each ``batch handed out`` mark after the publish of version ``skip`` + 1 that the
    trainer waited for: the time from the end of the latest ``decode`` call that finished
    requests and ended before it (since the previous mark) to the mark, over the requests
    that call finished: the driver's handling of the batch's last samples. A mark whose
    ``wait for batch`` began after that call ended (the batch was ready before the
    trainer asked) is left out."""
    start = _after_warmup(events, skip)
    out, calls = [], []  # decode calls that finished requests, since the last mark
    asked = float("-inf")  # when the trainer last began to wait for a batch
    for e in events:
        if start is None or e["t"] < start:
            continue
        if e["name"] == "wait for batch":
            asked = e["t"]
        elif e["name"] == "decode" and "end" in e and e["args"].get("finished"):
            calls.append(e)
        elif e["name"] == "batch handed out":
            ended = [c for c in calls if c["end"] <= e["t"]]
            if ended:
                last = max(ended, key=lambda c: c["end"])
                if asked <= last["end"]:
                    out.append((e["t"] - last["end"]) / last["args"]["finished"])
            calls = [c for c in calls if c["end"] > e["t"]]
    return out


def row_costs(timelines: list[list[dict]], *, skip: int = 1) -> dict[str, float]:
    """Where a sample's fixed cost falls, off synchronous runs' timelines, the updates to
    versions after ``skip``. The metrics' fit sees one cost a sample in the wait
    (``row_s``); the run pays it in three places, which an asynchronous run overlaps with
    training differently:

    - ``add_row_s``: the ``add`` spans' time over the requests they added (the engine
      thread adds what the driver submitted, between decode steps), spans over three
      times the median time a request left out (stalls: a garbage collection);
    - ``handle_row_s``: the median of `handout_gaps`: the driver's handling of a finished
      sample (in a synchronous run nothing else runs then);
    - the rest at admission."""
    adds, handled = [], []
    for events in timelines:
        handled += handout_gaps(events, skip=skip)
        start = _after_warmup(events, skip)
        adds += [(e["end"] - e["t"], e["args"]["requests"]) for e in events
                 if start is not None and e["t"] >= start and e["name"] == "add"
                 and "end" in e and e["args"]["requests"]]
    if not adds or not handled:
        raise ValueError("row_costs: the timelines hold no add span or no batch handed out "
                         "after a decode call that finished requests, after the warm-up: "
                         "runs with log.timeline = true")
    cap = 3 * statistics.median(s / n for s, n in adds)
    kept = [(s, n) for s, n in adds if s <= cap * n]
    return {"add_row_s": sum(s for s, _ in kept) / sum(n for _, n in kept),
            "handle_row_s": statistics.median(handled)}


def handle_share(timelines: list[list[dict]], *, handle_row_s: float,
                 skip: int = 1) -> float:
    """The share of the engine's core the driver's handling of finished samples gets
    while the engine decodes beside it, off asynchronous runs' timelines (the engine goes
    on decoding after a batch's last samples finish): ``handle_row_s`` (their handling
    alone, `row_costs`) over the median of their `handout_gaps`, kept within [0.05,
    0.95] (with a warning)."""
    gaps = [g for events in timelines for g in handout_gaps(events, skip=skip)]
    if not gaps:
        raise ValueError("handle_share: the timelines hold no batch handed out after a "
                         "decode call that finished requests, after the warm-up")
    share = handle_row_s / max(statistics.median(gaps), 1e-12)
    if not 0.05 <= share <= 0.95:
        warnings.warn(f"handle_share: the timelines give {share:.3f}; kept within "
                      f"[0.05, 0.95]", stacklevel=2)
    return float(min(0.95, max(0.05, share)))

"""The run's timeline (``log.timeline = true``): when each part of a run worked, span by span
and thread by thread, written to the run directory as a Chrome trace-event file
(RUN/timeline.json; open it in https://ui.perfetto.dev or chrome://tracing, or read it
with `read`).

Where the metrics say how long a step's wait, training and generation took in total, the
timeline says when: the trainer's wait for its batch, its update and its publish; the
publish's weight swap and the admissions after it in the rollout thread; the engine's
decode calls (how many steps, how many sequences) in the engine thread. That is what an
asynchronous schedule's overlap (or its lack) is made of, and what `reroll sim`'s events are
set against.

Recording is process-wide and off by default: `span` and `mark` cost one global read when
off. `recording(path)` turns it on for a block and writes the file when the block ends,
also when it raises, so a failed run keeps the timeline of what it did; while it runs,
PATH.partial holds the events up to the last few thousand, so a run killed outright keeps
most of it too (`read` and Perfetto open either). Threads of this
process only: under ``runtime.kind = "ray"`` the engine's and the trainer's work shows as
the actor calls the driver waits on (inside an actor, Ray's own ``ray timeline``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Events are kept in memory (about 600 bytes each) for the file written when the recording
# ends; past this many they are counted, not kept (about 300 MB; a decode span a decode
# step of a long run on a fast GPU could reach it). Every FLUSH_EVERY events they are also
# appended to PATH.partial (the trace format's JSON array, left open), so a run killed
# with SIGKILL keeps its timeline up to the last flush there; the finished file replaces it.
MAX_EVENTS = 500_000
FLUSH_EVERY = 2_000

_events: list[dict] | None = None  # None: not recording
_dropped = 0
_threads: dict[int, str] = {}
_generation = 0  # which recording: a span begun in one and ended in the next is dropped
_partial: Path | None = None  # the open-ended copy being appended to
_pending: list[dict] = []  # events (and thread names) not yet appended there
_lock = threading.Lock()
_file_lock = threading.Lock()
_gc_start: dict[int, float] = {}  # thread -> when its full collection began
# full collections ended, not yet recorded: `_on_gc` takes no lock (a collection can start
# on a thread inside `_add`, which holds ``_lock``), the next `_add` records them
_collections: list[dict] = []


def _now_us() -> float:
    return time.perf_counter_ns() / 1000.0


def _add(ev: dict, generation: int | None = None) -> None:
    """Record ``ev`` on this thread (dropped if it belongs to an earlier recording), with
    the collections `_on_gc` has queued since the last event."""
    ev["pid"], ev["tid"] = os.getpid(), threading.get_ident()
    ev["thread"] = threading.current_thread().name
    collections = _taken_collections()
    batch = None
    with _lock:
        if _events is None:
            return
        for e in collections:
            _keep(e)
        if generation is None or generation == _generation:
            _keep(ev)
        if len(_pending) >= FLUSH_EVERY:
            batch, _pending[:] = list(_pending), []
            target = _partial
    if batch:
        _append(target, batch)


def _keep(ev: dict) -> None:
    """Under ``_lock``: ``ev`` into the recording (and its thread's name, the first time)."""
    global _dropped
    tid, name = ev["tid"], ev.pop("thread")
    if tid not in _threads:
        _threads[tid] = name
        _pending.append({"name": "thread_name", "ph": "M", "pid": ev["pid"], "tid": tid,
                         "args": {"name": name}})
    if len(_events) < MAX_EVENTS:
        _events.append(ev)
        _pending.append(ev)
    else:
        _dropped += 1


def _taken_collections() -> list[dict]:
    """The collections `_on_gc` queued, taken off the queue (``list.pop`` is atomic: no
    lock, which a collection could interrupt)."""
    out = []
    while _collections:
        try:
            out.append(_collections.pop())
        except IndexError:  # another thread took the last one
            break
    return out[::-1]


def _append(partial: Path | None, batch: list[dict]) -> None:
    """Append events to the open-ended copy (outside the recording's lock)."""
    if partial is None:
        return
    with _file_lock:
        try:
            with open(partial, "a") as f:
                f.write("".join(json.dumps(e, default=str) + ",\n" for e in batch))
        except OSError:  # the copy is a safeguard; the finished file is the record
            pass


class _Span:
    __slots__ = ("name", "args", "t0", "generation")

    def __init__(self, name: str, args: dict):
        self.name, self.args, self.generation = name, args, _generation

    def __enter__(self) -> _Span:
        self.t0 = _now_us()
        return self

    def __exit__(self, *exc) -> None:
        t1 = _now_us()
        _add({"name": self.name, "ph": "X", "ts": self.t0, "dur": t1 - self.t0,
              "args": self.args}, self.generation)

    def set(self, **args: Any) -> None:
        """Add arguments known only inside the span (e.g. how many sequences finished)."""
        self.args.update(args)


class _Off:
    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def set(self, **args: Any) -> None:
        return None


_OFF = _Off()


def active() -> bool:
    return _events is not None


def span(name: str, **args: Any) -> _Span | _Off:
    """``with span("train", step=3):`` records the block's start and duration on this
    thread (the arguments are evaluated by the caller either way: keep them cheap). Spans of one thread must nest (the trace format's rule), so code that interleaves
    work on one thread (coroutines across an ``await``) records `mark`s instead."""
    return _Span(name, args) if _events is not None else _OFF


def mark(name: str, **args: Any) -> None:
    """A point in time on this thread (an instant event)."""
    if _events is not None:
        _add({"name": name, "ph": "i", "s": "t", "ts": _now_us(), "args": args})


def _on_gc(phase: str, info: dict) -> None:
    """`gc.callbacks` hook: each full collection (generation 2) as a ``gc`` span on the
    thread that triggered it. A full collection holds every Python thread of the process
    (it runs under the interpreter lock; native work that released it goes on) for as long as the heap takes to scan; younger generations
    are frequent and short, and left out. A collection can begin anywhere a thread
    allocates, `_add` under its lock included, so this takes no lock: the span is queued
    and the next event recorded (or the recording's end) records it."""
    if info.get("generation") != 2 or _events is None:
        return
    tid = threading.get_ident()
    if phase == "start":
        _gc_start[tid] = _now_us()
    elif (t0 := _gc_start.pop(tid, None)) is not None:
        _collections.append({"name": "gc", "ph": "X", "ts": t0, "dur": _now_us() - t0,
                             "args": {"collected": info.get("collected", 0),
                                      "uncollectable": info.get("uncollectable", 0)},
                             "pid": os.getpid(), "tid": tid,
                             "thread": threading.current_thread().name})


@contextlib.contextmanager
def recording(path: str | Path | None) -> Iterator[None]:
    """Record while the block runs and write the trace to ``path`` when it ends (None:
    record nothing). One recording at a time in a process."""
    global _events, _dropped, _generation, _partial
    if path is None:
        yield
        return
    partial = Path(str(path) + ".partial")
    with _lock:
        if _events is not None:
            raise RuntimeError("a timeline is already being recorded in this process")
        _events, _dropped, _partial = [], 0, partial
        _generation += 1
        _threads.clear()
        _pending.clear()
        _collections.clear()
    with contextlib.suppress(OSError):
        partial.write_text("[\n")
    gc.callbacks.append(_on_gc)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(_on_gc)
        collections = _taken_collections()
        with _lock:
            for e in collections:
                _keep(e)
            events, dropped, threads = _events, _dropped, dict(_threads)
            _events, _partial = None, None
            _pending.clear()
            _gc_start.clear()
        try:  # the run's own outcome stands: a timeline that cannot be written is a warning
            write(path, events, threads, dropped)
            with _file_lock:
                partial.unlink(missing_ok=True)
        except (OSError, TypeError, ValueError) as e:
            warnings.warn(f"the run's timeline could not be written to {path}: {e}",
                          stacklevel=2)


def write(path: str | Path, events: list[dict], threads: dict[int, str],
          dropped: int = 0, *, pid: int | None = None, origin: float | None = None) -> Path:
    """The Chrome trace-event JSON object format: thread names (``threads``: tid -> name,
    of process ``pid``, this one's by default) as metadata events, times in microseconds
    from ``origin`` (by default the first event's); written to a temporary file and
    renamed."""
    t0 = min((e["ts"] for e in events), default=0.0) if origin is None else origin
    pid = os.getpid() if pid is None else pid
    out = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": n}}
           for tid, n in threads.items()]
    out += [{**e, "ts": round(e["ts"] - t0, 3),
             **({"dur": round(e["dur"], 3)} if "dur" in e else {})} for e in events]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": out, "displayTimeUnit": "ms",
                               "otherData": {"dropped_events": dropped}}, default=str))
    os.replace(tmp, path)
    return path


def read(path: str | Path) -> list[dict]:
    """The events of a timeline file, each with its thread's name (``thread``), times in
    seconds (``t``, and ``end`` for spans), sorted by time; metadata events left out. Also
    reads a killed run's RUN/timeline.json.partial (an array left open)."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:  # the open-ended copy: close it
        doc = json.loads(text.rstrip().rstrip(",") + "]")
    return parse(doc["traceEvents"] if isinstance(doc, dict) else doc)


def parse(evs: list[dict]) -> list[dict]:
    """Trace events (thread names as metadata events, times in microseconds) as `read`
    returns them."""
    names = {e["tid"]: e["args"]["name"] for e in evs if e.get("ph") == "M"}
    out = []
    for e in evs:
        if e.get("ph") == "M":
            continue
        t = e["ts"] / 1e6
        row = {"name": e["name"], "thread": names.get(e["tid"], str(e["tid"])), "t": t,
               "args": e.get("args", {})}
        if "dur" in e:
            row["end"] = t + e["dur"] / 1e6
        out.append(row)
    out.sort(key=lambda r: r["t"])
    return out


def steps(events: list[dict]) -> list[dict]:
    """Each update's schedule, from a timeline `read` back (a run's, or `reroll sim
    --timeline`'s: the spans are named alike). For every step ``k`` trained and followed by
    another: ``train`` (its span), ``loop`` (its end to the trainer's ``publish`` of step
    ``k``: the loop's own work), ``take`` (that publish to step ``k + 1``'s training: the
    update and the wait for the next batch), ``interval`` (training start to training
    start) and ``decode_busy`` (the share of the time between the two trainings that some
    ``decode`` span covers, on any thread: in-loop evaluation's decoding counts too, so
    compare runs with ``eval.every = 0`` or steps without an evaluation), times in
    seconds."""
    trains = [e for e in events if e["name"] == "train"]
    if not trains:
        return []
    who = trains[0]["thread"]
    trains = [e for e in trains if e["thread"] == who]
    pubs = {e["args"].get("step"): e for e in events
            if e["name"] == "publish" and e["thread"] == who}
    decodes = sorted((e["t"], e["end"]) for e in events if e["name"] == "decode")
    out = []
    for a, b in zip(trains, trains[1:]):
        p = pubs.get(a["args"].get("step"))
        if p is None:
            continue
        lo, hi = a["end"], b["t"]
        busy = covered(decodes, lo, hi)
        out.append({"step": a["args"].get("step"), "train": a["end"] - a["t"],
                    "loop": p["t"] - a["end"], "take": b["t"] - p["t"],
                    "interval": b["t"] - a["t"],
                    "decode_busy": busy / (hi - lo) if hi > lo else 0.0})
    return out


def covered(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """How much of [lo, hi] the union of ``spans`` ((start, end), sorted by start) covers."""
    busy, reach = 0.0, lo
    for t0, t1 in spans:
        t0, t1 = max(t0, reach), min(t1, hi)
        if t1 > t0:
            busy, reach = busy + t1 - t0, t1
    return busy


def next_path(run_dir: str | Path) -> Path:
    """RUN/timeline.json, or for a resumed run the first free RUN/timeline.N.json (N = 2,
    3, ...), so a resume never overwrites the timeline of the run before it (nor the
    ``.partial`` copy a killed run left)."""
    d = Path(run_dir)
    p, n = d / "timeline.json", 2
    while p.exists() or Path(str(p) + ".partial").exists():
        p, n = d / f"timeline.{n}.json", n + 1
    return p

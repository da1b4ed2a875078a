"""The run's timeline (`reroll.timeline`, ``log.timeline = true``): spans and marks land on
their threads in the Chrome trace-event format; nothing is recorded when off; a failed block
still writes its file; a resume never overwrites one. On a real run: one wait, train and
publish span per step, one weight swap per version, and in a synchronous run no decode call
overlaps an update (max_staleness = 0 generates only between updates). Recording changes
nothing that is learned (bitwise). A full garbage collection is a ``gc`` span."""

import gc
import json
import threading

import pytest
import torch
from safetensors.torch import load_file

from reroll import timeline as tl
from reroll.config_checks import load_checked
from reroll.runtime import train

SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
         "runtime.threads=1", "model.device=cpu", "ckpt_every=100",
         'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]']


@pytest.fixture(autouse=True)
def no_automatic_gc():
    """A full collection the interpreter starts on its own is a ``gc`` span (see
    `test_a_full_collection_is_a_span`): off here, so the exact event lists below hold."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_a_full_collection_is_a_span(tmp_path):
    class Cycle:  # garbage only a collection frees
        pass

    gc.collect()  # nothing left over from before
    with tl.recording(tmp_path / "t.json"):
        gc.collect(0)  # young generations: not recorded
        gc.collect(1)
        with tl.span("outer"):
            a, b = Cycle(), Cycle()
            a.other, b.other = b, a
            del a, b
            freed = gc.collect()  # a full one: a span on this thread, inside the one it holds up
    evs = tl.read(tmp_path / "t.json")
    assert [e["name"] for e in evs] == ["outer", "gc"]
    outer, full = evs
    assert full["thread"] == "MainThread"
    assert outer["t"] <= full["t"] <= full["end"] <= outer["end"]
    assert freed >= 2 and full["args"] == {"collected": freed, "uncollectable": 0}
    assert tl._on_gc not in gc.callbacks  # the hook goes with the recording
    gc.collect()
    assert len(tl.read(tmp_path / "t.json")) == 2


def test_a_collection_inside_the_recordings_own_lock_is_recorded_later(tmp_path):
    # a collection can start wherever a thread allocates, also while it holds the
    # recording's lock: the hook must not take that lock (it would wait on itself)
    class Collecting(list):
        def append(self, ev):
            super().append(ev)
            if ev.get("name") == "inside":
                gc.collect()  # as an allocation under the lock could set one off

    def record():
        with tl.recording(tmp_path / "t.json"):
            tl._events = Collecting()  # the recording's own list; it is reset at the end
            tl.mark("inside")
            tl.mark("after")

    th = threading.Thread(target=record, daemon=True)
    th.start()
    th.join(timeout=30)
    assert not th.is_alive(), "the collection's hook waited on the recording's lock"
    assert [e["name"] for e in tl.read(tmp_path / "t.json")] == ["inside", "gc", "after"]


def test_spans_and_marks_on_their_threads(tmp_path):
    path = tmp_path / "t.json"
    with tl.recording(path):
        with tl.span("outer", step=1) as sp:
            with tl.span("inner"):
                pass
            sp.set(done=3)
        tl.mark("point", n=2)
        th = threading.Thread(target=lambda: tl.mark("other"), name="side")
        th.start()
        th.join()
    doc = json.loads(path.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert {"MainThread", "side"} <= names
    evs = tl.read(path)
    by = {e["name"]: e for e in evs}
    assert [e["name"] for e in evs] == ["outer", "inner", "point", "other"]
    assert by["outer"]["args"] == {"step": 1, "done": 3}
    assert by["outer"]["t"] == 0.0  # times count from the first event
    assert by["outer"]["t"] <= by["inner"]["t"] <= by["inner"]["end"] <= by["outer"]["end"]
    assert by["point"]["args"] == {"n": 2} and "end" not in by["point"]
    assert by["point"]["thread"] == "MainThread" and by["other"]["thread"] == "side"


def test_off_records_nothing_and_one_recording_at_a_time(tmp_path):
    assert not tl.active()
    with tl.span("x") as sp:
        sp.set(a=1)
    tl.mark("y")
    with tl.recording(None):
        assert not tl.active()
    with tl.recording(tmp_path / "a.json"):
        with pytest.raises(RuntimeError, match="already being recorded"):
            with tl.recording(tmp_path / "b.json"):
                pass
    assert not (tmp_path / "b.json").exists()
    assert tl.read(tmp_path / "a.json") == []


def test_a_failed_block_keeps_its_timeline(tmp_path):
    with pytest.raises(ValueError):
        with tl.recording(tmp_path / "t.json"):
            tl.mark("before the error")
            raise ValueError("boom")
    assert [e["name"] for e in tl.read(tmp_path / "t.json")] == ["before the error"]
    assert not tl.active()


def test_a_killed_recording_leaves_its_events_but_the_last_few(tmp_path, monkeypatch):
    # every FLUSH_EVERY events go to PATH.partial as they come: what a SIGKILL leaves
    monkeypatch.setattr(tl, "FLUSH_EVERY", 3)
    path = tmp_path / "timeline.json"
    with tl.recording(path):
        for i in range(7):
            tl.mark("m", i=i)
        # as a killed run leaves it: the thread's name and marks 0-4 (two flushes of 3)
        left = tl.read(tmp_path / "timeline.json.partial")
        assert [e["args"]["i"] for e in left] == [0, 1, 2, 3, 4]
        assert {e["thread"] for e in left} == {"MainThread"}
        assert tl.next_path(tmp_path) == tmp_path / "timeline.2.json"
    assert [e["args"]["i"] for e in tl.read(path)] == list(range(7))
    assert not (tmp_path / "timeline.json.partial").exists()


def test_next_path_never_overwrites(tmp_path):
    assert tl.next_path(tmp_path) == tmp_path / "timeline.json"
    (tmp_path / "timeline.json").write_text("{}")
    assert tl.next_path(tmp_path) == tmp_path / "timeline.2.json"
    (tmp_path / "timeline.2.json").write_text("{}")
    assert tl.next_path(tmp_path) == tmp_path / "timeline.3.json"


def _spans(evs, name):
    return [e for e in evs if e["name"] == name]


@pytest.fixture(scope="module")
def sync_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tl")
    on, off = d / "on", d / "off"
    train(load_checked(None, SMALL + [f"out_dir={on}", "train.steps=3", "log.timeline=true"]),
          progress=False)
    train(load_checked(None, SMALL + [f"out_dir={off}", "train.steps=3"]), progress=False)
    return on, off


def test_a_synchronous_run_never_decodes_while_it_trains(sync_runs):
    on, off = sync_runs
    assert not (off / "timeline.json").exists()
    evs = tl.read(on / "timeline.json")
    for name in ("wait for batch", "train", "publish"):
        assert [e["args"]["step"] for e in _spans(evs, name)] == [1, 2, 3], name
    assert [e["args"]["version"] for e in _spans(evs, "update weights")] == [1, 2, 3]
    assert [e["args"]["samples"] for e in evs if e["name"] == "batch handed out"] == [16] * 3
    decodes, trains = _spans(evs, "decode"), _spans(evs, "train")
    assert decodes and all(e["thread"].startswith("reroll-engine") for e in decodes)
    assert all(e["args"]["steps"] >= 1 for e in decodes)
    # finished sequences over all decode calls: every sample of the 3 batches, and the
    # 4th batch's (generated after the last publish) while the run closes, if any
    assert sum(e["args"]["finished"] for e in decodes) in range(48, 65)
    for d in decodes:
        for t in trains:
            assert d["end"] <= t["t"] or d["t"] >= t["end"], (d, t)


def test_a_runs_spans_nest_on_every_thread(sync_runs):
    # the trace format's rule: on one thread a span starts and ends inside any span it
    # starts in (a span held across an await would break it)
    on, _ = sync_runs
    by: dict[str, list] = {}
    for e in tl.read(on / "timeline.json"):
        if "end" in e:
            by.setdefault(e["thread"], []).append((e["t"], -e["end"], e["name"]))
    assert len(by) >= 3  # the trainer, the rollout loop, the engine
    for thread, spans in by.items():
        open_ends: list[float] = []
        for t, neg_end, name in sorted(spans):
            while open_ends and open_ends[-1] <= t:
                open_ends.pop()
            assert not open_ends or -neg_end <= open_ends[-1], (thread, name, t)
            open_ends.append(-neg_end)


def test_a_span_left_open_across_recordings_is_dropped(tmp_path):
    with tl.recording(tmp_path / "a.json"):
        sp = tl.span("straddles")
        sp.__enter__()
    with tl.recording(tmp_path / "b.json"):
        sp.__exit__(None, None, None)
        tl.mark("inside")
    assert [e["name"] for e in tl.read(tmp_path / "b.json")] == ["inside"]


def test_a_timeline_that_cannot_be_written_is_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="could not be written"):
        with tl.recording(tmp_path / "missing" / "t.json"):
            tl.mark("x")
    assert not tl.active()


def test_recording_changes_nothing_learned(sync_runs):
    on, off = sync_runs
    a = load_file(str(on / "checkpoints" / "step_000003" / "model" / "model.safetensors"))
    b = load_file(str(off / "checkpoints" / "step_000003" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_writes_a_second_timeline(tmp_path):
    out = tmp_path / "r"
    cfg = SMALL + [f"out_dir={out}", "ckpt_every=1", "log.timeline=true"]
    train(load_checked(None, cfg + ["train.steps=1"]), progress=False)
    train(load_checked(None, cfg + ["train.steps=2"]), resume=True, progress=False)
    assert [e["args"]["step"] for e in _spans(tl.read(out / "timeline.json"), "train")] == [1]
    assert [e["args"]["step"] for e in _spans(tl.read(out / "timeline.2.json"), "train")] == [2]


def test_steps_by_hand():
    # step 1 trains 0-2, publishes at 3; step 2 trains 5-6, publishes at 6.5; step 3 at 8;
    # decode spans 1-4 and 3.5-7 (overlapping: their union inside 2-5 is 2-5, inside 6-8
    # is 6-7)
    def sp(name, t, end, **args):
        return {"name": name, "thread": "MainThread", "t": t, "end": end, "args": args}

    evs = [sp("train", 0, 2, step=1), sp("publish", 3, 3.1, step=1, version=1),
           sp("train", 5, 6, step=2), sp("publish", 6.5, 6.6, step=2, version=2),
           sp("train", 8, 9, step=3),
           {**sp("decode", 1, 4), "thread": "engine"}, {**sp("decode", 3.5, 7), "thread": "e"}]
    got = tl.steps(sorted(evs, key=lambda e: e["t"]))
    assert got == [
        {"step": 1, "train": 2, "loop": 1, "take": 2, "interval": 5, "decode_busy": 1.0},
        {"step": 2, "train": 1, "loop": 0.5, "take": 1.5, "interval": 3, "decode_busy": 0.5}]
    assert tl.steps([]) == []

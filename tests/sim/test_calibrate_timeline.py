"""The cost-model terms read off a run's timeline (`reroll.sim.calibrate_timeline`) against
numbers computed by hand: each update's loop window and the decoding beside it, the loop's
share of a shared core, an update's abort and re-add a request, where a sample's fixed cost
falls in the engine."""

from __future__ import annotations

import pytest

from reroll.sim.calibrate_timeline import (
    first_loop,
    handle_share,
    loop_share,
    loop_windows,
    row_costs,
    update_stop,
)


def _span(name: str, t: float, end: float, thread: str = "MainThread", **args) -> dict:
    return {"name": name, "thread": thread, "t": t, "end": end, "args": args}


def test_loop_windows_from_a_timeline_by_hand():
    # step 1 trains 0-1 and waits again at 1.5; decoding 1.2-1.3 and 1.4-1.6 (two calls:
    # 0.1 + 0.1 inside the window); step 2 trains 2-3, waits at 3.25 with nothing decoding;
    # step 3 never waits again (the run ended): no window
    evs = [_span("train", 0.0, 1.0, step=1), _span("decode", 1.2, 1.3, "engine"),
           _span("decode", 1.4, 1.6, "engine"), _span("wait for batch", 1.5, 2.0, step=2),
           _span("train", 2.0, 3.0, step=2), _span("wait for batch", 3.25, 4.0, step=3),
           _span("train", 4.0, 5.0, step=3),
           _span("train", 0.0, 9.0, "other thread", step=1)]  # not the trainer's
    w = loop_windows(sorted(evs, key=lambda e: e["t"]))
    assert [x["step"] for x in w] == [1, 2]
    assert [x["s"] for x in w] == pytest.approx([0.5, 0.25])
    assert [x["decoding_s"] for x in w] == pytest.approx([0.2, 0.0])


def test_loop_share_by_hand():
    # fitted work 0.1 + 0.01 a sample: 0.2 s at 10 samples. Window of step 2: 0.3 s, 0.2 of
    # it beside decoding, so 0.1 alone and 0.1 of work in 0.2 beside (share 0.5); step 3:
    # 0.25 s, all beside, 0.2 of work (share 0.8); together (0.1 + 0.2) / (0.2 + 0.25).
    # Step 1 is warm-up (skip 1); step 4 (2.0 s, over twice the median) a stall
    windows = [{"step": 1, "s": 9.0, "decoding_s": 9.0}, {"step": 2, "s": 0.3, "decoding_s": 0.2},
               {"step": 3, "s": 0.25, "decoding_s": 0.25}, {"step": 4, "s": 2.0, "decoding_s": 2.0}]
    samples = {1: 10, 2: 10, 3: 10, 4: 10}
    assert loop_share([(windows, samples)], loop_s=0.1, loop_row_s=0.01,
                      skip=1) == pytest.approx(0.3 / 0.45)
    with pytest.raises(ValueError, match="no loop work beside decoding"):
        loop_share([([{"step": 2, "s": 0.3, "decoding_s": 0.0}], samples)], loop_s=0.1,
                   loop_row_s=0.01)


def _mark(name: str, t: float, **args) -> dict:
    return {"name": name, "thread": "reroll-rollout", "t": t, "args": args}


def test_update_stop_by_hand():
    # the update to version 2 is left out (skip 2), then three updates:
    # 10 aborted in 0.003 s, 30 in 0.005 s, 0 in 0.002 s: the line 0.002 + 0.0001 a request,
    # so 100 us a request to abort (the second update's counted from the end of the decode
    # call under way at its publish, which the abort waited for). Re-adds: the first add after an update that aborted
    # some: 10 in 0.0015 s, 30 in 0.0045 s (a later add of new groups, and the add after
    # the update that aborted none, do not count): 0.006 / 40 = 150 us a request
    evs = [_mark("publish begins", 0.0, version=2), _mark("interrupt", 0.5, version=2, aborted=99),
           _span("add", 0.6, 0.9, "reroll-rollout", requests=99),
           _mark("publish begins", 1.0, version=3), _mark("interrupt", 1.003, version=3, aborted=10),
           _span("add", 1.01, 1.0115, "reroll-rollout", requests=10),
           _span("add", 1.02, 1.05, "reroll-rollout", requests=128),
           _span("decode", 1.99, 2.002, "reroll-engine_0", pending=30, steps=1),
           _mark("publish begins", 2.0, version=4), _mark("interrupt", 2.007, version=4, aborted=30),
           _span("add", 2.01, 2.0145, "reroll-rollout", requests=30),
           _mark("publish begins", 3.0, version=5), _mark("interrupt", 3.002, version=5, aborted=0),
           _span("add", 3.01, 3.02, "reroll-rollout", requests=128)]
    got = update_stop([evs], skip=2)
    assert got["abort_row_s"] == pytest.approx(1e-4)
    assert got["readd_row_s"] == pytest.approx(0.006 / 40)
    with pytest.raises(ValueError, match="the same number of requests"):
        update_stop([evs[:3]], skip=1)
    with pytest.raises(ValueError, match="no update that aborted"):
        update_stop([evs[-3:]], skip=1)


def test_first_loop_by_hand():
    # usual work 0.1 + 0.01 a sample; run a's first window (step 1, 16 samples) took 0.5 s,
    # 0.05 of it beside decoding: 0.45 - 0.26 = 0.19 extra; run b's first logged step is 2
    # (8 samples, 0.38 s, none beside decoding): 0.38 - 0.18 = 0.20; run c's is below the
    # usual (0.2 - 0.26 = -0.06). Median 0.19; alone, c gives 0 (never negative)
    a = ([{"step": 1, "s": 0.5, "decoding_s": 0.05}, {"step": 2, "s": 0.3, "decoding_s": 0.0}],
         {1: 16, 2: 16})
    b = ([{"step": 1, "s": 9.0, "decoding_s": 0.0}, {"step": 2, "s": 0.38, "decoding_s": 0.0}],
         {2: 8})
    c = ([{"step": 1, "s": 0.2, "decoding_s": 0.0}], {1: 16})
    assert first_loop([a, b, c], loop_s=0.1, loop_row_s=0.01) == pytest.approx(0.19)
    assert first_loop([c], loop_s=0.1, loop_row_s=0.01) == 0.0
    with pytest.raises(ValueError, match="no run's timeline"):
        first_loop([([], {1: 16})], loop_s=0.1, loop_row_s=0.01)


def test_row_costs_and_the_handlings_share_by_hand():
    # after the publish of version 2 (skip 1: version 1's add is warm-up). Adds: 4 in 20
    # ms, 2 in 16 ms (a 250 ms-a-request one, a stall, left out): 36 ms / 6 = 6 ms a
    # request. Hand-outs, each after the latest call that finished requests and ended
    # before it: 8 ms after one that finished 4 (2 ms a request; a later call that
    # finished none does not count), 6 ms after one that finished 2 (3 ms; the call still
    # decoding at the mark does not count), 1 ms after one that finished 1 (1 ms); one
    # with no such call since the last does not count, nor one the trainer asked for only
    # after that call ended (the batch was ready before): the median 2 ms
    eng, rol = "reroll-engine_0", "reroll-rollout"
    evs = [_mark("publish done", 0.0, version=1),
           _span("add", 0.1, 0.2, eng, requests=4),
           _mark("publish done", 1.0, version=2),
           _span("add", 1.0, 1.02, eng, requests=4),
           _span("decode", 1.02, 1.05, eng, finished=4, steps=1),
           _span("decode", 1.05, 1.06, eng, finished=0, steps=1),
           _span("batch handed out", 1.058, 1.058, rol),
           _span("add", 2.0, 2.016, eng, requests=2),
           _span("decode", 2.016, 2.034, eng, finished=2, steps=3),
           _span("decode", 2.036, 2.05, eng, finished=1, steps=1),
           _span("batch handed out", 2.040, 2.040, rol),
           _span("batch handed out", 2.051, 2.051, rol),
           _span("decode", 2.07, 2.08, eng, finished=0, steps=1),
           _span("batch handed out", 2.09, 2.09, rol),
           _span("decode", 2.2, 2.21, eng, finished=3, steps=1),
           _span("wait for batch", 2.25, 2.26),  # the batch was ready before it was asked
           _span("batch handed out", 2.26, 2.26, rol),
           _span("add", 3.0, 3.5, eng, requests=2)]
    got = row_costs([evs], skip=1)
    assert got["add_row_s"] == pytest.approx(0.036 / 6)
    assert got["handle_row_s"] == pytest.approx(2e-3)
    # beside decoding two of the hand-outs take longer (10 and 50 ms a request, the other
    # 3): the median 10 ms, a share of 2 / 10
    late = {1.058: 1.09, 2.051: 2.1}
    slow = [dict(e, t=late.get(e["t"], e["t"])) for e in evs]
    assert handle_share([slow], handle_row_s=got["handle_row_s"]) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no add span"):
        row_costs([[e for e in evs if e["name"] != "add"]], skip=1)

"""`reroll sim --timeline`: the simulated schedule as spans, against a schedule computed by
hand, read back by the code that reads a real run's timeline (`reroll.timeline.read`)."""

from __future__ import annotations

import json

import pytest

from reroll import timeline
from reroll.cli import main
from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.simulate import simulate
from reroll.sim.timeline import TracedSimulation

# one decode step costs 1 s whatever the batch; a training step 5 s; an update 2 s
UNIT = dict(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0, train_token_s=0.0,
            train_step_s=5.0, prompt_tokens=1, sync_s=2.0)


def _by(evs, row, name):
    return [(e["t"], e["end"]) for e in evs if e["thread"] == row and e["name"] == name]


def test_synchronous_spans_by_hand(tmp_path):
    # 2 samples of 10 tokens a step: decode 0-10, train 10-15, update 15-17; then 17-27,
    # 27-32, 32-34; then 34-44, 44-49, where the simulation ends (3 steps: as in
    # test_schedule's synchronous run with sync_s, steps end at 15, 32, 49)
    run = SimRun(batch_groups=2, group_size=1, max_new_tokens=10, max_staleness=0)
    sim = TracedSimulation(run, SimSettings(steps=3, **UNIT))
    res = sim.run_all()
    assert res == simulate(run, SimSettings(steps=3, **UNIT))  # tracing changes nothing
    evs = timeline.read(sim.write(tmp_path / "t.json"))
    assert _by(evs, "trainer", "wait for batch") == [(0.0, 10.0), (17.0, 27.0), (34.0, 44.0)]
    assert _by(evs, "trainer", "train") == [(10.0, 15.0), (27.0, 32.0), (44.0, 49.0)]
    assert _by(evs, "trainer", "publish") == [(15.0, 17.0), (32.0, 34.0)]
    assert _by(evs, "device 0", "decode") == [(0.0, 10.0), (17.0, 27.0), (34.0, 44.0)]
    assert _by(evs, "device 0", "update weights") == [(15.0, 17.0), (32.0, 34.0)]
    assert [(e["name"], e["t"]) for e in sim.spans_read()] == [(e["name"], e["t"]) for e in evs]
    # per update (`reroll.timeline.steps`): train 5 s, no loop work, publish to the next
    # training 2 + 10 s, the devices decoding 10 of those 12 s
    assert timeline.steps(evs) == [
        {"step": k, "train": 5.0, "loop": 0.0, "take": 12.0, "interval": 17.0,
         "decode_busy": pytest.approx(10 / 12)} for k in (1, 2)]
    dec = [e["args"] for e in evs if e["name"] == "decode"]
    assert dec == [{"steps": 10, "running": 2, "finished": 2}] * 3
    assert [e["args"]["step"] for e in evs if e["name"] == "train"] == [1, 2, 3]


def test_the_command_writes_one_timeline_per_variant(tmp_path, capsys):
    out = tmp_path / "sim.json"
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({**UNIT, "steps": 2}))
    rc = main(["sim", "-", "rollout.batch_groups=1", "rollout.group_size=2",
               "rollout.max_new_tokens=10", "--settings", str(settings), "--out", str(out),
               "--no-png", "--compare", "runtime.max_staleness=0,1",
               "--timeline", str(tmp_path / "tl.json")])
    assert rc == 0
    for label in ("max_staleness=0", "max_staleness=1"):
        evs = timeline.read(tmp_path / f"tl.{label}.json")
        assert [e["args"]["step"] for e in evs if e["name"] == "train"] == [1, 2], label
    # async 1: 4 samples decode 0-10; step 1 trains 10-15 and updates 15-17; step 2 trains
    # 17-22 on the other 2 while 2 new ones decode from 17; its update waits for the decode
    # step under way (it ends at 22) and ends at 24
    evs = timeline.read(tmp_path / "tl.max_staleness=1.json")
    assert _by(evs, "trainer", "train") == [(10.0, 15.0), (17.0, 22.0)]
    assert _by(evs, "device 0", "decode")[:2] == [(0.0, 10.0), (17.0, 22.0)]

"""One simulated generation device (`reroll.sim.gen_device`) against costs and placements
computed by hand: a decode step's cost, the driver's adds, a resumed row's prefill, a
change of its processor's share, an update's re-add order, the engine's placement rule. No
timing is measured: every time is the cost model's."""

from __future__ import annotations

import pytest

from reroll.sim.gen_device import GenDevice, Row
from reroll.sim.settings import SimSettings


def test_decode_cost_grows_with_rows_and_context():
    s = SimSettings(decode_base_s=1.0, decode_row_s=0.5, decode_ctx_s=0.01,
                    prefill_token_s=0.1)
    d = GenDevice(s)
    d.add([Row("a", ctx=4, left=3, prefill=4), Row("b", ctx=6, left=5, prefill=6)])
    end = d.plan(None)
    # prefill 10 tokens x 0.1 + 3 steps x (1 + 2 x 0.5) + 0.01 x (contexts 10, 12, 14)
    assert end == pytest.approx(1.0 + 3 * 2.0 + 0.01 * 36)
    assert [r.key for r in d.finish_chunk()] == ["a"]
    assert d.rows[0].ctx == 9 and d.rows[0].left == 2 and d.rows[0].prefill == 0


def test_adds_hold_the_next_decode_step_placed_or_not():
    # a 1 s decode step; 0.5 s for the driver to add a request
    d = GenDevice(SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                              add_row_s=0.5), slots=1)
    d.add([Row("a", ctx=1, left=2, prefill=1), Row("b", ctx=1, left=3, prefill=1)])
    assert d.plan(None) == pytest.approx(3.0)  # both adds first, though only "a" is placed
    d.add([Row("c", ctx=1, left=1, prefill=1)])  # during the chunk: the next one pays it
    assert d.end(2) == pytest.approx(3.0)
    assert d.cut(1.5) == pytest.approx(2.0)  # cut to its first step
    assert d.finish_chunk() == []
    assert d.plan(None) == pytest.approx(2.0 + 0.5 + 1.0)  # c's add, a's last step
    assert [r.key for r in d.finish_chunk()] == ["a"]
    assert d.plan(None) == pytest.approx(3.5 + 3.0)  # b: the adds are paid already


def test_resume_cost_is_paid_once_per_interrupted_row():
    s = SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                    resume_row_s=0.25)
    d = GenDevice(s)
    d.add([Row("a", ctx=2, left=5, prefill=0), Row("b", ctx=2, left=5, prefill=0)])
    d.plan(None)
    d.cut(0.5)  # a weight update comes during the first step
    d.finish_chunk()
    d.pause(d.t + 2.0, reprefill=True)
    d.plan(None)  # both aborted and added back: placed again
    assert d.elapsed(1) == pytest.approx(2 * 0.25 + 1.0)  # both resumed, then one step
    d.finish_chunk()
    assert d.elapsed(1) == pytest.approx(1.0)  # paid once
    d.pause(d.t, reprefill=False)  # without partial rollouts nothing is redone
    assert d.elapsed(1) == pytest.approx(1.0)


def test_resume_token_cost_is_paid_on_each_resumed_rows_prompt_and_prefix():
    s = SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                    resume_row_s=0.25, resume_token_s=0.01)
    d = GenDevice(s)
    # admitted with a 2-token prompt: its own prefill is not a resume's (0.01 not paid)
    d.add([Row("a", ctx=2, left=5, prefill=2), Row("b", ctx=3, left=5, prefill=3)])
    assert d.plan(None) == pytest.approx(5 * 1.0)
    d.cut(2.5)  # a weight update during the third step
    d.finish_chunk()
    d.pause(d.t + 2.0, reprefill=True)
    assert d.resumed == 2 and d.resumed_tokens == (2 + 3) + (3 + 3)
    # a: prompt 2 + 3 tokens, b: 3 + 3; both placed again, resumed, then one step
    d.plan(None)
    assert d.elapsed(1) == pytest.approx(2 * 0.25 + 0.01 * (5 + 6) + 1.0)
    d.finish_chunk()
    assert d.elapsed(1) == pytest.approx(1.0)  # paid once


def test_a_share_change_rerates_the_chunk_under_way():
    # one row of 10 tokens, 1 s a decode step: at 2.5 the processor is halved, so the 7.5 s
    # of work left take 15 s (end 17.5) and step j ends at 2.5 + 2 (j - 2.5); at 4.0 it is
    # whole again with 3.25 s of work done (2.5 + 1.5 / 2): step j ends at 4 + j - 3.25
    d = GenDevice(SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0))
    d.add([Row(key="a", ctx=1, left=10, prefill=0)])
    assert d.plan(None) == 10.0
    assert d.set_share(2.0, 2.5) == 17.5
    assert d.cut(5.0) == 5.5  # the step under way at 5.0 is the 4th: 2.5 + 2 x 1.5
    assert d.set_share(1.0, 4.0) == 4.75  # 4 + 4 - 3.25
    assert d.finish_chunk() == []
    assert (d.t, d.busy_s, d.rows[0].left) == (4.75, 4.75, 6)
    assert d.plan(None) == 10.75  # the next chunk at full speed: 6 steps


def test_an_update_adds_the_waiting_rows_back_first_and_a_groups_together():
    # two slots: a1 and b1 run, c1 and b2 wait. The update aborts the waiting first, then
    # the running: c1, b2, a1, b1; a group's rows go back together at its first place
    # (b1 beside b2): c1, b2, b1, a1. The two slots take c1 and b2.
    d = GenDevice(SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                              max_rows=2))
    d.add([Row(k, ctx=2, left=5, prefill=0, group=k[0]) for k in ("a1", "b1", "c1", "b2")])
    d.plan(None)
    d.cut(0.5)  # the update comes during the first step
    d.finish_chunk()
    d.pause(d.t, reprefill=True)
    assert [r.key for r in d.queue] == ["c1", "b2", "b1", "a1"] and d.rows == []
    d.plan(None)
    assert [r.key for r in d.rows] == ["c1", "b2"] and [r.key for r in d.queue] == ["b1", "a1"]
    assert d.resumed == 2  # the two that were running


def test_placing_rows_keeps_to_the_prefill_budget_and_shares_a_groups_prompt():
    # budget 20 tokens a step: resumed rows (12-token prompt and prefix each, their own)
    # go one a step; a group's 4 fresh rows share one 7-token prompt, so they and one
    # resumed row (7 + 12 = 19) go together, and the next resumed row (31) waits
    s = SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                    prefill_budget=20, max_rows=16)
    d = GenDevice(s)
    d.add([Row(k, ctx=12, left=5, prefill=12, resumed=True) for k in ("a", "b")])
    assert d.plan(None) == pytest.approx(1.0)  # a placed; b left, so one step, not five
    assert [r.key for r in d.rows] == ["a"] and [r.key for r in d.queue] == ["b"]
    d.finish_chunk()
    d.add([Row(f"g{i}", ctx=7, left=5, prefill=7, group="g") for i in range(4)])
    d.add([Row(k, ctx=12, left=5, prefill=12, resumed=True) for k in ("c", "e")])
    # b (12 tokens), the group's rows on their one shared prompt (19), then c would make 31
    d.plan(None)
    assert [r.key for r in d.rows] == ["a", "b", "g0", "g1", "g2", "g3"]
    assert [r.key for r in d.queue] == ["c", "e"]
    d.finish_chunk()
    d.plan(None)  # c (12), then e would make 24
    assert [r.key for r in d.queue] == ["e"]
    # no budget (0): everything placed at once, and the chunk runs to the first finish
    free = GenDevice(SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                                 prefill_budget=0, max_rows=16))
    free.add([Row(k, ctx=12, left=5, prefill=12, resumed=True) for k in "abc"])
    assert free.plan(None) == pytest.approx(5.0) and free.queue == []


def test_placing_waits_for_admit_batch_free_slots_unless_every_row_fits():
    s = SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0, max_rows=8,
                    admit_batch=4)
    d = GenDevice(s)
    d.add([Row(f"r{i}", ctx=2, left=9, prefill=0) for i in range(6)])
    d.plan(None)
    d.cut(0.5)
    d.finish_chunk()  # 6 running, 2 slots free
    d.add([Row(k, ctx=2, left=9, prefill=0) for k in "xyz"])
    d.plan(None)  # 3 waiting, min(4, 3) = 3 > 2 free: none placed
    assert len(d.rows) == 6 and len(d.queue) == 3
    d.cut(d.t + 0.5)
    d.finish_chunk()
    d.drop(lambda k: k == "z")  # 2 waiting fit the 2 free slots: placed
    d.plan(None)
    assert len(d.rows) == 8 and d.queue == []
    # the default: an eighth of the slots (256 slots: 32), as the engine's
    assert GenDevice(SimSettings()).admit_batch == 32


def test_the_placement_rule_is_the_engines(tiny):
    # the simulator's defaults are the engine's own: its packed prefill a step and the
    # free slots it waits for (an eighth of its slots)
    from reroll.engine.torch_engine import TorchEngine

    model, tok = tiny
    for slots in (8, 64, 256):
        eng = TorchEngine(model, tok, max_batch=slots)
        dev = GenDevice(SimSettings(max_rows=slots))
        assert (eng.max_prefill_tokens, eng.admit_batch) == (SimSettings().prefill_budget,
                                                             dev.admit_batch)

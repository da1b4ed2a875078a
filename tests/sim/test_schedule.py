"""The simulator against schedules computed by hand, and the proof that its admission and
hand-out are the real scheduler's. No timing is measured: every time is the cost model's."""

from __future__ import annotations

import pytest

import reroll.control.scheduler as scheduler_module
from reroll.control import staleness
from reroll.errors import ConfigError
from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.simulate import Simulation, simulate

# one decode step costs 1 s whatever the batch; a training step 5 s; nothing else costs
UNIT = dict(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0, train_token_s=0.0,
            train_step_s=5.0, prompt_tokens=1)


def run(k: int, steps: int = 5, **kw) -> dict:
    """2 groups of 1 sample a step, every response 10 tokens."""
    r = SimRun(batch_groups=2, group_size=1, max_new_tokens=10, max_staleness=k,
               **{x: kw.pop(x) for x in ("overprovision", "partial_rollouts") if x in kw})
    return simulate(r, SimSettings(steps=steps, **{**UNIT, **kw}))


def test_synchronous_by_hand():
    # each step: 10 decode steps, then 5 s of training with the engine idle
    r = run(0)
    assert r["step_ends_s"] == [15.0, 30.0, 45.0, 60.0, 75.0]
    assert r["staleness"] == {"0": 1.0}
    assert r["gen_idle"] == pytest.approx(5 / 15)
    assert r["train_idle"] == pytest.approx(10 / 15)


def test_async_1_by_hand():
    # version 0 admits (1 + 0 + 1) * 2 = 4 samples: all done at 10; steps train 10-15 and
    # 15-20 on them; two more start at 15 (version 1) and at 20 (version 2), done at 25 and
    # 30, trained 25-30 and 30-35; the pair started at 30 trains 40-45
    r = run(1)
    assert r["step_ends_s"] == [15.0, 20.0, 30.0, 35.0, 45.0]
    assert r["staleness"] == {"0": 0.2, "1": 0.8}


def test_async_2_by_hand():
    # 6 samples start at 0; pairs start at 15 and 20 (done 25, 30): the trainer never waits
    r = run(2)
    assert r["step_ends_s"] == [15.0, 20.0, 25.0, 30.0, 35.0]
    assert r["staleness"] == {"0": 0.2, "1": 0.2, "2": 0.6}


def test_sync_time_stops_both_sides():
    # synchronous with a 2 s weight update after every step: 10 + 5 + 2 per step
    r = run(0, steps=3, sync_s=2.0)
    assert r["step_ends_s"] == [15.0, 32.0, 49.0]


def test_a_synchronous_steps_adds_and_handling_are_in_its_wait():
    # each step: two adds (1 s), 10 decode steps, the two rows handled (1 s), then 5 s of
    # training
    r = run(0, steps=3, add_row_s=0.5, handle_row_s=0.5)
    assert r["step_ends_s"] == [17.0, 34.0, 51.0]


@pytest.mark.parametrize("on_gen, ends", [(False, [19.0, 24.0, 36.0]),
                                          (True, [19.0, 24.0, 38.0])])
def test_finished_rows_are_taken_once_the_driver_has_handled_them(on_gen, ends):
    # async 1, a finished row handled in 1 s. The four rows of version 0 finish at 10 and
    # are handled by 14 (nothing decodes): 14-19 trains, 19-24 the next pair. The pair
    # started at 19 finishes at 29 beside the pair started at 24 (5 steps left): handled
    # by 31 on the driver's own processor, or, sharing the device's at half each, by 33
    # with the device at half speed meanwhile (2 of its 5 steps done, the rest by 36).
    # 31 (33) - 36 (38) trains; the pair ending at 34 (36) is handled by 36 (38), and the
    # update after the step waits for it (the driver's work, in order)
    r = run(1, steps=3, handle_row_s=1.0, handle_share=0.5, loop_on_gen=on_gen)
    assert r["step_ends_s"] == ends


def test_the_update_waits_for_the_handling_queued_before_the_loops_work():
    # as above on the driver's own processor, a row handled in 3 s: the four rows of
    # version 0 handled by 22; 22-27 and 27-32 train. The pair started at 27 ends at 37
    # and is handled by 43; the pair started at 32 ends at 42, its handling queued
    # behind, done by 49. 43-48 trains; its update waits for the driver's handling: 49
    r = run(1, steps=3, handle_row_s=3.0, loop_on_gen=False)
    assert r["step_ends_s"] == [27.0, 32.0, 49.0]
    for share in (0.0, 1.0):
        with pytest.raises(ConfigError, match="handle_share"):
            SimSettings(handle_share=share)


def test_partial_rollouts_prefill_again_after_an_update():
    # async 1 with a prefill cost: the rows running at an update pay their prefix again
    # only with partial rollouts (the engine aborts and resumes them)
    on = run(1, steps=4, prefill_token_s=0.1, partial_rollouts=True)
    off = run(1, steps=4, prefill_token_s=0.1, partial_rollouts=False)
    assert on["time_s"] > off["time_s"]


def test_overprovision_starts_extra_and_carries_them_over():
    r = run(0, steps=4, overprovision=2.0)
    c = r["counters"]
    assert c["started"] == c["consumed"] + 2  # one batch ahead, waiting for the next step
    assert set(r["staleness"]) <= {"0", "1"}  # lag allowed one extra version


def test_two_generation_devices_split_the_groups():
    s = SimSettings(steps=2, gen_devices=2, **{**UNIT, "decode_row_s": 1.0})
    one = simulate(SimRun(batch_groups=4, group_size=2, max_new_tokens=4),
                   SimSettings(steps=2, **{**UNIT, "decode_row_s": 1.0}))
    two = simulate(SimRun(batch_groups=4, group_size=2, max_new_tokens=4), s)
    # 8 rows: 4 x (1 + 8) = 36 s of decoding on one device, 4 x (1 + 4) = 20 s on two
    assert one["step_ends_s"][0] == 36 + 5 and two["step_ends_s"][0] == 20 + 5


def test_the_rules_are_the_real_schedulers(monkeypatch):
    # the simulation drives reroll.control.scheduler.Scheduler, whose admission is
    # staleness.capacity and hand-out staleness.can_take: spy on both
    assert Simulation.__init__.__globals__["Scheduler"] is scheduler_module.Scheduler
    assert scheduler_module.capacity is staleness.capacity
    assert scheduler_module.can_take is staleness.can_take
    calls = {"capacity": 0, "can_take": 0}

    def spy(name):
        real = getattr(staleness, name)

        def f(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)
        return f

    monkeypatch.setattr(scheduler_module, "capacity", spy("capacity"))
    monkeypatch.setattr(scheduler_module, "can_take", spy("can_take"))
    run(1, steps=3)
    assert calls["capacity"] > 0 and calls["can_take"] > 0
    # and a rule changed there changes the schedule: with no room, nothing ever starts
    monkeypatch.setattr(scheduler_module, "capacity", lambda *a, **kw: 0)
    with pytest.raises(RuntimeError, match="stalled"):
        run(1, steps=1)


def test_generation_goes_on_during_the_loops_own_work():
    # async 1, training 9 s, 2 s of the loop's own work after each step (recording,
    # metrics: reroll.loop.run does it while the pipeline generates), swap free. 4 rows
    # done at 10; train 10-19, loop 19-21, swap at 21 admits 2 (decoding 21-31); train
    # 21-30, loop 30-32: they finish at 31, before the swap at 32, so nothing is resumed.
    # The same 2 s as a stop of both sides (sync_s) catches them at 30 with 9 tokens.
    loop = run(1, steps=3, train_step_s=9.0, loop_s=2.0)
    assert loop["step_ends_s"] == [21.0, 32.0, 43.0]
    assert [p["resumed"] for p in loop["per_step"]] == [0, 0, 0]
    assert [p["started"] for p in loop["per_step"]] == [4, 6, 8]
    assert [p["lags"] for p in loop["per_step"]] == [{0: 2}, {1: 2}, {1: 2}]
    stop = run(1, steps=3, train_step_s=9.0, sync_s=2.0)
    # train 10-19, stop 19-21; train 21-30, stop 30-32 with the pair resumed (done at 33);
    # the next pair is taken at 33, trained 33-42
    assert stop["step_ends_s"] == [19.0, 30.0, 42.0]
    assert [p["resumed"] for p in stop["per_step"]] == [0, 2, 0]


def test_the_first_steps_loop_does_its_extra_work_once():
    # the case above with 3 s more loop work after the first step only: loop 19-24, swap at
    # 24 admits the pair (decoding 24-34); train 24-33, loop 33-35 (the usual 2 s), so the
    # pair is done before the swap at 35 and nothing is resumed; every step after is 11 s
    r = run(1, steps=3, train_step_s=9.0, loop_s=2.0, first_loop_s=3.0)
    assert r["step_ends_s"] == [24.0, 35.0, 46.0]
    assert [p["resumed"] for p in r["per_step"]] == [0, 0, 0]
    with pytest.raises(ConfigError, match="first_loop_s"):
        SimSettings.load(None, {"first_loop_s": -1.0})


def test_an_updates_resumes_are_counted_by_age():
    # the stop case above: the pair admitted at the update to version 1 (21) is caught
    # running by the update to version 2 (30-32): 2 requests of age 2 - 1 = 1
    stop = run(1, steps=3, train_step_s=9.0, sync_s=2.0)
    assert [p["resumed_by_age"] for p in stop["per_step"]] == [{}, {1: 2}, {}]
    # without partial rollouts nothing is interrupted, so nothing is counted
    off = run(1, steps=3, train_step_s=9.0, sync_s=2.0, partial_rollouts=False)
    assert [p["resumed_by_age"] for p in off["per_step"]] == [{}, {}, {}]


def test_the_requests_in_the_devices_at_an_update_are_counted_by_age():
    # the stop case above: at the update to version 2 the pair is running (age 1), with or
    # without partial rollouts (without, nothing is interrupted, but it is there)
    for partial in (True, False):
        r = run(1, steps=3, train_step_s=9.0, sync_s=2.0, partial_rollouts=partial)
        assert r["per_step"][1]["in_engine"] == {"running": {1: 2}, "waiting": {}}
    # one slot: version 0's 4 samples run one after the other (done at 10, 20, 30, 40);
    # step 1 takes the first two at 20 and trains 20-29: at the update the third is
    # running (9 tokens in) and the fourth waits for the slot, both of age 1 - 0 = 1
    one = run(1, steps=3, train_step_s=9.0, sync_s=2.0, max_rows=1)
    assert one["step_ends_s"][0] == 29.0
    assert one["per_step"][0]["in_engine"] == {"running": {1: 1}, "waiting": {1: 1}}
    assert one["per_step"][0]["resumed_by_age"] == {1: 1}  # the waiting one had nothing


def test_the_loops_work_shares_the_first_devices_processor():
    # as above, with the loop's 2 s of work on the generation device's processor: while
    # both have work each goes at half speed. Swap at 21 as before (the device was idle);
    # at 30 the pair has 1 token left: 2 s at half speed (30-32), the loop does 1 s of its
    # work meanwhile and the rest alone (32-33): swap at 33, nothing resumed
    shared = run(1, steps=3, train_step_s=9.0, loop_s=2.0, loop_on_gen=True)
    assert shared["step_ends_s"] == [21.0, 33.0, 45.0]
    assert [p["resumed"] for p in shared["per_step"]] == [0, 0, 0]
    # training 7 s: at 26 the pair has 3 tokens left (6 s at half speed); the loop's 2 s
    # end at 30, the decode step under way ends then too: the pair is resumed with 9 tokens
    short = run(1, steps=3, train_step_s=7.0, loop_s=2.0, loop_on_gen=True)
    assert short["step_ends_s"] == [19.0, 30.0, 42.0]
    assert [p["resumed"] for p in short["per_step"]] == [0, 2, 0]
    # the loop takes 0.8 of the processor, the device 0.2: at 30 the pair's last token (1 s
    # of work) slows to 5 s; the loop's 2 s take 2.5 (30-32.5), the token is half done
    # then and done alone by 33 (the swap waits for it: nothing resumed); the next pair
    # decodes 33-43, step 3 trains 33-42 and at 42 the same again: 42-44.5
    greedy = run(1, steps=3, train_step_s=9.0, loop_s=2.0, loop_on_gen=True, loop_share=0.8)
    # 0.8 and 1 / 0.2 are not binary-exact: a few roundings of 1e-16 each, well inside 1e-12
    assert greedy["step_ends_s"] == pytest.approx([21.0, 32.5, 44.5], rel=1e-12)
    assert [p["resumed"] for p in greedy["per_step"]] == [0, 0, 0]


def test_a_decode_step_under_way_slows_when_the_loop_takes_half_its_processor():
    # training ends in the middle of a decode step, and the loop's work slows that step at
    # once (a processor is shared from the moment both have work; before, the step under way
    # ran to its end at full speed beside the loop's half: 1.5 processors). Async 1 without
    # partial rollouts, an admitted sample's first step 2 s longer. Version 0's 4 samples:
    # first step 1 + 4 x 2 = 9 s, done at 18; step 1 trains 18-22.5, the loop's 1.5 s
    # 22.5-24 (the device idle: all 4 started); the swap admits a pair (first step 5 s,
    # 24-29); step 2 trains 24-28.5, then the loop and that step's last 0.5 s share the
    # processor: the step ends at 29.5, one more by 31.5, when the loop's 1.5 s end too
    # (at 0.5 a second): swap at 31.5 (the old way: 2.25 steps by 31.5, swap at 33). A new
    # pair beside the old (8 left): 4 + 8 s, the old pair done at 43.5; step 3 trains
    # 43.5-48, the new pair done at 45.5, the loop alone 48-49.5
    r = run(1, steps=3, train_step_s=4.5, loop_s=1.5, row_s=2.0, loop_on_gen=True,
            partial_rollouts=False)
    assert r["step_ends_s"] == [24.0, 31.5, 49.5]


def test_the_loops_work_grows_with_the_samples_and_the_stalls_stop_both_sides():
    # synchronous: nothing generates during the loop's work, which is loop_s + loop_row_s
    # a sample = 0.5 + 0.25 x 2 = 1 s after each 10 + 5 s, before the step ends (16); the
    # stall (1 s) then stops trainer and engine at the update, as the weights' swap does:
    # the next generation starts at 17, so steps end 17 s apart
    r = run(0, steps=3, loop_s=0.5, loop_row_s=0.25, stall_s=1.0)
    assert r["step_ends_s"] == [16.0, 33.0, 50.0]
    assert r["gen_idle"] == pytest.approx(20 / 50)  # 7 s a step, the last step's stop after
    # a stall is a stop like the swap's, in any schedule: the same as sync_s of that length
    for k in (0, 1, 2):
        stalled = run(k, steps=4, train_step_s=9.0, loop_s=1.0, stall_s=1.5)
        swapped = run(k, steps=4, train_step_s=9.0, loop_s=1.0, sync_s=1.5)
        assert stalled["step_ends_s"] == swapped["step_ends_s"]
        assert stalled["per_step"] == swapped["per_step"]


def test_an_updates_stop_grows_with_the_requests_in_the_engine():
    # the stop case above with 0.5 s more a request in the engine: the update to 1 (19)
    # finds none (2 s, to 21), the update to 2 (30) the pair admitted at 21 (2 + 2 x 0.5 =
    # 3 s, to 33); placed again, the pair's last token takes 33-34, trained 34-43
    r = run(1, steps=3, train_step_s=9.0, sync_s=2.0, update_row_s=0.5)
    assert r["step_ends_s"] == [19.0, 30.0, 43.0]
    assert [p["resumed"] for p in r["per_step"]] == [0, 2, 0]
    # without partial rollouts nothing is aborted or added back: 2 s, as before
    off = run(1, steps=3, train_step_s=9.0, sync_s=2.0, update_row_s=0.5,
              partial_rollouts=False)
    assert off["step_ends_s"] == [19.0, 30.0, 42.0]


def test_an_updates_own_stop_only_where_it_aborts_something():
    # update_s = 1 s in place of 0.5 s a request: the update to 1 finds the engine empty (2
    # s, no interrupt), the update to 2 the pair (2 + 1 = 3 s): the same schedule as above
    r = run(1, steps=3, train_step_s=9.0, sync_s=2.0, update_s=1.0)
    assert r["step_ends_s"] == [19.0, 30.0, 43.0]
    off = run(1, steps=3, train_step_s=9.0, sync_s=2.0, update_s=1.0, partial_rollouts=False)
    assert off["step_ends_s"] == [19.0, 30.0, 42.0]
    # a synchronous run's updates find nothing in the engine: 10 + 5 + 2 a step, as without
    assert run(0, steps=3, sync_s=2.0, update_s=1.0)["step_ends_s"] == [15.0, 32.0, 49.0]



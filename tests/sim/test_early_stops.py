"""Early stops and adaptive groups in the simulator, against schedules computed by hand:
DUET's abort at its horizon (the real `MarkerGate` and keep draw), ARRoL's pruning at its
checkpoint (the real pruner's group size and rule, the engine's `GroupGate`) and an
allocator's rounds (the real AR3PO stages, driven by simulated successes). Every time is the cost
model's; no timing is measured."""

from __future__ import annotations

import pytest

from reroll.config_checks import load_checked
from reroll.control.scheduler import request_seed
from reroll.methods.duet import keep_draw
from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.simulate import Simulation, simulate

# one decode step costs 1 s whatever the batch; a training step 5 s; nothing else costs
UNIT = dict(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0, train_token_s=0.0,
            train_step_s=5.0, prompt_tokens=1)


def test_duet_stops_every_sample_not_kept_at_its_horizon():
    # q tiny: no draw is kept, so every 10-token sample stops at 4 tokens: 4 + 5 a step
    run = SimRun(batch_groups=2, group_size=1, max_new_tokens=10, duet_horizon=4, duet_q=1e-9)
    r = simulate(run, SimSettings(steps=3, **UNIT))
    assert r["step_ends_s"] == [9.0, 18.0, 27.0]
    assert r["early_stops"] == {"duet_aborted": 6}
    assert r["mean_response_tokens"] == 4.0


def test_duet_keeps_a_sample_when_its_draw_is_below_q():
    # synchronous, two samples a step (groups admitted in order 0, 1, 2, ...): a step takes
    # 10 decode steps if one of its samples is kept, else 4, then 5 s of training
    q = 0.5
    kept = [keep_draw(request_seed(0, seq, 0)) < q for seq in range(6)]
    assert 0 < sum(kept) < 6  # the draws of seed 0 give both outcomes
    want, t = [], 0.0
    for step in range(3):
        t += (10 if kept[2 * step] or kept[2 * step + 1] else 4) + 5
        want.append(t)
    run = SimRun(batch_groups=2, group_size=1, max_new_tokens=10, duet_horizon=4, duet_q=q)
    r = simulate(run, SimSettings(steps=3, **UNIT))
    assert r["step_ends_s"] == want
    assert r["early_stops"].get("duet_aborted", 0) == 6 - sum(kept)


def arrol_run(**kw) -> SimRun:
    # group_size 2 over-provisioned 2x: 4 members generated, 2 kept at 3 tokens
    return SimRun(batch_groups=1, group_size=2, max_new_tokens=10, pruner="arrol",
                  pruner_args={"overprovision": 2.0, "at": 3}, **kw)


def test_arrol_prunes_to_the_survivors_at_its_checkpoint():
    # decode step: 1 s + 1 s a row. 3 steps with 4 rows (15 s), the 2 survivors 7 more
    # steps with 2 rows (21 s), then 5 s of training: 41 s a step (50 s without pruning)
    run = arrol_run()
    assert run.generated_size == 4 and run.batch == 4
    s = SimSettings(steps=2, **{**UNIT, "decode_row_s": 1.0})
    r = simulate(run, s)
    assert r["step_ends_s"] == [41.0, 82.0]
    assert r["early_stops"] == {"pruned": 4}
    assert r["mean_response_tokens"] == (2 * 10 + 2 * 3) / 4  # pruned ones keep 3 tokens


def test_arrol_member_that_ends_before_the_checkpoint_survives(monkeypatch):
    # lengths 2, 10, 10, 10: steps 1-2 with 4 rows (10 s), step 3 with 3 rows (4 s), then
    # the gate keeps the finished member and one of the three: 7 steps with 1 row (14 s)
    sim = Simulation(arrol_run(), SimSettings(steps=1, **{**UNIT, "decode_row_s": 1.0}))
    monkeypatch.setattr(sim.lengths, "group", lambda rng, size: [(1, 2)] + [(1, 10)] * 3)
    r = sim.run_all()
    assert r["step_ends_s"] == [10.0 + 4.0 + 14.0 + 5.0]
    assert r["early_stops"] == {"pruned": 2}
    assert r["mean_response_tokens"] == (2 + 10 + 3 + 3) / 4


def test_the_runs_early_stop_settings_come_from_its_config():
    cfg = load_checked(None, ["control.duet_abort=true", "control.duet_horizon=3",
                              "control.duet_q=0.25", "rollout.max_new_tokens=8"])
    run = SimRun.from_config(cfg)
    assert (run.duet_horizon, run.duet_q, run.pruner) == (3, 0.25, "none")
    off = SimRun.from_config(load_checked(None, []))
    assert (off.duet_horizon, off.pruner) == (0, "none")


def test_a_bad_pruner_setting_is_refused_by_the_real_pruner():
    with pytest.raises(ValueError, match="at .* must be below rollout.max_new_tokens"):
        simulate(SimRun(batch_groups=1, group_size=2, max_new_tokens=4, pruner="arrol",
                        pruner_args={"at": 4}), SimSettings(steps=1, **UNIT))


def staged(success_a: float, success_b: float) -> dict:
    # AR3PO's stages (the real allocator): 2 samples a stage, up to 3 while none is correct;
    # 8 samples a step, so admission reserves 6 a group; every response 10 tokens
    run = SimRun(batch_groups=2, group_size=4, max_new_tokens=10, allocator="ar3po_stages",
                 allocator_args={"k": 2, "max_stages": 3})
    return simulate(run, SimSettings(steps=3, success_a=success_a, success_b=success_b,
                                     **UNIT))


def test_adaptive_groups_never_correct_run_every_stage():
    # success ~ 0: every group runs 3 stages of 10 s (6 samples). Version 0 has room for 8
    # samples: one group, and then nothing more fits, so the batch is its 6 (as
    # Rollouts.next_batch), trained 30-35. Version 1: 16 less 6 taken, one group, 65-70.
    # Version 2: 24 less 12, two groups side by side, both done at 100: 12 samples, 100-105
    r = staged(1e-6, 1e6)
    assert r["step_ends_s"] == [35.0, 70.0, 105.0]
    assert r["counters"]["consumed"] == 4 and r["samples_per_s"] * r["time_s"] == 24


def test_adaptive_groups_always_correct_stop_after_one_stage():
    # success ~ 1: 2 samples a group. Version 0 admits 8 samples' worth: groups at 0 and
    # 10 (4 samples, done at 20: the batch); version 1's 16 less the 4 taken: groups at 25
    # (two), 35, 45 -> 8 samples at 55, trained to 60; version 2 likewise from 60 to 95
    r = staged(1e6, 1e-6)
    assert r["step_ends_s"] == [25.0, 60.0, 95.0]
    assert r["samples_per_s"] * r["time_s"] == 4 + 8 + 8


def test_a_pruner_with_an_adaptive_allocator_is_refused():
    with pytest.raises(ValueError, match="pruner 'arrol' with the adaptive allocator"):
        simulate(arrol_run(allocator="ar3po_stages"), SimSettings(steps=1, **UNIT))

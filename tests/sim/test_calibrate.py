"""The cost model's fit: non-negative least squares on hand-made data, the per-sample term
(row_s) that separate response lengths identify, and the resume cost of partial rollouts
from the engine's busy time."""

from __future__ import annotations

import json

import pytest

from reroll.sim.calibrate import (
    fit,
    fit_engine,
    fit_resume,
    fit_resume_wall,
    fit_tasks,
    nnls,
    readds,
    resumed_tokens,
    resumes_by_age,
)
from reroll.sim.gen_device import GenDevice, Row
from reroll.sim.settings import SimSettings


def test_nnls_by_hand():
    x = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert nnls(x, [2.0, 3.0, 5.0]) == pytest.approx([2.0, 3.0])  # exact and >= 0
    # y = (2, -1, 1) = 2 a - b needs b < 0. a alone: a = (2 + 1) / 2 = 1.5, squared error
    # 0.25 + 1 + 0.25 = 1.5; b alone: b = (-1 + 1) / 2 = 0, error 6: the first
    assert nnls(x, [2.0, -1.0, 1.0]) == pytest.approx([1.5, 0.0])
    assert nnls(x, [-1.0, -1.0, -2.0]) == [0.0, 0.0]


def write(d, rows):
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def three_runs(tmp_path, steps, stall=None, loop=(0.0, 0.0), runs=None):
    """Runs a (32 samples of up to 6 tokens), b (8 of 6) and c (8 of 12), their wait for
    rollouts 0.01 s a decode step + 0.001 s a token + 0.004 s a sample (plus ``stall``:
    {step index: extra seconds}), training 0.05 s a step, the loop's own work
    ``loop[0] + loop[1]`` a sample."""
    for name, n, mx, token_s in runs or (("a", 32, 6, 0.001), ("b", 8, 6, 0.001),
                                         ("c", 8, 12, 0.001)):
        rows, t = [], 0.0
        for step in range(steps):
            mean = mx - 0.5 * (step % 2)
            wait = 0.01 * mx + token_s * n * mean + 0.004 * n + (stall or {}).get(step, 0.0)
            t += wait + 0.05 + loop[0] + loop[1] * n
            rows.append({"step": step + 1, "time": t, "pipeline/samples_in_batch": n,
                         "length/mean": mean, "length/max": mx, "time/train_s": 0.05,
                         "time/wait_for_rollouts_s": wait})
        write(tmp_path / name, rows)


def test_fit_separates_a_per_sample_cost_with_two_response_lengths(tmp_path):
    # wait = 0.01 s a decode step + 0.001 s a token + 0.004 s a sample; lengths 6 and 12
    three_runs(tmp_path, steps=4)
    f = fit([tmp_path / k for k in "abc"], prompt_tokens=7, skip=0)
    assert (f["decode_base_s"], f["decode_row_s"], f["row_s"]) == pytest.approx(
        (0.01, 0.001, 0.004))
    assert (f["train_step_s"], f["train_token_s"]) == pytest.approx((0.05, 0.0), abs=1e-12)
    assert f["loop_s"] == pytest.approx(0.0, abs=1e-12)  # wall = wait + train exactly
    assert f["sync_s"] == pytest.approx(0.0, abs=1e-12)  # no fixed cost an update


def test_fit_takes_an_updates_fixed_cost_apart_from_the_per_sample_one(tmp_path):
    # the same three runs, each wait 0.02 s longer: an update's fixed cost (the weights
    # sent and loaded), which batches of 32 and 8 samples separate from the 0.004 s a sample
    three_runs(tmp_path, steps=4, stall={s: 0.02 for s in range(4)})
    f = fit([tmp_path / k for k in "abc"], prompt_tokens=7, skip=0)
    assert (f["sync_s"], f["decode_base_s"], f["decode_row_s"], f["row_s"]) == pytest.approx(
        (0.02, 0.01, 0.001, 0.004))
    assert f["stall_s"] == pytest.approx(0.0, abs=1e-12)  # the same on every step: no stall


def test_fit_refuses_runs_that_cannot_separate_an_updates_cost_from_a_decode_steps(tmp_path):
    # two batch sizes at one response length: a fixed cost an update and 0.01 s a decode
    # step of 6 are the same column (0.06 s either way); the fit says so instead of choosing
    three_runs(tmp_path, steps=4, runs=(("a", 32, 6, 0.001), ("b", 8, 6, 0.001)))
    with pytest.raises(ValueError, match="do not separate the generation terms"):
        fit([tmp_path / "a", tmp_path / "b"], prompt_tokens=7, skip=0)


def test_each_task_has_its_own_cost_a_token_and_shares_the_rest(tmp_path):
    # runs a, b, c of one task as above (0.001 s a token); d, of a second task, decodes a
    # token in 0.0025 s with every other cost the same: 16 samples of up to 10 tokens
    three_runs(tmp_path, steps=4, runs=(("a", 32, 6, 0.001), ("b", 8, 6, 0.001),
                                        ("c", 8, 12, 0.001), ("d", 16, 10, 0.0025)))
    f = fit_tasks([tmp_path / k for k in "abcd"], ["main", "main", "main", "tail"],
                  prompt_tokens=7, skip=0)
    assert sorted(f) == ["main", "tail"]
    for task, token_s in (("main", 0.001), ("tail", 0.0025)):
        assert (f[task]["decode_base_s"], f[task]["decode_row_s"], f[task]["row_s"]) == \
            pytest.approx((0.01, token_s, 0.004))
    assert {k: v for k, v in f["main"].items() if k != "decode_row_s"} == \
        {k: v for k, v in f["tail"].items() if k != "decode_row_s"}
    # one task: fit's model, the same numbers as fit_tasks with one label
    g = fit([tmp_path / k for k in "abc"], prompt_tokens=7, skip=0)
    assert g == fit_tasks([tmp_path / k for k in "abc"], ["x"] * 3, prompt_tokens=7,
                          skip=0)["x"]
    with pytest.raises(ValueError, match="3 runs and 2 task labels"):
        fit_tasks([tmp_path / k for k in "abc"], ["main", "main"], prompt_tokens=7)
    # d alone in the one-task fit: the shared token cost splits the two, exact on neither
    h = fit([tmp_path / k for k in "abcd"], prompt_tokens=7, skip=0)
    assert 0.001 < h["decode_row_s"] < 0.0025


def test_resumes_by_age_from_the_recorded_spans(tmp_path):
    def sample(*versions):  # a 3-token prompt, then a sampled span per version
        return {"spans": [{"start": 0, "end": 3, "source": "prompt", "version": -1}]
                + [{"start": 3 + i, "end": 4 + i, "source": "sampled", "version": v}
                   for i, v in enumerate(versions)]}

    # group A started at version 2: one member resumed at updates 3 and 4, one at 3 only,
    # one never; group B started at 3: resumed at 4. Update 3: 2 of age 1; update 4: 1 of
    # age 2 (A) and 1 of age 1 (B)
    a = {"start_version": 2, "rollouts": [sample(2, 3, 4), sample(2, 3), sample(2)]}
    b = {"start_version": 3, "rollouts": [sample(3, 4)]}
    (tmp_path / "rollouts.jsonl").write_text(
        json.dumps({"step": 5, "group": a}) + "\n" + json.dumps({"step": 6, "group": b}))
    assert resumes_by_age(tmp_path) == {3: {1: 2}, 4: {2: 1, 1: 1}}


def test_readds_from_the_recorded_timings(tmp_path):
    def sample(versions, add, placed):  # a 3-token prompt, a sampled span per version
        return {"spans": [{"start": 0, "end": 3, "source": "prompt", "version": -1}]
                + [{"start": 3 + i, "end": 4 + i, "source": "sampled", "version": v}
                   for i, v in enumerate(versions)],
                "timings": {"engine_add": add, "engine_prefill": placed}}

    # update 4 resumed group A's two members (re-added at 10.000 and 10.001: the group's
    # re-add is 10.000) and group B's one (10.004); the first placement is A's second
    # member at 10.050. B's other member was resumed at 4 and again at 5 (its times are
    # update 5's: re-added 11.000, placed 10.990, before the re-add: -0.010); one member
    # never resumed counts nowhere. Update 4: 2 groups, 4 ms of re-adds, placed 46 ms
    # after the last
    a = {"group_id": "A", "start_version": 3,
         "rollouts": [sample([3, 4], 10.000, 10.060), sample([3, 4], 10.001, 10.050),
                      sample([3], 9.0, 9.1)]}
    b = {"group_id": "B", "start_version": 3,
         "rollouts": [sample([3, 4], 10.004, 10.080), sample([3, 4, 5], 11.000, 10.990)]}
    (tmp_path / "rollouts.jsonl").write_text(
        json.dumps({"step": 5, "group": a}) + "\n" + json.dumps({"step": 6, "group": b}))
    got = readds(tmp_path)
    assert sorted(got) == [4, 5]
    assert got[4]["groups"] == 2
    assert got[4]["add_span_s"] == pytest.approx(0.004)
    assert got[4]["place_after_s"] == pytest.approx(0.046)
    assert got[5] == {"groups": 1, "add_span_s": 0.0, "place_after_s": pytest.approx(-0.010)}


def test_fit_resume_from_engine_time(tmp_path):
    # engine time = 1e-4 s a generated token + 5e-4 s a sample started (groups of 8) +
    # 3e-5 s a resumed token + 2e-3 s a resumed request; the counters are cumulative
    rows, tok, started, res, rtok = [], 0, 0, 0, 0
    for step, (dt, dg, dr, dk) in enumerate([(700, 16, 0, 0), (600, 8, 100, 1000),
                                             (800, 16, 0, 0), (650, 4, 120, 1800),
                                             (500, 2, 50, 400)]):
        tok, started, res, rtok = tok + dt, started + dg, res + dr, rtok + dk
        rows.append({"step": step + 1,
                     "time/generate_s": 1e-4 * dt + 5e-4 * 8 * dg + 3e-5 * dk + 2e-3 * dr,
                     "pipeline/tokens_generated": tok, "engine/requests_resumed": res,
                     "engine/resumed_tokens": rtok,
                     "pipeline/started": started, "pipeline/samples_in_batch": 128,
                     "pipeline/groups_in_batch": 16})
    write(tmp_path / "r", [{**rows[0], "step": 0, "pipeline/tokens_generated": 0,
                            "engine/requests_resumed": 0, "engine/resumed_tokens": 0,
                            "pipeline/started": 0}] + rows)
    f = fit_resume([tmp_path / "r"], skip=0)
    assert (f["engine_token_s"], f["engine_sample_s"], f["engine_resume_token_s"],
            f["engine_resume_row_s"]) == pytest.approx((1e-4, 5e-4, 3e-5, 2e-3))


def test_resumed_tokens_from_the_counter_else_from_the_recorded_spans(tmp_path):
    rows = [{"step": i, "time/generate_s": 0.1, "engine/requests_resumed": n}
            for i, n in enumerate([0, 3, 5])]
    write(tmp_path / "c", [{**r, "engine/resumed_tokens": 10 * i} for i, r in enumerate(rows)])
    assert resumed_tokens(tmp_path / "c") == [0, 10, 20]  # the engine's own count
    write(tmp_path / "s", rows)

    def sample(*starts):  # a 7-token prompt, then sampled spans (a resume at each start)
        return {"spans": [{"start": 0, "end": 7, "source": "prompt", "version": -1}]
                + [{"start": a, "end": a + 1, "source": "sampled", "version": v}
                   for v, a in enumerate((7,) + starts)]}

    group = {"rollouts": [sample(9, 13), sample(11), sample()]}
    (tmp_path / "s" / "rollouts.jsonl").write_text(json.dumps({"step": 1, "group": group}))
    # resumes prefilled 9, 13 and 11 tokens again: 11 a resume, times the counter
    assert resumed_tokens(tmp_path / "s") == pytest.approx([0, 33, 55])


def test_fit_resume_wall_by_hand():
    # what the simulator misses a step = 1e-4 s a resumed token + 5e-4 s a resumed request
    runs = [{"measured_s": 0.30, "simulated_s": 0.15, "resumed": 100, "resumed_tokens": 1000},
            {"measured_s": 0.235, "simulated_s": 0.10, "resumed": 50, "resumed_tokens": 1100}]
    assert fit_resume_wall(runs) == pytest.approx({"resume_token_s": 1e-4,
                                                   "resume_row_s": 5e-4})
    # one prefix length: the columns are proportional, the per-token term takes it all
    assert fit_resume_wall(runs[:1]) == pytest.approx({"resume_token_s": 1.5e-4,
                                                       "resume_row_s": 0.0})
    with pytest.raises(ValueError, match="no run resumed"):
        fit_resume_wall([{**runs[0], "resumed": 0, "resumed_tokens": 0}])


def test_fit_resume_wall_with_the_engines_per_token_cost_fits_one_term_by_hand():
    runs = [{"measured_s": 0.30, "simulated_s": 0.15, "resumed": 100, "resumed_tokens": 1000},
            {"measured_s": 0.235, "simulated_s": 0.10, "resumed": 50, "resumed_tokens": 1100}]
    # token_s 1e-4: left beside it 0.15 - 0.10 = 0.05 and 0.135 - 0.11 = 0.025, a request
    # (100 x 0.05 + 50 x 0.025) / (100^2 + 50^2) = 6.25 / 12500 = 5e-4 (the data's own)
    assert fit_resume_wall(runs, token_s=1e-4) == pytest.approx(
        {"resume_token_s": 1e-4, "resume_row_s": 5e-4})
    # token_s 5e-5: left 0.10 and 0.08, (10 + 4) / 12500 = 1.12e-3 (a least-squares fit:
    # 1.0e-3 and 1.6e-3 a request in the two runs)
    assert fit_resume_wall(runs, token_s=5e-5) == pytest.approx(
        {"resume_token_s": 5e-5, "resume_row_s": 1.12e-3})
    # token_s 2e-4 leaves -0.05 and -0.085: the request's cost stays >= 0
    assert fit_resume_wall(runs, token_s=2e-4) == pytest.approx(
        {"resume_token_s": 2e-4, "resume_row_s": 0.0})
    # 10 ms more on the first run: the two-term solve moves both terms, 1000 t + 100 r =
    # 0.16 and 1100 t + 50 r = 0.135 give t = 0.11 / 1200 = 9.1667e-5 and r = (0.16 -
    # 0.091667) / 100 = 6.8333e-4; with t fixed, r = (100 x 0.06 + 50 x 0.025) / 12500 =
    # 5.8e-4 and t stays
    noisy = [{**runs[0], "measured_s": 0.31}, runs[1]]
    assert fit_resume_wall(noisy) == pytest.approx(
        {"resume_token_s": 0.11 / 1200, "resume_row_s": (0.16 - 1000 * 0.11 / 1200) / 100})
    assert fit_resume_wall(noisy, token_s=1e-4) == pytest.approx(
        {"resume_token_s": 1e-4, "resume_row_s": 5.8e-4})
    with pytest.raises(ValueError, match="token_s must be >= 0"):
        fit_resume_wall(runs, token_s=-1e-5)


def test_fit_resume_wall_with_an_updates_own_cost_by_hand():
    # missed a step = 1e-4 s a resumed token + 2e-4 s a request + 0.01 s an update: runs of
    # 60 and 140 requests a step (600 and 1400 tokens) miss 0.06 + 0.012 + 0.01 = 0.082 and
    # 0.14 + 0.028 + 0.01 = 0.178 s
    runs = [{"measured_s": 0.182, "simulated_s": 0.10, "resumed": 60, "resumed_tokens": 600},
            {"measured_s": 0.278, "simulated_s": 0.10, "resumed": 140, "resumed_tokens": 1400}]
    assert fit_resume_wall(runs, token_s=1e-4, update=True) == pytest.approx(
        {"resume_token_s": 1e-4, "resume_row_s": 2e-4, "update_s": 0.01})
    # without the update's term the request takes it: left 0.022 and 0.038 s, (60 x 0.022 +
    # 140 x 0.038) / (60^2 + 140^2) = 6.64 / 23200
    assert fit_resume_wall(runs, token_s=1e-4) == pytest.approx(
        {"resume_token_s": 1e-4, "resume_row_s": 6.64 / 23200})
    # a third run of 100 requests 0.005 s over the line: least squares on three points
    # (a line through (60, 0.022), (140, 0.038) and (100, 0.035)): slope = sum((x - 100)(y -
    # 0.031667)) / sum((x - 100)^2) = (-40 x -0.009667 + 40 x 0.006333) / 3200 = 2e-4,
    # intercept 0.031667 - 2e-4 x 100 = 0.011667
    third = {"measured_s": 0.235, "simulated_s": 0.10, "resumed": 100, "resumed_tokens": 1000}
    f = fit_resume_wall([*runs, third], token_s=1e-4, update=True)
    assert (f["resume_row_s"], f["update_s"]) == pytest.approx((2e-4, 0.035 / 3))
    # runs that resume about as many a step do not separate the two; three terms need token_s
    with pytest.raises(ValueError, match="differ by half or more"):
        fit_resume_wall([runs[0], {**runs[0], "resumed": 80}], token_s=1e-4, update=True)
    with pytest.raises(ValueError, match="needs token_s"):
        fit_resume_wall(runs, update=True)


def test_fit_resume_refuses_runs_that_resumed_nothing(tmp_path):
    write(tmp_path / "s", [{"step": i, "time/generate_s": 0.1, "pipeline/tokens_generated": i,
                            "engine/requests_resumed": 0, "pipeline/started": i,
                            "pipeline/samples_in_batch": 8, "pipeline/groups_in_batch": 1}
                           for i in range(3)])
    with pytest.raises(ValueError, match="no request was resumed"):
        fit_resume([tmp_path / "s"], skip=0)


def test_row_s_is_paid_once_per_admitted_sample():
    d = GenDevice(SimSettings(decode_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.0,
                              row_s=0.5))
    d.add([Row("a", ctx=3, left=2, prefill=3), Row("b", ctx=3, left=4, prefill=3)])
    assert d.plan(None) == pytest.approx(2 * 0.5 + 2 * 1.0)  # both admitted, 2 steps
    d.finish_chunk()
    d.add([Row("c", ctx=3, left=1, prefill=3)])
    assert d.plan(None) - d.t == pytest.approx(0.5 + 1.0)  # only c is new


def test_stalled_steps_are_left_out_of_the_fit(tmp_path):
    # as the first fit, with one step of each run stalled 3 s by other work: left out
    # (more than twice the run's median), the fit is exact again
    three_runs(tmp_path, steps=5, stall={2: 3.0})
    f = fit([tmp_path / k for k in "abc"], prompt_tokens=7, skip=0)
    assert (f["decode_base_s"], f["decode_row_s"], f["row_s"]) == pytest.approx(
        (0.01, 0.001, 0.004))


def test_the_loops_work_per_sample_and_the_stalls_mean_cost(tmp_path):
    # the loop's own work 0.02 s a step + 0.001 s a sample (0.052 s for run a's 32, 0.028 s
    # for b's and c's 8); one step of each run (index 2) stalled 3 s in its wait
    three_runs(tmp_path, steps=5, stall={2: 3.0}, loop=(0.02, 0.001))
    f = fit([tmp_path / k for k in "abc"], prompt_tokens=7, skip=0)
    assert (f["loop_s"], f["loop_row_s"]) == pytest.approx((0.02, 0.001))
    assert (f["decode_base_s"], f["decode_row_s"], f["row_s"]) == pytest.approx(
        (0.01, 0.001, 0.004))
    # the 4 step pairs of a run wait w(6) and w(5.5) in turn (mean lengths 6, 5.5 tokens:
    # w(5.5) = w(6) - 0.0005 n), the stalled one w(6) + 3; the median of the four is
    # (w(6) + w(5.5)) / 2, so the stall lost 3 + 0.00025 n: 3.008 (a), 3.002 (b, c),
    # over 3 x 4 steps
    assert f["stall_s"] == pytest.approx((3.008 + 2 * 3.002) / 12)


def test_fit_engine_and_a_token_cost_fixed_at_the_engines(tmp_path):
    # the three runs above, and the engine's own busy time a step: 0.002 s a decode step +
    # 0.0005 s a token + 0.0001 s a sample (the rest of the wait is the driver's)
    three_runs(tmp_path, steps=4)
    for name in "abc":
        path = tmp_path / name / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for r in rows:
            n = r["pipeline/samples_in_batch"]
            r["time/generate_s"] = (0.002 * r["length/max"] + 0.0005 * n * r["length/mean"]
                                    + 0.0001 * n)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    e = fit_engine([tmp_path / k for k in "abc"], skip=0)
    assert (e["engine_step_s"], e["engine_token_s"], e["engine_sample_s"]) == pytest.approx(
        (0.002, 0.0005, 0.0001))
    # the wait's token cost fixed at 0.0005: the fit puts the other 0.0005 s a token
    # (0.0005 x mean length a sample, the mean alternating 6 / 5.5 and 12 / 11.5) where it
    # fits best; with it at the true 0.001 the other terms come back exactly
    f = fit_tasks([tmp_path / k for k in "abc"], [""] * 3, prompt_tokens=7, skip=0,
                  token_s=0.001)[""]
    assert (f["decode_base_s"], f["decode_row_s"], f["row_s"], f["sync_s"]) == pytest.approx(
        (0.01, 0.001, 0.004, 0.0), abs=1e-9)
    low = fit_tasks([tmp_path / k for k in "abc"], [""] * 3, prompt_tokens=7, skip=0,
                    token_s=0.0005)[""]
    assert low["decode_row_s"] == 0.0005 and low["decode_base_s"] > 0.01

"""benchmarks/sim_validate.py's schedule counts, by hand: the quiet steps of a run (neither
the step nor the one before resumed a request) from a measured run's cumulative counter and
from a simulated run's per-step counts, which must read them the same way."""

import json

import pytest


@pytest.fixture(scope="module")
def sv(benchmarks_on_path):
    import sim_validate as module

    return module


def test_quiet_steps_need_two_steps_in_a_row_without_resumes(sv):
    # a lone 0 after a burst is the step that drained it, not a quiet one
    assert sv.quiet_steps([85, 153, 256, 0, 123, 248, 0]) == 0
    # 0, 0, 0 after a burst: two steps whose step before resumed nothing too
    assert sv.quiet_steps([177, 0, 0, 0, 88]) == 2
    assert sv.quiet_steps([0]) == 0 and sv.quiet_steps([]) == 0


def test_measured_counts_read_the_cumulative_counter_after_the_warm_up(sv, tmp_path):
    # requests resumed, cumulative, at the end of steps 1-8; with skip 3 the steps
    # counted are 4-8: 85, 0, 0, 0, 40 resumed -> 125 over 5 steps; quiet: steps 6 and 7
    # (steps 5-6 and 6-7 both 0); step 4 resumed 85 so step 5 is not quiet
    cum = [0, 0, 10, 10, 95, 95, 95, 95, 135]
    rows = [{"step": i, "time": float(i), "pipeline/samples_in_batch": 16,
             "engine/requests_resumed": float(c), "engine/resumed_tokens": 10.0 * c,
             "time/generate_s": 0.1} for i, c in enumerate(cum[1:], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = sv.counts(tmp_path, 3)
    assert c["resumed_per_step"] == pytest.approx(125 / 5)
    assert c["resumed_tokens_per_step"] == pytest.approx(1250 / 5)
    assert c["quiet_steps"] == 2


def test_resumes_by_age_are_read_over_the_updates_whose_groups_were_all_trained(sv, tmp_path):
    # 8 steps, largest lag 2: updates 4-6 (after the warm-up of 3, up to 8 - 2) are whole
    rows = [{"step": i, "time": float(i), "pipeline/samples_in_batch": 2,
             "engine/requests_resumed": float(i > 6), "time/generate_s": 0.1}
            for i in range(1, 9)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    group = {"start_version": 5, "rollouts": [{"spans": [
        {"start": 0, "end": 2, "source": "prompt", "version": -1},
        {"start": 2, "end": 3, "source": "sampled", "version": 5},
        {"start": 3, "end": 4, "source": "sampled", "version": 6}]}]}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 8, "group": group}))
    c = sv.counts(tmp_path, 3)
    assert c["updates"] == (4, 6) and c["by_age"] == {6: {1: 1}}
    # over updates 4-6: age 1 resumed 1 in 3 updates -> 0.33, shown rounded
    assert sv.by_age(c["by_age"], c["updates"]) == "0"
    assert sv.by_age({4: {1: 117, 2: 100}, 5: {1: 119, 2: 98}}, (4, 5)) == "118+99"
    assert sv.by_age({4: {2: 9}}, (4, 4)) == "0+9"  # an age with none is shown as 0
    assert sv.by_age({}, (4, 6)) == "-"
    # without partial rollouts (the counter never moved) a span's new version resumed
    # nothing: no resumes by age
    rows = [{**r, "engine/requests_resumed": 0.0} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sv.counts(tmp_path, 3)["by_age"] == {}


def test_intervals_between_updates_by_hand(sv):
    # ends 0, 1, 3, 4, 6 -> intervals 1, 2, 1, 2: mean 1.5, population sd 0.5; each interval
    # against the next, (1, 2), (2, 1), (1, 2), lies on y = 3 - x: r = -1 (alternation)
    mean, sd, r = sv.intervals([0.0, 1.0, 3.0, 4.0, 6.0])
    assert (mean, sd) == (1.5, 0.5)
    assert r == pytest.approx(-1.0, abs=1e-12)  # a few roundings of small integers
    # intervals 1, 1, 2, 3: mean 1.75, variance (0.5625 + 0.5625 + 0.0625 + 1.5625) / 4 =
    # 0.6875; pairs x = 1, 1, 2 and y = 1, 2, 3: cov 1, sxx 2/3, syy 2 -> r = sqrt(3) / 2
    mean, sd, r = sv.intervals([0.0, 1.0, 2.0, 4.0, 7.0])
    assert mean == 1.75 and sd == pytest.approx(0.6875 ** 0.5, rel=1e-15)
    assert r == pytest.approx(3 ** 0.5 / 2, rel=1e-12)


def test_intervals_without_a_correlation(sv):
    assert sv.intervals([0.0, 2.0, 4.0, 6.0]) == (2.0, 0.0, None)  # constant intervals
    assert sv.intervals([0.0, 1.0, 3.0]) == (1.5, 0.5, None)  # one pair only
    assert sv.intervals([5.0]) == (0.0, 0.0, None)


def test_the_requests_in_the_engine_at_an_update_are_read_from_the_spans(tmp_path):
    from reroll.sim.calibrate import in_engine

    # a group started at version 5: sample A sampled under 5 and 6 (running at the update
    # to 6, age 1); sample B only under 7: at the updates to 6 and 7 it waited for a slot
    # (ages 1 and 2); A was done before the update to 7
    span = lambda v: {"start": 0, "end": 1, "source": "sampled", "version": v}  # noqa: E731
    prompt = {"start": 0, "end": 2, "source": "prompt", "version": -1}
    group = {"start_version": 5, "rollouts": [{"spans": [prompt, span(5), span(6)]},
                                              {"spans": [prompt, span(7)]}]}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 9, "group": group}))
    assert in_engine(tmp_path) == {6: {"running": {1: 1}, "waiting": {1: 1}},
                                   7: {"running": {}, "waiting": {2: 1}}}


def test_the_drivers_re_add_time_per_request_in_the_engine_by_hand(tmp_path):
    from reroll.sim.calibrate import readd_row_s

    # update 6 resumes two groups of 2 (spans under 5 and 6), re-added 3 ms apart: the span
    # covers one group of two, so the re-adds took 6 ms for the 4 requests: 1.5 ms each
    span = lambda v: {"start": 0, "end": 1, "source": "sampled", "version": v}  # noqa: E731
    lines = []
    for gid, add in (("a", 100.0), ("b", 100.003)):
        t = {"engine_add": add, "engine_prefill": 100.05}
        group = {"group_id": gid, "start_version": 5, "rollouts": [
            {"spans": [span(5), span(6)], "timings": t} for _ in range(2)]}
        lines.append(json.dumps({"step": 9, "group": group}) + "\n")
    (tmp_path / "rollouts.jsonl").write_text("".join(lines))
    assert readd_row_s(tmp_path, (4, 8)) == [pytest.approx(0.0015, rel=1e-9)]
    assert readd_row_s(tmp_path, (7, 8)) == []  # update 6 is not among them


def test_a_prediction_over_the_simulators_seeds_is_their_mean(sv):
    # each simulator seed draws other lengths (lognormal here), so the asynchronous run's
    # throughput differs by seed; the prediction is the plain mean of the seeds' own, and
    # seed 0's is what a one-seed prediction gives, to the bit (the simulation is exact)
    from pathlib import Path
    from statistics import fmean

    from reroll.sim.settings import SimRun, SimSettings
    from reroll.sim.timeline import TracedSimulation

    cost = {"decode_base_s": 0.003, "decode_row_s": 1e-5, "train_step_s": 0.01,
            "loop_s": 0.01, "sync_s": 0.005, "loop_share": 0.5}
    ov = ["runtime.max_staleness=1"]
    two = sv.predicted(ov, cost, Path("lognormal"), 8, 2, seeds=2)
    one = sv.predicted(ov, cost, Path("lognormal"), 8, 2)
    assert one["samples_per_s_by_seed"] == [one["samples_per_s"]]
    assert two["samples_per_s_by_seed"][0] == one["samples_per_s"]
    run = SimRun.from_config(sv.load_checked(str(sv.CONFIG), [*sv.BASE, *ov]))
    ends = TracedSimulation(run, SimSettings(**cost, seed=1, lengths="lognormal", steps=8,
                                             loop_on_gen=True)).run_all()["step_ends_s"]
    assert two["samples_per_s_by_seed"][1] == run.batch * (len(ends) - 2) / (ends[-1] - ends[1])
    assert two["samples_per_s_by_seed"][0] != two["samples_per_s_by_seed"][1]
    assert two["samples_per_s"] == fmean(two["samples_per_s_by_seed"])


def test_the_resume_token_cost_option_takes_probe_engine_or_seconds(sv):
    import argparse

    assert [sv.token_cost(v) for v in ("probe", "engine", "2.3e-5", "0")] == [
        "probe", "engine", "2.3e-5", "0"]
    for bad in ("probes", "-1e-5", "", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="probe, engine or a time"):
            sv.token_cost(bad)


def test_calibration_seeds_name_their_runs_and_map_back_to_the_calibration_run(sv):
    import argparse

    assert [sv.seeded("cal 4x8", s) for s in (0, 2)] == ["cal 4x8", "cal 4x8 seed2"]
    assert [sv.cal_name(n) for n in ("cal 4x8", "cal 4x8 seed2", "cal async 1 long24",
                                     "cal longtail async 1 seed11")] == [
        "cal 4x8", "cal 4x8", "cal async 1 long24", "cal longtail async 1"]
    assert sv.cal_seeds("0,1,2") == [0, 1, 2] and sv.cal_seeds("2") == [2]
    for bad in ("", "0,0", "-1", "a", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="distinct train seeds"):
            sv.cal_seeds(bad)


def test_the_sync_rows_run_at_a_seed_is_the_calibration_runs_where_there_is_one(sv, tmp_path):
    for name in ("cal_16x8", "cal_16x8_seed1", "sync_seed1", "sync_seed2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("")
    got = [sv.sync_run(tmp_path, k, 20, reuse=True) for k in range(4)]
    assert got == [tmp_path / "cal_16x8", tmp_path / "cal_16x8_seed1", tmp_path / "sync_seed2",
                   None]  # seed 1: the calibration run, not the sync run beside it

"""benchmarks/tournament.py's bookkeeping, by hand: the curve read from a run's metrics
(evaluation time left out, tokens from the running total), when a run is stopped, and the
per-row summary over seeds (seed-mean curve when evaluations line up, else each seed's own
time to the target)."""

import pytest


@pytest.fixture(scope="module")
def t(benchmarks_on_path):
    import tournament as module

    return module


def rows():
    # start at t=100 with an evaluation; step 2 evaluates (taking 5 s); tokens are a running total
    return [{"step": 0, "time": 100.0, "eval/greedy_accuracy": 0.30},
            {"step": 1, "time": 110.0, "pipeline/tokens_generated": 1000},
            {"step": 2, "time": 125.0, "pipeline/tokens_generated": 2500,
             "eval/greedy_accuracy": 0.36, "time/eval_s": 5.0},
            {"step": 3, "time": 135.0, "pipeline/tokens_generated": 3000}]


def test_the_curve_leaves_evaluation_out_and_reads_the_token_total(t):
    assert t.curve_of(rows()) == [(0, 0.0, 0.30, 0), (2, 20.0, 0.36, 2500)]
    assert t.train_seconds(rows()) == 30.0  # 35 s of clock less the 5 s evaluation


def test_when_a_run_stops(t):
    curve = t.curve_of(rows())
    assert t.limit_of(curve, 0.35, None, None, stop_at_target=True) == 20.0
    assert t.limit_of(curve, 0.35, None, 2.0, stop_at_target=False) == 40.0  # sync: 2 x its own
    assert t.limit_of(curve, 0.35, 70.0, None, stop_at_target=False) == 70.0  # sync's cap
    assert t.limit_of(curve, 0.40, None, 2.0, stop_at_target=False) is None  # not reached yet
    assert t.limit_of(curve, 0.40, 70.0, None, stop_at_target=True) == 70.0


def test_a_recorded_sync_run_caps_a_later_invocations_rows(t):
    sync = {"row": "sync", "seed": 2, "machine": "m", "commit": "c", "target": 0.37,
            "curve": [(0, 0.0, 0.32, 0), (10, 60.0, 0.35, 0), (20, 130.0, 0.38, 0),
                      (30, 200.0, 0.40, 0)]}
    assert t.sync_cap(sync, 2.0) == 260.0  # 2 x the 130 s to 37%, not x its 200 s end
    never = {**sync, "target": 0.45}
    assert t.sync_cap(never, 2.0) == 400.0  # never reached: 2 x its end
    older = {**sync, "curve": [(0, 0.0, 0.32, 0), (10, 90.0, 0.37, 0)]}
    other = {**sync, "commit": "d"}
    results = [older, sync, other, {**sync, "row": "trl"}, {**sync, "seed": 1}]
    assert t.recorded(results, "sync", 2, machine="m", commit="c") is sync  # the latest
    assert t.recorded(results, "sync", 2, commit="d") is other
    assert t.recorded(results, "sync", 2, commit="c", target=0.35) is None
    assert t.recorded(results, "sync", 3) is None
    # a screen run caps a full-protocol invocation at cap 1 only (it stopped at the target)
    screen = {**sync, "screen": True}
    assert t.capping_sync([screen], 2, 1.0, False, commit="c") is screen
    assert t.capping_sync([screen], 2, 2.0, False, commit="c") is None
    assert t.capping_sync([screen], 2, 2.0, True, commit="c") is screen
    full = {**sync, "screen": False, "cap": 1.0}
    assert t.capping_sync([full, screen], 2, 1.0, False, commit="c") is full  # its own first
    assert t.capping_sync([full], 2, 1.0, True, commit="c") is None  # ran past the target
    # the full protocol's sync ran to its own cap: a cap-2 run does not cap a cap-1.5 one
    full2 = {**full, "cap": 2.0}
    assert t.capping_sync([full2], 2, 2.0, False, commit="c") is full2
    assert t.capping_sync([full2], 2, 1.5, False, commit="c") is None
    # a run that never reached the target caps by its end only with the same most steps
    short = {**never, "screen": True, "max_steps": 50}
    assert t.capping_sync([short], 2, 2.0, True, 50, commit="c") is short
    assert t.capping_sync([short], 2, 2.0, True, 300, commit="c") is None
    assert t.capping_sync([screen], 2, 2.0, True, 300, commit="c") is screen  # reached


def run(curve):
    return {"curve": curve, "split": {"time/step_s": 1.0}, "why": {}}


def test_summary_over_seeds(t):
    # aligned evaluations: the seed-mean curve (0.33, 0.36 at step 5, mean time 15 s)
    a = run([(0, 0.0, 0.3, 0), (5, 10.0, 0.32, 100), (10, 30.0, 0.40, 200)])
    b = run([(0, 0.0, 0.3, 0), (5, 20.0, 0.40, 300), (10, 40.0, 0.30, 400)])
    s = t.summary([a, b], 0.35)
    assert (s["time_s"], s["tokens"], s["seeds_reaching"]) == (15.0, 200.0, 2)
    assert s["seed_times"] == [30.0, 20.0]
    assert s["final"] == pytest.approx(0.35) and s["final_std"] == pytest.approx(0.0707106781)
    # stopped at the target at different steps (the screen): the mean of each seed's own
    # time to the target
    c = {**run([(0, 0.0, 0.3, 0), (5, 10.0, 0.36, 100)]), "screen": True}
    s = t.summary([{**a, "screen": True}, c], 0.35)
    assert (s["time_s"], s["tokens"], s["seed_times"]) == (20.0, 150.0, [30.0, 10.0])
    # a seed that never reaches it: no time, and the count says so
    d = run([(0, 0.0, 0.3, 0), (5, 10.0, 0.31, 100)])
    s = t.summary([c, d], 0.35)
    assert (s["time_s"], s["seeds_reaching"]) == (None, 1)
    # the full protocol: every seed on the same evaluation grid, each stopped at its own cap
    # (its last evaluation off the grid): the seed-mean curve of the shared evaluations, here
    # (0.34 + 0.38) / 2 = 0.36 at step 10, at (100 + 90) / 2 s and (200 + 300) / 2 tokens.
    # Each seed's own time (200 and 90 s) would average 145 s: not the seed-mean curve.
    e = run([(0, 0.0, 0.3, 0), (10, 100.0, 0.34, 200), (20, 200.0, 0.38, 400),
             (27, 270.0, 0.37, 540)])
    f = run([(0, 0.0, 0.3, 0), (10, 90.0, 0.38, 300), (20, 190.0, 0.39, 600),
             (23, 230.0, 0.40, 700)])
    s = t.summary([e, f], 0.35)
    assert (s["time_s"], s["tokens"], s["seed_times"]) == (95.0, 250.0, [200.0, 90.0])
    assert s["final"] == pytest.approx(0.385) and s["cap_s"] == 270.0
    assert s["reading"] == "seed-mean curve"
    # a seed capped early leaves the shared curve too short to reach 0.37 (only step 10:
    # 0.35): every seed reached it alone, so the mean of their own times, (200 + 190) / 2
    g = run([(0, 0.0, 0.3, 0), (10, 90.0, 0.36, 300), (14, 190.0, 0.39, 600)])
    s = t.summary([e, g], 0.37)
    assert (s["time_s"], s["reading"]) == (195.0, "mean of the seeds' times")
    # compared with a row read on its seed-mean curve (95 s, own mean 145 s): both on the
    # mean of their seeds' own times, 195 / 145
    assert t.sooner(t.summary([e, f], 0.35), s) == "x1.34"
    # a row stopped at the target (the screen) keeps each seed's own time
    s = t.summary([{**e, "screen": True}, {**f, "screen": True}], 0.35)
    assert s["time_s"] == 145.0
    # over several seeds, a row whose seed-mean curve never reaches 0.35 (one seed reached it
    # at 20 s, one ran to its cap, 30 s, without): its seeds' floor is (20 + 30) / 2 = 25 s;
    # the other row's seeds reach it at 30 s and 10 s, own mean 20 s: x>1.25
    h = run([(0, 0.0, 0.3, 0), (5, 20.0, 0.36, 100)])
    k = run([(0, 0.0, 0.3, 0), (5, 15.0, 0.30, 100), (7, 30.0, 0.32, 140)])
    slow = t.summary([h, k], 0.35)
    assert (slow["time_s"], slow["own_time_s"], slow["own_floor_s"]) == (None, None, 25.0)
    fast = t.summary([a, {**run([(0, 0.0, 0.3, 0), (5, 10.0, 0.36, 100)])}], 0.35)
    assert fast["own_time_s"] == 20.0  # a at 30 s, the other at 10 s
    assert t.sooner(fast, slow) == "x>1.25"
    assert t.sooner({"time_s": 10.0}, {"time_s": 25.0, "cap_s": 50.0}) == "x2.50"
    assert t.sooner({"time_s": 10.0}, {"time_s": None, "cap_s": 50.0}) == "x>5.00"


def test_every_paper_headline_belongs_to_a_method_row_and_every_method_row_has_one(t):
    # reroll's own rows (sync, sync on the small pool, stacked, stacked without VADE) and the
    # baselines carry no paper's claim
    assert set(t.PAPER) <= set(t.ROWS)
    assert set(t.ROWS) - set(t.PAPER) == {"sync", "sync_pool", "stacked", "stacked_no_vade"}
    line = t.table([{"row": "sync", **run([(0, 0.0, 0.3, 0), (5, 50.0, 0.36, 100)])},
                    {"row": "siri", **run([(0, 0.0, 0.3, 0), (5, 25.0, 0.36, 60)])}], 0.35)
    siri = line.splitlines()[-1]
    assert siri.endswith(f"| x2.00 |  | {t.PAPER['siri']} |")


def test_why_averages_per_step_figures_and_takes_running_totals_as_their_rate(t):
    rows = [{"step": 0},
            {"step": 1, "length/mean": 100.0, "pipeline/dropped_zero_variance": 2,
             "draft/tokens_proposed": 10, "draft/tokens_accepted": 4},
            {"step": 2, "length/mean": 200.0, "pipeline/dropped_zero_variance": 5,
             "draft/tokens_proposed": 30, "draft/tokens_accepted": 9},
            {"step": 3, "length/mean": 300.0, "pipeline/dropped_zero_variance": 9,
             "draft/tokens_proposed": 40, "draft/tokens_accepted": 18}]
    why = t.why_of(rows)
    assert why["length/mean"] == 200.0  # (100 + 200 + 300) / 3
    assert why["pipeline/dropped_zero_variance a step"] == 3.0  # 9 dropped over 3 steps
    assert why["draft/acceptance"] == 18 / 40  # accepted over proposed, running totals
    assert "draft/samples_drafted a step" not in why  # a counter the run never logged
    none = t.why_of([{"step": 0}, {"step": 1, "draft/tokens_proposed": 0,
                                   "draft/tokens_accepted": 0}])
    assert "draft/acceptance" not in none  # nothing proposed: no acceptance to report


def test_a_pool_row_is_measured_against_sync_on_the_same_pool(t):
    # every reference names a row, and the two rows differ only by the method's own keys
    for name, ref in t.REFERENCE.items():
        assert ref in t.ROWS and set(t.ROWS[ref]) < set(t.ROWS[name])
    runs = [{"row": "sync", **run([(0, 0.0, 0.3, 0), (5, 50.0, 0.36, 100)])},
            {"row": "sync_pool", **run([(0, 0.0, 0.3, 0), (5, 30.0, 0.36, 100)])},
            {"row": "spec_rl_pool", **run([(0, 0.0, 0.3, 0), (5, 20.0, 0.36, 60)])}]
    lines = t.table(runs, 0.35).splitlines()
    assert "| x1.67 |" in lines[3]  # sync_pool against sync: 50 / 30
    assert "| x1.50 (vs sync_pool) |" in lines[4]  # spec_rl_pool against its pool: 30 / 20


def test_the_start_evaluated_once_is_step_0(t):
    # a row run with eval.at_start = false: row 0 marks the clock only; its step-0 point is
    # the start evaluated once for every row (0.30 here); the rest of the curve is unchanged
    r = [{"step": 0, "time": 100.0}, *rows()[1:]]
    assert t.curve_of(r, 0.30) == t.curve_of(rows()) == [(0, 0.0, 0.30, 0), (2, 20.0, 0.36, 2500)]
    assert t.train_seconds(r) == 30.0
    with pytest.raises(ValueError, match="row 0 .* has no eval/greedy_accuracy"):
        t.curve_of(r)


def test_the_readme_table_and_its_block(t):
    sync = [{**run([(0, 0, 0.30, 0), (10, 80.0, 0.39, 0), (20, 160.0, 0.40, 0)]), "row": "sync"},
            {**run([(0, 0, 0.30, 0), (10, 90.0, 0.36, 0), (20, 170.0, 0.38, 0)]), "row": "sync"}]
    trl = [{**run([(0, 0, 0.30, None), (5, 200.0, 0.36, None), (10, 400.0, 0.37, None)]),
            "row": "trl"},
           {**run([(0, 0, 0.30, None), (5, 220.0, 0.39, None), (10, 440.0, 0.39, None)]),
            "row": "trl"}]
    lines = t.readme_table(sync + trl, 0.37, "CPU X", "abc1234").splitlines()
    assert lines[0].startswith("CPU X, commit `abc1234`, target 37% held-out")
    # sync: the seed-mean curve is at 0.375 at step 10, (80 + 90) / 2 = 85 s; its seeds reach
    # 0.37 at 80 s and 170 s; finals 0.40 and 0.38: 39.0% +- 1.4% (sample std 0.0141).
    # TRL: 0.375 at step 5, (200 + 220) / 2 = 210 s; seeds at 400 s and 220 s; finals 0.37,
    # 0.39. sync against TRL 210 / 85 = x2.47, TRL against sync 85 / 210 = x0.40. Each row's
    # seeds' own mean beside: (80 + 170) / 2 = 125 and (400 + 220) / 2 = 310.
    assert lines[4] == "| sync | 2 | 85 (80, 170; mean 125) | 2/2 | 39.0% ± 1.4% | 1.0 |  | x2.47 |"
    assert lines[5] == "| trl | 2 | 210 (400, 220; mean 310) | 2/2 | 38.0% ± 1.4% | 1.0 | x0.40 |  |"
    assert "(generated by `python benchmarks/tournament.py --table --screen --readme`)" in lines[0]
    full = t.readme_table(sync + trl, 0.37, "CPU X", "abc1234", "full").splitlines()
    assert "(generated by `python benchmarks/tournament.py --table --readme`)" in full[0]
    text = f"a\n{t.README_START}\nold\n{t.README_END}\nb\n"
    assert t.replace_block(text, "new") == f"a\n{t.README_START}\nnew\n{t.README_END}\nb\n"
    with pytest.raises(ValueError, match="markers"):
        t.replace_block("no markers here", "new")
    # two blocks: each protocol's markers, the other block left as it was
    (fs, fe), (ss, se) = t.README_BLOCKS["full"], t.README_BLOCKS["screen"]
    both = f"{ss}\nA\n{se}\n{fs}\nB\n{fe}\n"
    assert t.replace_block(both, "C", "full") == f"{ss}\nA\n{se}\n{fs}\nC\n{fe}\n"
    assert t.replace_block(both, "D") == f"{ss}\nD\n{se}\n{fs}\nB\n{fe}\n"
    with pytest.raises(ValueError, match="markers"):  # the end before its start
        t.replace_block(f"{fe}\n{fs}\n", "C", "full")


def test_a_table_takes_one_protocols_rows_of_one_machine_and_commit(t):
    def rec(row, commit, **kw):
        return {"row": row, "seed": 0, "machine": kw.pop("machine", "M"), "commit": commit,
                "target": kw.pop("target", 0.37), **kw}
    rs = [rec("sync", "a", screen=True), rec("sync", "a"),  # a full-protocol row before caps
          rec("stacked", "a", cap=2.0), rec("stacked", "a", cap=1.0),  # equal time: cap 1
          rec("trl", "a", quick=True, screen=False), rec("sync", "b", screen=True),
          rec("sync", "b", screen=True, machine="N", init="x"),
          rec("sync", "b", screen=True, machine="N")]
    assert [t.protocol_of(r) for r in rs] == ["screen", "full", "full", "full", "quick",
                                              "screen", "screen", "screen"]
    full = t.pick(rs, protocol="full", cap=2.0)
    assert [(r["row"], r.get("cap")) for r in full] == [("sync", None), ("stacked", 2.0)]
    # at cap 1 a screen sync run stands for the full protocol's (it stops where that would)
    assert [(r["row"], t.protocol_of(r))
            for r in t.pick(rs, protocol="full", cap=1.0, commit="a")] == \
        [("sync", "screen"), ("stacked", "full")]
    # the screen's last row is b's on machine N with no start named: b's rows on N from
    # that start only (not the one from x); a's when asked for
    assert [(r["commit"], r["machine"]) for r in t.pick(rs, protocol="screen", cap=2.0)] == \
        [("b", "N")]
    assert [r["commit"] for r in t.pick(rs, protocol="screen", cap=2.0, commit="a")] == ["a"]
    assert t.pick(rs, protocol="quick", cap=1.5, commit="b") == []
    assert [r["row"] for r in t.pick(rs, protocol="quick", cap=1.5)] == ["trl"]  # its default
    assert t.pick(rs, protocol="screen", cap=1.5) == []  # a screen row's default cap is 2
    # one target and one set of evaluation overrides: the last row's, or the one asked for
    more = [rec("sync", "c", screen=True, target=0.35), rec("sync", "c", screen=True),
            rec("siri", "c", screen=True, extra=["eval.n_examples=50"]),
            rec("vade", "c", screen=True, extra=["eval.n_examples=50"])]
    assert [r["row"] for r in t.pick(more, protocol="screen", cap=2.0)] == ["siri", "vade"]
    assert [r["target"] for r in t.pick(more, protocol="screen", cap=2.0, target=0.35)] == \
        [0.35]


def test_a_target_held_at_two_evaluations_in_a_row(t):
    # the seed-3 shape: 37% once at 115 s, 29.5% next, then 38.0 and 37.5%
    curve = [(0, 0.0, 0.325, 0), (10, 57.0, 0.34, 0), (20, 115.0, 0.37, 0),
             (30, 153.0, 0.295, 0), (40, 198.0, 0.38, 0), (50, 239.0, 0.375, 0)]
    assert t.reach(curve[1:], 0.37) == (20, 115.0, 0.37, 0)
    assert t.reach(curve[1:], 0.37, hold=2) == (40, 198.0, 0.38, 0)  # its time: the first
    assert t.reach(curve[1:5], 0.37, hold=2) is None  # 38.0% not yet confirmed
    # sync's cap comes from the held time; a screen run stops once it is confirmed
    assert t.limit_of(curve, 0.37, None, 2.0, stop_at_target=False, hold=2) == 396.0
    assert t.limit_of(curve[:5], 0.37, None, 2.0, stop_at_target=False, hold=2) is None
    assert t.limit_of(curve, 0.37, None, None, stop_at_target=True, hold=2) == 198.0
    rec = {"row": "sync", "seed": 3, "target": 0.37, "curve": curve}
    assert t.sync_cap(rec, 2.0) == 230.0  # a row recorded without a hold: 1
    assert t.sync_cap({**rec, "hold": 2}, 2.0) == 396.0
    # recorded rows without the field read as hold 1; tables never mix two holds
    assert t.recorded([rec], "sync", 3, hold=1) is rec
    assert t.recorded([rec], "sync", 3, hold=2) is None
    base = {"machine": "m", "commit": "c", "init": "i", "target": 0.37, "extra": [],
            "screen": True, "quick": False, "seed": 0, "curve": curve}
    one, two = {**base, "row": "sync"}, {**base, "row": "sync", "hold": 2, "seed": 1}
    assert t.pick([one, two], protocol="screen", cap=2.0) == [two]
    assert t.pick([one, two], protocol="screen", cap=2.0, hold=1) == [one]
    runs = [{**two, "split": {}, "why": {}}]
    assert t.summary(runs, 0.37)["time_s"] == 198.0


def test_a_baseline_stops_at_the_second_evaluation_in_a_row(benchmarks_on_path):
    import vs_trl

    curve = [(10, 5.0, 0.37), (20, 9.0, 0.29)]
    assert vs_trl.held(curve[:1], 0.37) and not vs_trl.held(curve, 0.37)
    assert not vs_trl.held(curve[:1], 0.37, hold=2)
    assert vs_trl.held([*curve, (30, 14.0, 0.38), (40, 18.0, 0.37)], 0.37, hold=2)

"""`reroll sim` against measured runs of the main job (configs/arithmetic.toml) on this machine.

1. Calibrate: five short synchronous runs (16 and 4 groups of 8 a step with 6-token
   responses, 4 groups with 12-token ones, 16 groups with 24-token ones, and the long-tail
   task's 16 groups with 16-token responses; rollouts recorded), and
   `reroll.sim.calibrate.fit` on their metrics (a fixed cost per update, decode cost per
   step, a fixed cost per sample, per token at the engine's own time a decoded token
   (`calibrate.fit_engine`; ``--token-cost fit``: fitted with the rest), training cost per step and per token, the
   loop's own work per step and per sample, during which generation goes on on the core it
   shares with it, and the stalls' mean cost per step, a stop of both sides at the
   update); three asynchronous runs with partial rollouts (16 groups, max_staleness 1, 12-
   and 24-token responses, and the long-tail task's, whose requests are resumed with
   prefixes twice as long), whose timelines give the loop's share of the core while the
   engine decodes beside it (`calibrate_timeline.loop_share`), whose recorded rollouts
   give the update's stop a request in the engine (`readd_row_s`: the driver's re-add),
   and on which a resume's cost a request is fitted from what the simulator misses of
   their wall time (`fit_resume_wall`; the per-token term is the engine's own prefill
   time, from `calibrate.fit_resume` on every step of these resuming runs: with the
   synchronous runs beside them, which resume nothing but pull the shared per-token and
   per-sample terms, it moved 17.5-26.7 us between run sets, on these alone 26.4-30.1 on
   six sets of seven). ``--update-cost fit`` adds a third (max_staleness 2, 12-token
   responses: about 180 requests resumed a step against 60-85) and fits an update's own
   cost (``update_s``) beside a request's. With ``--resume-terms timeline`` the update's stop is the timelines' abort and re-add a request
   (`calibrate_timeline.update_stop`) and a resume's cost the engine's own time alone.
2. Predict, with that cost model and the response lengths recorded by the 16-group run (by
   the task's own synchronous run for the long-tail task), the throughput of the variants
   below, each also run for real, and compare.

The model is not SFT-warm-started (timing only; the responses are the untrained policy's).
Every run uses the Ray runtime with ``runtime.pin_cores``: the engine actor and the trainer
actor are processes of their own, each pinned to a core of its own with one torch thread
(runtime.threads = 1), which the simulator models as one generation and one training
device; the driver (stepping the engine, scoring, the loop's logging) shares the engine's
core. Throughput (samples/s) is
measured over the steps after the first ``--skip`` (warm-up) from the wall times in
metrics.jsonl, and predicted over the same steps.

    .venv/bin/python benchmarks/sim_validate.py [--quick] [--steps N] [--out DIR]

``--quick``: 20 steps a run (15 runs of about 25 s each on a quiet machine). A run whose
metrics.jsonl is in ``--out`` is not run again; ``--reuse`` runs nothing, only refits and
predicts; ``--fit-also 'longtail sync'`` adds that run to the synchronous calibration runs
(its row is then a fit, marked so, not a prediction); ``--repeats 3`` runs each predicted
variant with train.seed 0, 1 and 2 and compares the prediction with their mean (a 20-step
run's throughput moves 6-11% between seeds); ``--cal-seeds 0,1,2`` runs every calibration
run at those train seeds and pools them in the fits (the runs are in benchmarks/sim_runs.py).
Ends with ``max |predicted/measured - 1| = P%``, then how the schedules compare: the time
between updates, requests re-added, and each update's marks (`reroll.timeline.steps`:
training, the loop's work, publish to the next take, the share of it decoding) from the
runs' timelines (``log.timeline``; runs without one show "-") against the simulated ones.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from sim_published import published  # benchmarks/sim_published.py
from sim_runs import (  # noqa: F401  (benchmarks/sim_runs.py: what is run)
    ALL_CAL,
    BASE,
    CALIBRATION,
    CONFIG,
    LONGTAIL,
    SYNC_CAL,
    UPDATE_CAL,
    VARIANTS,
    cal_name,
    seeded,
    task_of,
    train,
)
from sim_schedule import (  # noqa: F401
    by_age,
    counts,
    intervals,
    intervals_text,
    marks_text,
    mean_lag,
    measured,
    quiet_steps,
    readd_line,
    report,
    samples_by_step,
    step_marks,
)

from reroll import timeline
from reroll.config_checks import load_checked
from reroll.sim.calibrate import (
    fit_engine,
    fit_resume,
    fit_resume_wall,
    fit_tasks,
    readd_row_s,
)
from reroll.sim.calibrate_timeline import (
    first_loop,
    handle_share,
    loop_share,
    loop_windows,
    row_costs,
    update_stop,
)
from reroll.sim.engine_probe import probe_run
from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.timeline import TracedSimulation


def predicted(overrides: list[str], cost: dict, lengths: Path, steps: int, skip: int,
              seeds: int = 1) -> dict:
    """The simulator's run of a variant, averaged over its own seeds 0 .. ``seeds`` - 1
    (each draws other recorded groups' lengths and success rates): throughput, idle
    fractions and resume counts are their means, the schedule (ends, ages, marks) seed 0's
    (the marks every seed's)."""
    cfg = load_checked(str(CONFIG), [*BASE, *overrides])
    run = SimRun.from_config(cfg)
    each = []
    for seed in range(seeds):
        # runtime.pin_cores puts the driver (the loop's own work) on the engine's core
        sim = TracedSimulation(run, SimSettings(**{**cost, "seed": seed}, lengths=str(lengths),
                                                steps=steps, loop_on_gen=True))
        r = sim.run_all()
        ends = r["step_ends_s"]
        t0 = ends[skip - 1] if skip else 0.0
        per = r["per_step"][skip:]
        each.append({
            "samples_per_s": run.batch * (len(ends) - skip) / (ends[-1] - t0),
            "gen_idle": r["gen_idle"], "train_idle": r["train_idle"],
            "resumed_per_step": sum(p["resumed"] for p in per) / len(per),
            "resumed_tokens_per_step": sum(p["resumed_tokens"] for p in per) / len(per),
            "quiet_steps": quiet_steps([p["resumed"] for p in per]),
            "lag": mean_lag([p["lags"] for p in per]),
            "by_age": {i: p.get("resumed_by_age", {}) for i, p in enumerate(r["per_step"], 1)},
            "ends": ends[skip - 1:] if skip else ends,
            "marks": [m for m in timeline.steps(sim.spans_read()) if m["step"] > skip]})
    mean = {k: statistics.fmean(e[k] for e in each)
            for k in ("samples_per_s", "gen_idle", "train_idle", "resumed_per_step",
                      "resumed_tokens_per_step", "lag")}
    return {**each[0], **mean, "marks": [m for e in each for m in e["marks"]],
            "samples_per_s_by_seed": [e["samples_per_s"] for e in each]}


def wall_resume_terms(resuming: dict[str, Path], cost: dict, engine: dict, steps: int,
                      skip: int, update: bool = False, seeds: int = 1,
                      own: dict[str, dict] | None = None) -> dict[str, float]:
    """The resume terms of runs recorded without a timeline: ``update_row_s`` from the
    recorded rollouts' re-add times (`readd_row_s`), ``resume_row_s`` fitted on what the
    simulator misses of the resuming runs' wall time (`fit_resume_wall`), with ``update``
    an update's own cost (``update_s``) beside it, the per-token term at the engine's own
    prefill time. ``own``: a run's own terms over ``cost`` (its task's decoded token)."""
    own = own or {}
    per = [x for d in resuming.values() for x in readd_row_s(d, counts(d, skip)["updates"])]
    # a calibration run's seeds ("cal async 1 long seed1") share its overrides
    out = {"update_row_s": statistics.median(per) if per else 0.0}
    walls = []
    for k, d in resuming.items():
        c = counts(d, skip)
        p = predicted(ALL_CAL[cal_name(k)], {**cost, **own.get(k, {}), **out,
                                             "resume_row_s": 0.0, "resume_token_s": 0.0,
                                             "update_s": 0.0}, d, steps, skip, seeds)
        batch = SimRun.from_config(load_checked(str(CONFIG), [*BASE, *ALL_CAL[cal_name(k)]])).batch
        walls.append({"measured_s": batch / measured(d, skip),
                      "simulated_s": batch / p["samples_per_s"], "resumed": c["resumed_per_step"],
                      "resumed_tokens": c["resumed_tokens_per_step"]})
    return {**out, **fit_resume_wall(walls, token_s=engine["engine_resume_token_s"],
                                     update=update)}


def sync_run(out: Path, seed: int, steps: int, reuse: bool) -> Path | None:
    """The sync row's run at a train seed: the 16-group calibration run's where it is in
    ``out`` (the same configuration), else "sync seedk" (seed 0's is the calibration run)."""
    ov = [f"train.seed={seed}"] if seed else []
    return (train(out, seeded("cal 16x8", seed), ov, steps, reuse=True)
            or train(out, seeded("sync", seed) if seed else "cal 16x8", ov, steps, reuse))


def cal_seeds(value: str) -> list[int]:
    """``--cal-seeds``: distinct train seeds >= 0, comma-separated ("0,1,2")."""
    try:
        seeds = [int(x) for x in value.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"distinct train seeds >= 0 such as 0,1,2, got {value!r}")
    return seeds


def token_cost(value: str) -> str:
    """``--resume-token-cost``: probe, engine, or seconds (finite, >= 0)."""
    if value in ("probe", "engine"):
        return value
    try:
        if math.isfinite(float(value)) and float(value) >= 0:
            return value
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"probe, engine or a time in seconds >= 0, got {value!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 steps a run")
    ap.add_argument("--steps", type=int, help="steps a run (default 20 quick, 100 full)")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    ap.add_argument("--out", default="runs/sim_validate", help="run directories go here")
    ap.add_argument("--published", action="store_true",
                    help="only the published setups' predictions (no runs)")
    ap.add_argument("--reuse", action="store_true",
                    help="run nothing: refit and predict from the run directories in --out "
                         "(calibration runs missing there are left out, variants skipped)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each predicted variant (train.seed 0, 1, ...): each row is "
                         "compared with their mean (one 20-step run moves 6-11%% between "
                         "seeds); the sync row's are its calibration run's, at these seeds "
                         "and every --cal-seeds one")
    ap.add_argument("--sim-seeds", type=int, default=3,
                    help="the simulator's own seeds a prediction averages (each draws other "
                         "recorded groups' lengths: one seed's throughput moves up to 16%% "
                         "on the asynchronous rows, as a measured run's moves between "
                         "training seeds)")
    ap.add_argument("--token-cost", choices=("engine", "fit"), default="engine",
                    help="a decoded token's cost: the engine's own time (`calibrate.fit_engine` "
                         "on the synchronous calibration runs' time/generate_s; the default), "
                         "or fitted with the other generation terms on the waits (which the "
                         "runs hardly tell apart from a decode step's and an update's)")
    ap.add_argument("--no-first-loop", dest="first_loop", action="store_false",
                    help="leave out the first step's extra loop work (first_loop_s; by "
                         "default read off the synchronous calibration runs' timelines)")
    ap.add_argument("--resume-token-cost", default="probe", type=token_cost,
                    metavar="probe|engine|SECONDS",
                    help="a resumed token's prefill: timed on the engine itself, in this "
                         "process, on the main job's model (`engine_probe.probe_prefill`; "
                         "the default), fitted on the resuming runs' steps "
                         "(`calibrate.fit_resume`: their prefixes hardly differ in length, "
                         "and it moved 0-27 us between run sets), or given in seconds")
    ap.add_argument("--resume-terms", choices=("wall", "timeline"), default="wall",
                    help="how the calibration runs that resume give an update's and a "
                         "resume's costs: fitted on what the simulator misses of their wall "
                         "times (the default: closer on every validation so far), or read "
                         "off their timelines (an update's abort and re-add a request, a "
                         "resume's prefill the engine's own time: what the wall fit leaves "
                         "out, the asynchronous runs' slower decoding, then goes unmodelled)")
    ap.add_argument("--update-cost", choices=("none", "fit"), default="none",
                    help="an update's own cost beside a request's (update_s): none (the "
                         "default), or fitted on the resuming runs' wall times with a "
                         "max_staleness 2 calibration run added (it resumes about twice as "
                         "many requests a step as the max_staleness 1 ones, which tells the "
                         "two apart); the wall-time resume terms only")
    ap.add_argument("--row-costs", choices=("admit", "timeline"), default="admit",
                    help="where a sample's fixed cost (row_s, fitted on the synchronous "
                         "waits) falls: all of it at admission (the default), or split as "
                         "the synchronous runs' timelines show it (the driver's add before "
                         "the next decode step, the driver's handling of a finished sample "
                         "before it is taken, the rest at admission; "
                         "`calibrate_timeline.row_costs`, `handle_share`): on sets L and "
                         "M no closer (max 25.9 against 24.6%, 19.8 against 18.4%)")
    ap.add_argument("--cal-seeds", type=cal_seeds, default=[0], metavar="0,1,2",
                    help="train seeds of each calibration run (default 0): every seed's run "
                         "joins the fits (seed k's run is named 'cal 4x8 seedk'; the sync row is "
                         "then measured on the 16-group run's seeds). One run of each moves the "
                         "fitted terms between run sets; with --reuse, one seed alone refits on "
                         "that seed's calibration runs")
    ap.add_argument("--fit-also", action="append", default=[], metavar="VARIANT",
                    help="a synchronous variant's run (e.g. 'longtail sync') joins the "
                         "calibration runs; its row is then marked as fitted, not predicted")
    a = ap.parse_args()
    if a.published:
        published()
        return
    steps = a.steps or (20 if a.quick else 100)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {**CALIBRATION, **(UPDATE_CAL if a.update_cost == "fit" else {})}
    cal = {seeded(k, s): train(out, seeded(k, s), [*v, *([f"train.seed={s}"] if s else [])],
                               steps, a.reuse)
           for k, v in runs.items() for s in a.cal_seeds}  # a run's seeds next to each other
    cal = {k: d for k, d in cal.items() if d is not None}
    ref = seeded("cal 16x8", a.cal_seeds[0])  # the prompts, the recorded lengths, the probe
    if ref not in cal:
        raise SystemExit(f"sim_validate --reuse: no {ref.replace(' ', '_')} run "
                         f"(metrics.jsonl) in {out}: nothing to calibrate on")
    prompt = _prompt_tokens(cal[ref])
    is_sync = {k: cal_name(k) in list(CALIBRATION)[:SYNC_CAL] for k in cal}
    sync_cal = [d for k, d in cal.items() if is_sync[k]]
    tasks = [task_of(CALIBRATION[cal_name(k)]) for k in cal if is_sync[k]]
    synchronous = [k for k, v in VARIANTS.items() if k != "sync"
                   and not any(o.startswith("runtime.max_staleness") for o in v)]
    for name in a.fit_also:
        if name not in synchronous:
            raise SystemExit(f"sim_validate --fit-also: {name!r} is not a synchronous "
                             f"variant with a run of its own (one of {synchronous})")
        d = train(out, name, VARIANTS[name], steps, a.reuse)
        if d is None:
            raise SystemExit(f"sim_validate --fit-also: no {name!r} run in {out}")
        sync_cal.append(d)
        tasks.append(task_of(VARIANTS[name]))
    # one cost model per task: each its own cost a decoded token, every other term shared
    token_s = None
    if a.token_cost == "engine":  # the engine's own, from the reference task's runs
        token_s = fit_engine([d for d, t in zip(sync_cal, tasks) if t == tasks[0]],
                             skip=a.skip)["engine_token_s"]
        print(f"a decoded token, the engine's own time: {1e6 * token_s:.2f} us")
    costs = fit_tasks(sync_cal, tasks, prompt_tokens=prompt, skip=a.skip, token_s=token_s)
    cost = costs[tasks[0]]  # the main job's: the resume terms are fitted on its runs
    if a.first_loop and all((d / "timeline.json").exists() for d in sync_cal):
        # the first step's loop (its recording and logging set up), off the synchronous
        # runs' timelines: nothing decodes beside it there
        cost["first_loop_s"] = first_loop(
            [(loop_windows(timeline.read(d / "timeline.json")), samples_by_step(d))
             for d in sync_cal], loop_s=cost["loop_s"], loop_row_s=cost["loop_row_s"])
        print(f"the first step's loop, beyond the usual: {1e3 * cost['first_loop_s']:.0f} ms")
    if a.row_costs == "timeline" and not all((d / "timeline.json").exists()
                                             for d in sync_cal):
        print("--row-costs timeline: a synchronous calibration run has no timeline; "
              "a sample's cost stays at admission")
    elif a.row_costs == "timeline":
        # a sample's cost where the run pays it: the add and the handling out of row_s
        split = row_costs([timeline.read(d / "timeline.json") for d in sync_cal], skip=a.skip)
        paid = cost["row_s"]
        cost.update(add_row_s=split["add_row_s"], handle_row_s=split["handle_row_s"],
                    row_s=max(0.0, paid - split["add_row_s"] - split["handle_row_s"]))
        print(f"a sample's {1e6 * paid:.0f} us: add {1e6 * split['add_row_s']:.0f}, handling "
              f"{1e6 * split['handle_row_s']:.0f}, at admission {1e6 * cost['row_s']:.0f}")
        if paid < split["add_row_s"] + split["handle_row_s"]:
            print("  (the timelines' add and handling exceed the fitted cost a sample: a "
                  "sample now costs more than the synchronous waits' fit says)")
    # the loop's share of the core it shares with the engine, off the timelines of the
    # calibration runs that generate while it works (the asynchronous ones)
    resuming = {k: d for k, d in cal.items() if not is_sync[k]}
    if "handle_row_s" in cost and all((d / "timeline.json").exists()
                                      for d in resuming.values()):
        # the handling's share of the core beside decoding, off the asynchronous runs
        cost["handle_share"] = handle_share(
            [timeline.read(d / "timeline.json") for d in resuming.values()],
            handle_row_s=cost["handle_row_s"], skip=a.skip)
        print(f"the handling's share of the core beside decoding: {cost['handle_share']:.3f}")
    # each resuming run simulated with its own task's cost a decoded token
    own = {k: {"decode_row_s": costs[task_of(ALL_CAL[cal_name(k)])]["decode_row_s"]}
           for k in resuming}
    # the engine's own time a resumed token, on the runs that resume (the synchronous ones
    # resume nothing and only tilt the terms shared with it)
    engine = fit_resume(list(resuming.values()), skip=a.skip)
    if a.resume_token_cost != "engine":  # a resumed token at the engine's own prefill time
        if a.resume_token_cost == "probe":
            f = probe_run(cal[ref])
            print(f"the engine's own prefill (timed here): {1e6 * f['prefill_token_s']:.1f} "
                  f"us a token, {1e6 * f['prefill_row_s']:.1f} us a request, "
                  f"{1e3 * f['prefill_forward_s']:.2f} ms a forward")
            engine["engine_resume_token_s"] = f["prefill_token_s"]
        else:
            engine["engine_resume_token_s"] = float(a.resume_token_cost)
    print("engine's own time:", json.dumps({k: float(f"{v:.4g}") for k, v in engine.items()}))
    if a.resume_terms == "timeline" and all((d / "timeline.json").exists()
                                            for d in resuming.values()):
        # read off the asynchronous calibration runs' timelines: the loop's share of the
        # core it shares with the engine, and an update's abort and re-add a request; a
        # resume's prefill is the engine's own time (fitted on every step of the resuming runs)
        events = {k: timeline.read(d / "timeline.json") for k, d in resuming.items()}
        cost["loop_share"] = loop_share(
            [(loop_windows(events[k]), samples_by_step(d)) for k, d in resuming.items()],
            loop_s=cost["loop_s"], loop_row_s=cost["loop_row_s"], skip=a.skip)
        stop = update_stop(list(events.values()), skip=a.skip)
        print(f"an update, a request in the engine: abort {1e6 * stop['abort_row_s']:.1f} us, "
              f"re-add {1e6 * stop['readd_row_s']:.1f} us (the timelines)")
        cost.update(update_row_s=stop["abort_row_s"] + stop["readd_row_s"],
                    resume_row_s=engine["engine_resume_row_s"],
                    resume_token_s=engine["engine_resume_token_s"])
    else:  # asked for, or runs recorded before timelines
        print("the resume terms fitted on the resuming calibration runs' wall times")
        if all((d / "timeline.json").exists() for d in resuming.values()):
            cost["loop_share"] = loop_share(
                [(loop_windows(timeline.read(d / "timeline.json")), samples_by_step(d))
                 for d in resuming.values()],
                loop_s=cost["loop_s"], loop_row_s=cost["loop_row_s"], skip=a.skip)
        cost.update(wall_resume_terms(resuming, cost, engine, steps, a.skip,
                                      update=a.update_cost == "fit", seeds=a.sim_seeds,
                                      own=own))
    for k, d in resuming.items():  # the calibration runs that resume, simulated whole
        c = counts(d, a.skip)
        p = predicted(ALL_CAL[cal_name(k)], {**cost, **own[k]}, d, steps, a.skip, a.sim_seeds)
        print(f"{k}: {measured(d, a.skip):.1f} samples/s measured, {p['samples_per_s']:.1f} "
              f"simulated; {c['resumed_per_step']:.1f} requests and "
              f"{c['resumed_tokens_per_step']:.0f} tokens resumed a step")
    for t in costs:  # the resume and update terms are every task's
        costs[t] = {**cost, "decode_row_s": costs[t]["decode_row_s"]}
    print("cost model:", json.dumps({k: float(f"{v:.4g}") for k, v in cost.items()}))
    print("a decoded token by task:", ", ".join(f"{t} {1e6 * c['decode_row_s']:.2f} us"
                                                for t, c in costs.items()))
    rows, marks = [], {}
    for name, ov in VARIANTS.items():
        d = cal[ref] if name == "sync" else train(out, name, ov, steps, a.reuse)
        lengths = (train(out, "longtail sync", LONGTAIL, steps, a.reuse) if "longtail" in name
                   else cal[ref])
        if d is None or lengths is None:
            print(f"{name}: no run in {out}, left out")
            continue
        if task_of(ov) not in costs:
            print(f"{name}: no calibration run of task {task_of(ov)!r} in {out}, left out")
            continue
        if name == "sync":  # train seeds 0 .. repeats - 1 and every calibration seed
            seeds = [d] + [sync_run(out, k, steps, a.reuse)
                           for k in sorted({*range(a.repeats), *a.cal_seeds})
                           if seeded("cal 16x8", k) != ref]
        else:
            seeds = [d] + [train(out, f"{name} seed{k}", [*ov, f"train.seed={k}"], steps,
                                 a.reuse) for k in range(1, a.repeats)]
        each = [measured(x, a.skip) for x in seeds if x is not None]
        p = predicted(ov, costs[task_of(ov)], lengths, steps, a.skip, a.sim_seeds)
        rows.append((name, statistics.fmean(each), p, d))
        marks[name] = step_marks([x for x in seeds if x is not None], a.skip)
        if len(each) > 1:
            print(f"{name}: measured samples/s by seed {', '.join(f'{x:.1f}' for x in each)}, "
                  f"mean {rows[-1][1]:.1f} (sd {statistics.stdev(each):.1f})")
    report(rows, marks, list(resuming.items()), a.skip,
           fitted={"sync", *a.fit_also})  # sync is the run "cal 16x8" itself


def _prompt_tokens(run_dir: Path) -> int:
    """Mean prompt length of the recorded samples."""
    from reroll.sim.lengths import recorded_groups

    pairs = [p for g in recorded_groups(run_dir) for p, _ in g]
    return round(sum(pairs) / len(pairs))


if __name__ == "__main__":
    main()

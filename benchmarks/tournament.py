"""The rollout-method tournament on the reasoning workload (configs/reasoning.toml).

Every row starts from one SFT checkpoint (``--init``, or built with the job's own recipe) and
trains on countdown solved by a written-out search, where responses are long and long-tailed,
so generation is most of a step. A row is reroll with some settings (``ROWS``), TRL's
GRPOTrainer or a minimal hand-written loop with the same hyperparameters
(benchmarks/vs_trl.py). Each run is evaluated (held-out greedy accuracy, the config's
``eval`` section) every ``--eval-every`` steps and when it stops; evaluation time is left
out of its wall time. The start, the same checkpoint for every row, is evaluated once per
invocation (`start_accuracy`) and is every row's step-0 point. Synchronous GRPO (``sync``) runs first in a seed; every other row of
that seed stops at ``--cap`` times sync's training time (TRL and the hand loop included);
under ``--screen`` and ``--quick`` every row also stops at the evaluation that reaches the
target, sync too (its cap is then ``--cap`` times that time). ``--hold 2`` counts the target
as reached only at two evaluations in a row (one noisy evaluation of 200 prompts, standard
error about 3 points, can cross a target a few points over the start and set a seed's cap);
each row records its ``hold`` and no table mixes two.

Per row: training wall time and generated tokens to ``--target`` on the seed-mean curve (and
how many seeds reach it alone), final held-out accuracy (mean and std over seeds), median step
time and its split (generate / train / wait for rollouts, from reroll's own metrics), and
where a method does not pay, the figure that says why (``WHY``: its own counters, averaged
over the run; the bookkeeping is benchmarks/tournament_table.py).

Each run is appended to ``--results`` (JSON lines: row, seed, machine, commit, curve, ...), so
rows can run at different times; ``--table`` prints the markdown table of one protocol's rows
measured on one machine and commit (the latest unless ``--commit``): the full protocol's, or
with ``--screen`` the screen's. README shows one of each (``--readme``).

    python benchmarks/tournament.py --quick --init runs/reasoning/sft   # sync, TRL, stacked
    python benchmarks/tournament.py --screen --rows all --seeds 1        # the screen
    python benchmarks/tournament.py --rows sync,trl,stacked,async2 --seeds 3
    python benchmarks/tournament.py --table --screen
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py
import vs_trl  # benchmarks/vs_trl.py: TRL, the hand loop, the evaluator
from tournament_table import (  # noqa: F401
    PAPER,
    README_BLOCKS,
    README_END,
    README_START,
    REFERENCE,
    RUNNING,
    WHY,
    capping_sync,
    curve_of,
    hold_of,
    limit_of,
    pick,
    protocol_of,
    reach,
    read_rows,
    readme_table,
    recorded,
    replace_block,
    seed_mean,
    sooner,
    summary,
    sync_cap,
    table,
    train_seconds,
    why_of,
)

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "reasoning.toml"
RESULTS = REPO / "benchmarks" / "results" / "tournament.jsonl"

# reroll rows: overrides of configs/reasoning.toml. The per-step budget is the config's
# 8 groups x 8 samples of up to 512 tokens unless the method sets its own sizes.
ROWS: dict[str, list[str]] = {
    "sync": [],
    "async1": ["runtime.max_staleness=1"],
    "async2": ["runtime.max_staleness=2"],
    "async4": ["runtime.max_staleness=4"],
    "april": ["runtime.max_staleness=1", "runtime.overprovision=2",
              "runtime.partial_rollouts=true"],
    "dapo_ds": ["algo.dynamic_sampling=true"],
    # the answer after "#### " is up to 26 characters (three steps of two-digit arithmetic):
    # grace 32 leaves it whole; a sample with no marker by 384 tokens (half the cap) faces
    # the abort draw (the first screen ran grace 4 and no horizon: every answer was cut)
    "duet": ["control.allocator=duet", "control.duet_abort=true", "control.duet_marker=####",
             "control.duet_grace=32", "control.duet_horizon=384"],
    "arrol": ["control.pruner=arrol"],
    "ar3po": ["preset=ar3po"],
    "ar3po_alloc": ["control.allocator=ar3po_stages"],
    "ar3po_reuse": ["replay.reuse=true"],
    "dars": ["preset=dars"],
    "xrpo": ["preset=xrpo"],
    "vade": ["control.selector=vade"],
    "gdro_prompt": ["control.selector=gdro"],
    "gdro_rollout": ["control.allocator=gdro"],
    "dots_rr": ["control.selector=dots", "replay.buffer_size=256"],
    "spec_rl": ["replay.draft=spec_rl"],
    "das": ["replay.draft=das"],
    # the same two where prompts come back: a pool of 64 train prompts is an epoch every 8
    # steps (4,000 are 500), so from step 9 each group has its prompt's last response to
    # draft from; measured against sync GRPO on the same pool (`REFERENCE`)
    "sync_pool": ["task.train_limit=64"],
    "spec_rl_pool": ["replay.draft=spec_rl", "task.train_limit=64"],
    "das_pool": ["replay.draft=das", "task.train_limit=64"],
    "latr": ["rollout.workflow=tree", "rollout.tree_branch=entropy"],
    # TreeRL forks where entropy is high (EPTree); reroll's entropy branching stands in
    "treerl": ["rollout.workflow=tree", "rollout.tree_branch=entropy",
               "rollout.tree_credit=segments"],
    "vcpo4": ["preset=vcpo", "runtime.max_staleness=4"],
    "vcpo8": ["preset=vcpo", "runtime.max_staleness=8"],
    "siri": ["control.length=siri"],
    # DOT at the paper's 3 sigma: in a group of n one response lies at most sqrt(n - 1)
    # population stds above the mean, so groups of 8 can never cut (the screen's run in groups
    # of 8 cut nothing); 4 groups of 16 keep 64 samples a step
    "dot": ["control.dot_k=3", "rollout.group_size=16", "rollout.batch_groups=4"],
    # MC-GRPO's 2 samples plus the pivot; 21 groups of 3 keep ~64 samples a step
    "mc_grpo": ["preset=mc_grpo", "rollout.group_size=3", "rollout.batch_groups=21"],
    "stacked": ["preset=stacked"],
    # stacked without VADE's prompt selection (the preset before VADE joined it): what VADE
    # adds inside the preset
    "stacked_no_vade": ["preset=stacked", "control.selector=uniform"],
}
BASELINES = ("trl", "hand")
TARGET = 0.37  # SFT starts of 31.5% (Zen 4) and 32.5% (Xeon); sync reaches 37% in 20-110 steps
QUICK_TARGET = 0.35
QUICK = ("sync", "trl", "stacked")


def sh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reroll.cli", *args], cwd=REPO, check=True,
                          **kw)


def start_accuracy(init: Path, out: Path, extra: tuple[str, ...] = ()) -> float:
    """Held-out greedy accuracy of ``init``, every row's step-0 point: one checkpoint, one set
    of evaluation settings and greedy decoding for every row, so it is evaluated once (with
    `reroll eval`, as a stopped row's last point is) instead of once per row."""
    path = out / "start.json"
    sh(["eval", str(CONFIG), "--checkpoint", str(init), "--output", str(path),
        f"init={init}", *extra], stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())["eval/greedy_accuracy"]


def run_reroll(init: Path, name: str, seed: int, steps: int, every: int, out: Path,
               target: float, start: float, cap_s: float | None = None,
               cap_x: float | None = None, stop_at_target: bool = False,
               extra: tuple[str, ...] = (), hold: int = 1) -> dict:
    """One reroll row from ``start``, ``init``'s accuracy (`start_accuracy`; the run itself
    does not evaluate step 0: ``eval.at_start = false``): trains until ``steps`` or until
    ``limit_of`` says stop (a SIGINT: reroll checkpoints and exits 130), then evaluates the
    last checkpoint unless that step already was."""
    run = out / f"{name}-seed{seed}"
    cmd = [sys.executable, "-m", "reroll.cli", "train", str(CONFIG), f"out_dir={run}",
           f"init={init}", f"train.steps={steps}", f"eval.every={every}", "log_every=1",
           f"ckpt_every={steps}", "record_every=0", f"train.seed={seed}", "eval.at_start=false",
           *extra, *ROWS[name]]
    log = open(out / f"{name}-seed{seed}.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        time.sleep(2)
        done = read_rows(run / "metrics.jsonl")
        limit = limit_of(curve_of(done, start), target, cap_s, cap_x, stop_at_target, hold)
        if limit is not None and train_seconds(done) >= limit:
            proc.send_signal(signal.SIGINT)
            proc.wait()
    if proc.returncode not in (0, 130):
        raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}); see {log.name}")
    rows = read_rows(run / "metrics.jsonl")
    curve, last = curve_of(rows, start), rows[-1]
    reached = stop_at_target and reach(curve[1:], target, hold) is not None
    if curve[-1][0] != last["step"] and not reached:  # stopped between evaluations: evaluate
        # where it stopped (a run stopped at the target ends at the evaluation that reached it)
        ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
        sh(["eval", str(CONFIG), "--checkpoint", str(ckpt), "--output", str(run / "final.json"),
            f"init={init}", *extra], stdout=subprocess.DEVNULL)
        acc = json.loads((run / "final.json").read_text())["eval/greedy_accuracy"]
        curve.append((last["step"], train_seconds(rows), acc,
                      last.get("pipeline/tokens_generated", curve[-1][3])))
    split = {k: statistics.median(r[k] for r in rows[1:] if k in r) for k in
             ("time/step_s", "time/generate_s", "time/train_s", "time/wait_for_rollouts_s")
             if any(k in r for r in rows[1:])}
    return {"curve": curve, "split": split, "why": why_of(rows), "steps": last["step"]}


def run_baseline(name: str, init: Path, seed: int, steps: int, every: int,
                 cap_s: float | None, start: float, extra: tuple[str, ...] = (),
                 trl_generation: str = vs_trl.TRL_FASTEST,
                 stop_at: float | None = None, hold: int = 1) -> dict:
    """TRL (generating as ``vs_trl.TRL_GENERATION[trl_generation]``) or the hand loop with
    the config's hyperparameters from ``start``, ``init``'s accuracy (`start_accuracy`), in
    this process, on one torch thread, stopped at ``cap_s`` or at an evaluation that
    reaches ``stop_at`` (vs_trl.py's default:
    TRL's static-cache step at 2 threads took over 6.5 minutes on the busy 2-core box, 77-154 s
    at 1; benchmarks/docs/vs_trl.md)."""
    import torch

    from reroll import build
    from reroll.config_checks import load_checked

    cfg = load_checked(str(CONFIG), [f"init={init}", *extra])
    model_dir = build.weights_dir(init)
    tok = build.load_tokenizer(model_dir)
    task = build.build_task(cfg)
    hp = vs_trl.Hyper(CONFIG, prompts=cfg.rollout.batch_groups, samples=cfg.rollout.group_size,
                      max_new=cfg.rollout.max_new_tokens, lr=cfg.train.lr,
                      clip=cfg.algo.surrogate_args.get("clip_low", 0.2))
    ev = vs_trl.Evaluator(cfg, tok, task)
    torch.set_num_threads(1)
    if name == "trl":  # TRL at its fastest setting here (vs_trl.TRL_FASTEST)
        times, curve = vs_trl.run_trl(model_dir, tok, task, ev, steps, every, seed, hp=hp,
                                      cap_s=cap_s, generation=trl_generation, start=start,
                                      stop_at=stop_at, hold=hold)
    else:
        times, curve = vs_trl.run_hand(model_dir, tok, task, ev, steps, every, seed, hp=hp,
                                       cap_s=cap_s, start=start, stop_at=stop_at, hold=hold)
    return {"curve": [(s, t, acc, None) for s, t, acc in curve],
            "split": {"time/step_s": statistics.median(times)}, "why": {}, "steps": len(times)}


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()


def workload_line(init: Path) -> str:
    """The workload's numbers from the SFT checkpoint's length statistics and sync's split."""
    stats = init.parent / "lengths_sft.json"
    if not stats.exists():
        return "workload: (no lengths_sft.json beside the checkpoint: run scripts/reasoning.sh)"
    st = json.loads(stats.read_text())
    return f"workload: median length {st['median']:.0f}, p95/median {st['p95_over_median']:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", type=Path, default=None, help="the SFT run dir to start from")
    ap.add_argument("--rows", default=",".join(QUICK), help="comma-separated, or 'all'")
    ap.add_argument("--quick", action="store_true", help="1 seed of sync, trl and stacked")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400, help="the most steps of any run")
    ap.add_argument("--eval-every", type=int, default=None, help="default 10 (--quick 5)")
    ap.add_argument("--baseline-eval-every", type=int, default=None,
                    help="TRL's and the hand loop's evaluation interval (default: "
                         "--eval-every); finer can only bring their time to the target forward")
    ap.add_argument("--target", type=float, default=None,
                    help="held-out greedy accuracy to reach; default 0.37 (--quick 0.35)")
    ap.add_argument("--cap", type=float, default=None, help="every run stops at this "
                    "multiple of sync's time to the target; default 2 (--quick 1.5)")
    ap.add_argument("--hold", type=int, default=None,
                    help="the target counts as reached only at this many evaluations in a "
                         "row (default 1; 2 keeps one noisy evaluation from reaching it, and "
                         "from setting a seed's cap); recorded with each row, and a table "
                         "never mixes rows of two values (--table: the last row's unless "
                         "given)")
    ap.add_argument("--screen", action="store_true",
                    help="each reroll row stops when it reaches the target (time to it only)")
    ap.add_argument("--eval-examples", type=int, default=None,
                    help="held-out prompts per evaluation (default: the config's 200)")
    ap.add_argument("--sync-from-results", action="store_true",
                    help="where --sync-results holds a sync run of the seed on this machine "
                         "and commit with the same start, target, protocol and evaluation "
                         "settings, cap the seed's rows by it instead of running sync again "
                         "(at --cap 1 a screen run stands for the full protocol's: both stop "
                         "at the evaluation that reaches the target); needs --init, the "
                         "start the recorded runs name")
    ap.add_argument("--sync-results", type=Path, default=None,
                    help="the file --sync-from-results reads (default: --results); a sync "
                         "run taken from another file is copied into --results")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--table", action="store_true",
                    help="print the table of one protocol's rows and stop: the full "
                         "protocol's at --cap, or with --screen (--quick) the screen's "
                         "(the quick run's)")
    ap.add_argument("--commit", default=None,
                    help="--table: rows of this commit (default: the last row's of the protocol)")
    ap.add_argument("--readme", action="store_true",
                    help="--table: write the compact table into README.md between its "
                         "protocol's markers")
    a = ap.parse_args()
    if a.hold is not None and a.hold < 1:
        raise SystemExit(f"--hold {a.hold}: at least 1 evaluation")
    asked = a.target  # --table: the rows' own target unless one is asked for
    a.target = a.target if a.target is not None else (QUICK_TARGET if a.quick else TARGET)
    a.eval_every = a.eval_every or (5 if a.quick else 10)
    a.cap = a.cap or (1.5 if a.quick else 2.0)
    a.baseline_eval_every = a.baseline_eval_every or a.eval_every
    extra = (f"eval.n_examples={a.eval_examples}",) if a.eval_examples else ()
    here = {"machine": machine.cpu(), "commit": commit()}
    hold = a.hold or 1  # a run's (--table: the rows' own unless given)
    if a.table:
        protocol = "quick" if a.quick else "screen" if a.screen else "full"
        rows = pick(read_rows(a.results), protocol=protocol, cap=a.cap, commit=a.commit,
                    target=asked, hold=a.hold)
        if not rows:
            print(f"no results of the {protocol} protocol at cap {a.cap:g} in {a.results}")
            return
        target = rows[-1]["target"]
        print(f"{rows[-1]['machine']}, commit {rows[-1]['commit']}, {protocol} protocol, "
              f"cap {a.cap:g}, target held at {hold_of(rows[-1])} evaluation(s) in a row\n")
        print(table(rows, target))
        if a.readme:
            if protocol not in README_BLOCKS or a.cap != 2.0 or \
                    a.results.resolve() != RESULTS.resolve():
                raise SystemExit(f"--readme: README's tables are the full protocol's and the "
                                 f"screen's at cap 2 from {RESULTS} (the command their "
                                 "markers name); this table is not one of them")
            readme = REPO / "README.md"
            readme.write_text(replace_block(readme.read_text(), readme_table(
                rows, target, rows[-1]["machine"], rows[-1]["commit"], protocol), protocol))
            print(f"wrote the {protocol} protocol's table into {readme}")
        return
    names = list(QUICK) if a.quick else (
        [*BASELINES, *ROWS] if a.rows == "all" else a.rows.split(","))
    unknown = [n for n in names if n not in ROWS and n not in BASELINES]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; known: {', '.join([*BASELINES, *ROWS])}")
    names = ["sync"] + [n for n in names if n != "sync"]  # sync first: it sets the cap
    if a.sync_from_results and a.init is None:
        raise SystemExit("--sync-from-results needs --init: the recorded sync runs are "
                         "matched by the start checkpoint they name")
    out = Path(tempfile.mkdtemp(prefix="reroll-tournament-"))
    init = a.init
    if init is None:
        init = out / "sft"
        sh(["sft", str(CONFIG), f"out_dir={init}"])
    a.results.parent.mkdir(parents=True, exist_ok=True)
    start = start_accuracy(init, out, extra)  # every row's step 0 (the same checkpoint)
    print(f"start ({init}): held-out greedy accuracy {start:.3f}", flush=True)
    mine: list[dict] = []
    for seed in range(a.seed, a.seed + a.seeds):
        cap = None
        if a.sync_from_results:
            src = a.sync_results or a.results
            same = dict(**here, init=str(init), target=a.target, quick=a.quick,
                        extra=list(extra), eval_every=a.eval_every, hold=hold)
            rec = capping_sync(read_rows(src), seed, a.cap, a.screen, a.steps, **same)
            if rec is not None:
                mine.append(rec)
                cap = sync_cap(rec, a.cap)
                if rec not in read_rows(a.results):  # copied once, beside the new rows
                    with open(a.results, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                print(f"sync seed {seed}: recorded in {src}; cap {cap:.0f} s",
                      flush=True)
        for name in names:
            if name == "sync" and cap is not None:
                continue  # recorded
            t0 = time.perf_counter()
            if name in BASELINES:
                r = run_baseline(name, init, seed, a.steps, a.baseline_eval_every, cap, start,
                                 extra, stop_at=a.target if a.screen or a.quick else None,
                                 hold=hold)
            else:  # sync runs to cap x its own time to the target, the rest to cap x that
                r = run_reroll(init, name, seed, a.steps, a.eval_every, out, a.target, start,
                               cap_s=cap, cap_x=a.cap if name == "sync" else None,
                               stop_at_target=a.screen or a.quick,
                               extra=extra, hold=hold)
            rec = {"row": name, "seed": seed, **here, "init": str(init), "target": a.target,
                   "hold": hold,
                   "screen": a.screen, "quick": a.quick, "cap": a.cap, "max_steps": a.steps,
                   "extra": list(extra),
                   "eval_every": a.baseline_eval_every if name in BASELINES else a.eval_every,
                   "load": os.getloadavg()[0], **r}
            mine.append(rec)
            if name == "sync":
                cap = sync_cap(rec, a.cap)
            with open(a.results, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"{name} seed {seed}: {r['steps']} steps, final {r['curve'][-1][2]:.3f}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(table(mine, a.target))
    s = {n: summary([r for r in mine if r["row"] == n], a.target) for n in names}
    sp = s["sync"]["split"]
    share = sp.get("time/generate_s", 0) / sp["time/step_s"] if sp.get("time/step_s") else 0
    print(machine.describe())
    print(f"{workload_line(init)}, generation share {share:.0%}")
    if "stacked" in s and "trl" in s:
        print(f"stacked vs trl: {sooner(s['stacked'], s['trl'])} sooner; "
              f"stacked vs sync: {sooner(s['stacked'], s['sync'])} sooner")


if __name__ == "__main__":
    main()

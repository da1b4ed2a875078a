"""The rollout-method tournament on the reasoning workload (configs/reasoning.toml).

Every row starts from one SFT checkpoint (``--init``, or built with the job's own recipe) and
trains on countdown solved by a written-out search, where responses are long and long-tailed,
so generation is most of a step. A row is reroll with some settings (``ROWS``), TRL's
GRPOTrainer or a minimal hand-written loop with the same hyperparameters
(benchmarks/vs_trl.py). Each run is evaluated (held-out greedy accuracy, the config's
``eval`` section) every ``--eval-every`` steps and when it stops; evaluation time is left
out of its wall time. Synchronous GRPO (``sync``) runs first in a seed; every other row of
that seed stops at ``--cap`` times sync's training time (TRL and the hand loop included).

Per row: training wall time and generated tokens to ``--target`` on the seed-mean curve (and
how many seeds reach it alone), final held-out accuracy (mean and std over seeds), median step
time and its split (generate / train / wait for rollouts, from reroll's own metrics), and
where a method does not pay, the figure that says why (``WHY``: its own counters, averaged
over the run).

Each run is appended to ``--results`` (JSON lines: row, seed, machine, commit, curve, ...), so
rows can run at different times; ``--table`` prints the markdown table of the rows measured on
one machine and commit (the latest unless ``--commit``), the one README shows.

    python benchmarks/tournament.py --quick --init runs/reasoning/sft   # sync, TRL, stacked
    python benchmarks/tournament.py --rows all --seeds 1                 # the screen
    python benchmarks/tournament.py --rows sync,trl,stacked,async2 --seeds 3
    python benchmarks/tournament.py --table
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
}
# each method's own headline claim, as its paper states it (their models, tasks and
# hardware, not this workload's), printed beside the row; reroll's own rows have none
PAPER = {
    **dict.fromkeys(("async1", "async2", "async4"),
                    "AReaL: up to 2.77x sooner end to end than synchronous, same accuracy"),
    "april": "APRIL: rollout throughput +22.5% on average (up to +44%)",
    "dapo_ds": "DAPO (whole recipe): 50 on AIME24 in half the steps of R1-Zero-Qwen-32B",
    "duet": "DUET: 1.62x wall clock over full-budget GRPO, higher accuracy",
    "arrol": "ARRoL: up to 1.7x training speed-up, +2.3 to +3.0 accuracy",
    **dict.fromkeys(("ar3po", "ar3po_alloc", "ar3po_reuse"),
                    "AR3PO: DAPO's accuracy at up to 4.2x lower rollout cost"),
    "dars": "DARS: Pass@K gains at no extra inference cost at convergence",
    "xrpo": "XRPO: up to 2.7x faster convergence, up to +4% pass@1",
    "vade": "VADE: better accuracy and sample efficiency than filtering baselines",
    "gdro_prompt": "Prompt-GDRO: +10.6% relative pass@8 over GRPO",
    "gdro_rollout": "Rollout-GDRO: +10.1% relative pass@8 over GRPO",
    "dots_rr": "DOTS+RR: GRPO's accuracy in 23-62% less RL time",
    "spec_rl": "SPEC-RL: 2-3x shorter rollout time, no accuracy lost",
    "das": "DAS: rollout time up to 50% lower, identical training curves",
    "latr": "LATR: policy learning 131% faster on average, +4.2% pass@1",
    "treerl": "TreeRL: above independent-chain RL at the same token budget (no single figure)",
    **dict.fromkeys(("vcpo4", "vcpo8"),
                    "VCPO: lag-2 async reaches sync's best AIME-25 accuracy 2.5x sooner"),
    "siri": "SIRI: AIME24 +43.2% with 46.9% fewer tokens (1.5B, three cycles)",
    "dot": "DOT: 78% fewer tokens on AIME24, accuracy above the starting policy",
    "mc_grpo": "MC-GRPO: 2 samples a prompt within 1% of 8's accuracy",
}
BASELINES = ("trl", "hand")
TARGET = 0.37  # the SFT start is 31.5%; sync GRPO reached 37% near step 50 (about 10 minutes)
QUICK_TARGET = 0.35
QUICK = ("sync", "trl", "stacked")
# the figures that say why a method pays or not: per-step values, averaged over a run's
# logged steps, and running totals (the pipeline's and the drafter's counters), given as
# their increase a step; a drafter's acceptance is its accepted over proposed tokens
WHY = ("prune/pruned_frac", "pipeline/samples_in_batch", "offpol/ess", "length/mean",
       "length/clipped_share", "control/arrol_pruned", "control/arrol_tokens_saved_est",
       "arrol/head_s", "staleness/mean_lag", "shaping/shaped_share")
RUNNING = ("pipeline/started", "pipeline/dropped_zero_variance", "draft/samples_drafted",
           "draft/tokens_proposed", "draft/tokens_accepted")


def sh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reroll.cli", *args], cwd=REPO, check=True,
                          **kw)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def train_seconds(rows: list[dict]) -> float:
    """Training wall time so far: the clock between the first and last row, evaluation out."""
    if len(rows) < 2:
        return 0.0
    return rows[-1]["time"] - rows[0]["time"] - sum(r.get("time/eval_s", 0.0) for r in rows[1:])


def curve_of(rows: list[dict]) -> list[tuple]:
    """(step, training seconds, held-out accuracy, tokens generated) at each evaluation."""
    if not rows:
        return []
    start, evals, tokens = rows[0]["time"], 0.0, 0
    curve = [(0, 0.0, rows[0]["eval/greedy_accuracy"], 0)]
    for r in rows[1:]:
        evals += r.get("time/eval_s", 0.0)
        tokens = r.get("pipeline/tokens_generated", tokens)  # a running total
        if "eval/greedy_accuracy" in r:
            curve.append((r["step"], r["time"] - start - evals, r["eval/greedy_accuracy"],
                          tokens))
    return curve


def limit_of(curve: list[tuple], target: float, cap_s: float | None, cap_x: float | None,
             stop_at_target: bool) -> float | None:
    """Training seconds at which a run stops: ``cap_s`` if given (a row capped at a multiple
    of sync's time); else ``cap_x`` times its own time to ``target`` once it gets there
    (sync); the time it reaches ``target`` when ``stop_at_target`` (the screen)."""
    hit = reach(curve[1:], target)
    if stop_at_target and hit is not None:
        return hit[1]
    if cap_s is not None:
        return cap_s
    return cap_x * hit[1] if cap_x is not None and hit is not None else None


def run_reroll(init: Path, name: str, seed: int, steps: int, every: int, out: Path,
               target: float, cap_s: float | None = None, cap_x: float | None = None,
               stop_at_target: bool = False, extra: tuple[str, ...] = ()) -> dict:
    """One reroll row: trains until ``steps`` or until ``limit_of`` says stop (a SIGINT:
    reroll checkpoints and exits 130), then evaluates the last checkpoint unless that step
    already was."""
    run = out / f"{name}-seed{seed}"
    cmd = [sys.executable, "-m", "reroll.cli", "train", str(CONFIG), f"out_dir={run}",
           f"init={init}", f"train.steps={steps}", f"eval.every={every}", "log_every=1",
           f"ckpt_every={steps}", "record_every=0", f"train.seed={seed}", *extra, *ROWS[name]]
    log = open(out / f"{name}-seed{seed}.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        time.sleep(2)
        done = read_rows(run / "metrics.jsonl")
        limit = limit_of(curve_of(done), target, cap_s, cap_x, stop_at_target)
        if limit is not None and train_seconds(done) >= limit:
            proc.send_signal(signal.SIGINT)
            proc.wait()
    if proc.returncode not in (0, 130):
        raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}); see {log.name}")
    rows = read_rows(run / "metrics.jsonl")
    curve, last = curve_of(rows), rows[-1]
    if curve[-1][0] != last["step"]:  # stopped between evaluations: evaluate where it stopped
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


def why_of(rows: list[dict]) -> dict[str, float]:
    """``WHY``'s per-step means and ``RUNNING``'s increase a step (from 0 before the first
    step) over the step rows of a run's metrics (row 0 is the start), and the drafter's
    acceptance where it proposed any token."""
    steps = rows[1:]
    out = {k: statistics.fmean(r[k] for r in steps if k in r) for k in WHY
           if any(k in r for r in steps)}
    total = {}
    for k in RUNNING:
        seen = [r for r in steps if k in r]
        if seen:
            total[k] = seen[-1][k]
            out[k + " a step"] = total[k] / len(seen)
    if total.get("draft/tokens_proposed"):
        out["draft/acceptance"] = total["draft/tokens_accepted"] / total["draft/tokens_proposed"]
    return out


def run_baseline(name: str, init: Path, seed: int, steps: int, every: int,
                 cap_s: float | None, extra: tuple[str, ...] = (),
                 trl_generation: str = vs_trl.TRL_FASTEST) -> dict:
    """TRL (generating as ``vs_trl.TRL_GENERATION[trl_generation]``) or the hand loop with
    the config's hyperparameters, in this process, on one torch thread (vs_trl.py's default:
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
                                      cap_s=cap_s, generation=trl_generation)
    else:
        times, curve = vs_trl.run_hand(model_dir, tok, task, ev, steps, every, seed, hp=hp,
                                       cap_s=cap_s)
    return {"curve": [(s, t, acc, None) for s, t, acc in curve],
            "split": {"time/step_s": statistics.median(times)}, "why": {}, "steps": len(times)}


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()


def seed_mean(curves: list[list]) -> list[tuple]:
    """At each evaluation index every seed has: mean step, training seconds, accuracy, tokens."""
    n = min(len(c) for c in curves)
    return [tuple(statistics.fmean(c[i][j] for c in curves) if curves[0][i][j] is not None
                  else None for j in range(4)) for i in range(n)]


def reach(curve: list[tuple], target: float) -> tuple | None:
    return next((p for p in curve if p[2] >= target), None)


def summary(runs: list[dict], target: float) -> dict:
    """Over a row's seeds: time and tokens to ``target`` on the seed-mean curve when every
    seed was evaluated at the same steps (the full protocol); when they stopped at different
    steps (the screen and --quick stop a row at the target), the mean of the seeds' own
    times to it, given only when every seed reached it."""
    curves = [r["curve"] for r in runs]
    seeds_hits = [reach(c[1:], target) for c in curves]
    if all([p[0] for p in c] == [p[0] for p in curves[0]] for c in curves):
        hit = reach(seed_mean(curves)[1:], target)
    elif all(seeds_hits):
        hit = tuple(statistics.fmean(h[j] for h in seeds_hits) if seeds_hits[0][j] is not None
                    else None for j in range(4))
    else:
        hit = None
    finals = [r["curve"][-1][2] for r in runs]
    return {"seeds": len(runs), "time_s": hit[1] if hit else None,
            "tokens": hit[3] if hit else None,
            "cap_s": max(r["curve"][-1][1] for r in runs),
            "seeds_reaching": sum(h is not None for h in seeds_hits),
            "seed_times": [h[1] if h else None for h in seeds_hits],
            "final": statistics.fmean(finals),
            "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "split": {k: statistics.fmean(r["split"][k] for r in runs)
                      for k in runs[0]["split"]},
            "why": {k: statistics.fmean(r["why"].get(k, 0.0) for r in runs)
                    for k in runs[0]["why"]}}


def sooner(a: dict, b: dict) -> str:
    """How many times sooner a reaches the target than b; a bound where b never does."""
    if a["time_s"] is None:
        return "not reached"
    if b["time_s"] is None:
        return f"x>{b['cap_s'] / a['time_s']:.2f}"
    return f"x{b['time_s'] / a['time_s']:.2f}"


def table(results: list[dict], target: float) -> str:
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["row"], []).append(r)
    s = {name: summary(rs, target) for name, rs in by.items()}
    lines = [f"| row | seeds | to {target:.0%} (s) | tokens to it | seeds reaching | final "
             "(± std) | step s (gen / train / wait) | vs sync | why | paper's headline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, x in s.items():
        sp = x["split"]
        split = f"{sp.get('time/step_s', 0):.1f}"
        if "time/generate_s" in sp:
            split += (f" ({sp['time/generate_s']:.1f} / {sp.get('time/train_s', 0):.1f} / "
                      f"{sp.get('time/wait_for_rollouts_s', 0):.1f})")
        why = ", ".join(f"{k} {v:.3g}" for k, v in x["why"].items())
        t = f"{x['time_s']:.0f}" if x["time_s"] is not None else f"not by {x['cap_s']:.0f}"
        if x["seeds"] > 1:  # each seed's own time to the target
            t += " (" + ", ".join("-" if v is None else f"{v:.0f}" for v in x["seed_times"]) + ")"
        tok = f"{x['tokens']:.0f}" if x["tokens"] is not None else "-"
        vs = sooner(x, s["sync"]) if "sync" in s and name != "sync" else ""
        lines.append(f"| {name} | {x['seeds']} | {t} | {tok} | {x['seeds_reaching']} | "
                     f"{x['final']:.3f} ± {x['final_std']:.3f} | {split} | {vs} | {why} | "
                     f"{PAPER.get(name, '')} |")
    return "\n".join(lines)


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
    ap.add_argument("--target", type=float, default=None,
                    help="held-out greedy accuracy to reach; default 0.37 (--quick 0.35)")
    ap.add_argument("--cap", type=float, default=None, help="every run stops at this "
                    "multiple of sync's time to the target; default 2 (--quick 1.5)")
    ap.add_argument("--screen", action="store_true",
                    help="each reroll row stops when it reaches the target (time to it only)")
    ap.add_argument("--eval-examples", type=int, default=None,
                    help="held-out prompts per evaluation (default: the config's 200)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--table", action="store_true", help="print the table and stop")
    ap.add_argument("--commit", default=None, help="--table: rows of this commit")
    a = ap.parse_args()
    a.target = a.target if a.target is not None else (QUICK_TARGET if a.quick else TARGET)
    a.eval_every = a.eval_every or (5 if a.quick else 10)
    a.cap = a.cap or (1.5 if a.quick else 2.0)
    extra = (f"eval.n_examples={a.eval_examples}",) if a.eval_examples else ()
    here = {"machine": machine.cpu(), "commit": commit()}
    if a.table:
        rows = read_rows(a.results)
        pick = a.commit or (rows[-1]["commit"] if rows else None)
        rows = [r for r in rows if r["commit"] == pick and r["machine"] == rows[-1]["machine"]]
        print(f"{rows[-1]['machine']}, commit {pick}\n" if rows else "no results")
        print(table(rows, a.target) if rows else "")
        return
    names = list(QUICK) if a.quick else (
        [*BASELINES, *ROWS] if a.rows == "all" else a.rows.split(","))
    unknown = [n for n in names if n not in ROWS and n not in BASELINES]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; known: {', '.join([*BASELINES, *ROWS])}")
    names = ["sync"] + [n for n in names if n != "sync"]  # sync first: it sets the cap
    out = Path(tempfile.mkdtemp(prefix="reroll-tournament-"))
    init = a.init
    if init is None:
        init = out / "sft"
        sh(["sft", str(CONFIG), f"out_dir={init}"])
    a.results.parent.mkdir(parents=True, exist_ok=True)
    mine: list[dict] = []
    for seed in range(a.seed, a.seed + a.seeds):
        cap = None
        for name in names:
            t0 = time.perf_counter()
            if name in BASELINES:
                r = run_baseline(name, init, seed, a.steps, a.eval_every, cap, extra)
            else:  # sync runs to cap x its own time to the target, the rest to cap x that
                r = run_reroll(init, name, seed, a.steps, a.eval_every, out, a.target,
                               cap_s=cap, cap_x=a.cap if name == "sync" else None,
                               stop_at_target=a.screen or a.quick,
                               extra=extra)
            if name == "sync":
                hit = reach(r["curve"][1:], a.target)
                cap = a.cap * (hit[1] if hit else r["curve"][-1][1])
            rec = {"row": name, "seed": seed, **here, "init": str(init), "target": a.target,
                   "screen": a.screen, "quick": a.quick, "extra": list(extra),
                   "load": os.getloadavg()[0], **r}
            mine.append(rec)
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

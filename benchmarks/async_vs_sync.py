"""Asynchronous RL (bounded staleness, partial rollouts, over-provisioning) against
synchronous RL (``runtime.max_staleness = 0``), same model, task, seed and number of steps.

Workload: the ``longtail`` task (repeat a letter ``count`` times; counts follow a capped
Pareto law, so most responses are 3-5 tokens and about 6% run to the 31-token cap), a
0.4M-parameter Qwen2 warm-started once by SFT to about 54% held-out accuracy (room for RL
to raise it); every variant starts from that checkpoint.
4 groups x 8 samples per step: at 16 x 8 this tiny model's train step is 3x its generation
(a trainer-bound run where overlap can hide little; try ``--set rollout.batch_groups=16``),
while real LLM RL is generation-bound.
Training goes through ``reroll.runtime.train``, unchanged. Held-out greedy accuracy is measured
after each run on the checkpoints it saved every ``--eval-every`` steps, so evaluation never
runs inside the timed loop (where the generation thread would keep working during it).

Reported per variant: trajectories/s and trained tokens/s over the summed loop step time,
the ratio to the synchronous run, mean engine occupancy and rows per decode step, the
trainer's wait vs train share, the generation thread's busy share, the share of trained
tokens one or more versions old, the stale drops, and accuracy against wall time (a plot).
A model of separate generation and training devices is printed beside the measurements,
computed from the synchronous run's own per-step generation and training seconds.

    .venv/bin/python benchmarks/async_vs_sync.py [--quick] [--steps N] [--out DIR]
        [--set KEY=VALUE ...] [--variants "async s=2,async s=4"]

``--quick``: 300 steps per variant, nine runs; the default: 600 steps, twelve runs.
Time to accuracy: the wall time at which each variant's accuracy curve, smoothed over three
consecutive evaluations, first reaches the synchronous run's own final smoothed accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import threading
import time
from pathlib import Path

from reroll import build, build_rollout
from reroll.config import load_config
from reroll.config_checks import load_checked
from reroll.runlog import read_metrics
from reroll.runtime import train
from reroll.trainer.evaluate import evaluate, plan
from reroll.trainer.sft import save_model, sft

BASE = ["task.name=longtail", "task.seed=0", "task.args.n_train=4000", "task.args.n_test=1000",
        "task.args.max_count=31", "model.max_position=64", "rollout.max_new_tokens=32",
        "rollout.group_size=8", "rollout.batch_groups=4", "rollout.temperature=1.0",
        "train.lr=1e-4", "train.seed=0", "reward.workers=0", "runtime.threads=2",
        "eval.k=1", "eval.n_examples=1000", "log_every=1"]
SFT_STEPS = 60  # constant lr 1e-3: 54% greedy, so RL has room to raise it (73% at 200 sync steps)

# name -> config overrides on top of BASE (sync: max_staleness 0, the loop's default)
VARIANTS = {
    "sync": [],
    "async s=1": ["runtime.max_staleness=1"],
    "async s=2": ["runtime.max_staleness=2"],
    "async s=4": ["runtime.max_staleness=4"],
    "async s=2 no-partial": ["runtime.max_staleness=2", "runtime.partial_rollouts=false"],
    "async s=2 op=2": ["runtime.max_staleness=2", "runtime.overprovision=2.0"],
    "async s=2 1-thread": ["runtime.max_staleness=2", "runtime.threads=1"],
    "sync 1-thread": ["runtime.threads=1"],
    "sync (repeat)": [],  # the same as "sync", run last: how far the machine drifted
}
FULL_ONLY = {"async s=4 op=2": ["runtime.max_staleness=4", "runtime.overprovision=2.0"],
             "sync op=2": ["runtime.overprovision=2.0"]}


def engine_slots(cfg) -> int:
    """KV slots of the engine, as `reroll.build.build_engine` sizes them (for rows/step)."""
    n = cfg.rollout.batch_groups * cfg.rollout.group_size
    return max(8, int(n * cfg.runtime.overprovision) * (1 + min(cfg.runtime.max_staleness, 1)))


def warm_start(out: Path, base: list[str]) -> Path:
    """SFT the tiny model once; returns the directory every variant starts from."""
    target = out / "sft"
    if (target / "model" / "config.json").is_file():
        return target
    cfg = load_checked(None, base)
    build.prepare_process(cfg)
    model, tok = build.load_model(build.model_dir(cfg, out / "base"), cfg)
    sft(model, tok, build.build_task(cfg).train, build_rollout.encode_prompt(tok), steps=SFT_STEPS,
        lr=1e-3, batch_size=128, seed=0, schedule="constant", warmup_steps=20)
    save_model(model, tok, target / "model")
    return target


class CheckpointCopier:
    """Copies each checkpoint's weights as it appears (the run keeps only the last two), so
    that held-out accuracy can be measured after the run, outside the timed loop. Costs a
    directory listing every 50 ms and a 2 MB copy per checkpoint."""

    def __init__(self, run: Path, dest: Path):
        self.run, self.dest, self.stop = run, dest, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            done = self.stop.is_set()
            for ck in sorted((self.run / "checkpoints").glob("step_*")):
                target = self.dest / ck.name
                if not target.exists() and (ck / "model").is_dir():
                    shutil.copytree(ck / "model", self.dest / f".{ck.name}")
                    (self.dest / f".{ck.name}").rename(target)
            if done:
                return
            time.sleep(0.05)

    def __enter__(self) -> CheckpointCopier:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run_variant(out: Path, name: str, overrides: list[str], init: Path, steps: int,
                every: int, base: list[str]) -> Path:
    run = out / "runs" / name.replace(" ", "_").replace("=", "").replace("(", "").replace(")", "")
    for d in (run, run.with_name(run.name + ".weights")):
        shutil.rmtree(d, ignore_errors=True)
    cfg = load_config(None, base + [f"out_dir={run}", f"init={init}", f"train.steps={steps}",
                                    f"ckpt_every={every}", "eval.every=0", *overrides])  # train checks it
    with CheckpointCopier(run, run.with_name(run.name + ".weights")):
        train(cfg, progress=False)
    return run, engine_slots(cfg)


def held_out_curve(run: Path, acc0: float, base: list[str]) -> list[tuple[float, float]]:
    """(wall seconds of loop steps so far, greedy accuracy) at step 0 and every checkpoint."""
    rows = read_metrics(run)
    cfg = load_checked(None, base)
    task = build.build_task(cfg)
    scorer = build_rollout.build_scorer(cfg, task)
    wall, points = 0.0, [(0.0, acc0)]
    try:
        for r in rows:
            wall += r["time/step_s"]
            ck = run.with_name(run.name + ".weights") / f"step_{r['step']:06d}"
            if ck.is_dir():
                model, tok = build.load_model(ck, cfg)
                m = evaluate(model, tok, task.test, scorer, build_rollout.encode_prompt(tok),
                             plan(cfg, tok), k=1)
                points.append((wall, m["eval/greedy_accuracy"]))
    finally:
        scorer.close()
    return points


def initial_accuracy(init: Path, base: list[str]) -> float:
    cfg = load_checked(None, base)
    task = build.build_task(cfg)
    scorer = build_rollout.build_scorer(cfg, task)
    try:
        model, tok = build.load_model(init / "model", cfg)
        return evaluate(model, tok, task.test, scorer, build_rollout.encode_prompt(tok),
                        plan(cfg, tok), k=1)["eval/greedy_accuracy"]
    finally:
        scorer.close()


def summarise(rows: list[dict], group_size: int, batch_groups: int, slots: int) -> dict:
    """Throughput and where the time went, over all steps of one run."""
    wall = sum(r["time/step_s"] for r in rows)
    n_traj = group_size * batch_groups * len(rows)
    tokens = sum(r["length/mean"] * group_size * batch_groups for r in rows)
    lag0 = [r.get("staleness/token_share_lag0", 1.0) for r in rows]
    last = rows[-1]
    return {
        "steps": len(rows), "wall_s": wall,
        "traj_per_s": n_traj / wall, "tok_per_s": tokens / wall,
        "wait_share": sum(r["time/wait_for_rollouts_s"] for r in rows) / wall,
        "train_share": sum(r["time/train_s"] for r in rows) / wall,
        "gen_busy_share": sum(r["time/generate_s"] for r in rows) / wall,
        "occupancy": last["engine/occupancy"],
        "rows_per_decode": last["engine/occupancy"] * slots,
        "step_s_median": sorted(r["time/step_s"] for r in rows)[len(rows) // 2],
        "stale_token_share": 1.0 - sum(lag0) / len(lag0),
        "mean_lag": sum(r.get("staleness/mean_lag", 0.0) for r in rows) / len(rows),
        "resumed_share": sum(r["pipeline/resumed_share"] for r in rows) / len(rows),
        "dropped_stale": last.get("pipeline/dropped_stale", 0),
        "reward_last5": sum(r["reward/mean"] for r in rows[-5:]) / len(rows[-5:]),
        "len_mean": sum(r["length/mean"] for r in rows) / len(rows),
        "len_max": max(r["length/max"] for r in rows),
    }


def separate_devices_model(rows: list[dict]) -> dict:
    """MODEL, not a measurement: the synchronous run's own per-step seconds put on two
    devices. In the sync run the trainer waits for the whole batch (engine busy + scoring and
    hand-off), then trains, then publishes (the rest). Sync step = wait + train + rest; with
    generation on its own device and one step of overlap, step = max(wait, train) + rest."""
    wait = [r["time/wait_for_rollouts_s"] for r in rows]
    trn = [r["time/train_s"] for r in rows]
    gen = [min(r["time/generate_s"], w) for r, w in zip(rows, wait, strict=True)]
    rest = [r["time/step_s"] - w - t for r, w, t in zip(rows, wait, trn, strict=True)]
    sync = sum(w + t + x for w, t, x in zip(wait, trn, rest, strict=True))
    overlap = sum(max(w, t) + x for w, t, x in zip(wait, trn, rest, strict=True))
    n = len(rows)
    return {"wait_s_per_step": sum(wait) / n, "engine_s_per_step": sum(gen) / n,
            "train_s_per_step": sum(trn) / n, "rest_s_per_step": sum(rest) / n,
            "speedup": sync / overlap}


def smooth(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each evaluation averaged with its neighbours (window 3, shorter at the ends): one
    evaluation on 1,000 prompts at 60% has a binomial standard error of 1.5 points."""
    out = []
    for i, (t, _) in enumerate(points):
        w = [a for _, a in points[max(0, i - 1): i + 2]]
        out.append((t, sum(w) / len(w)))
    return out


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Seeds evaluated at the same steps: mean wall time and mean accuracy per step."""
    n = len(curves)
    return [(sum(c[i][0] for c in curves) / n, sum(c[i][1] for c in curves) / n)
            for i in range(min(len(c) for c in curves))]


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """Wall time at which the smoothed curve first reaches `target`."""
    return next((t for t, a in smooth(points) if a >= target - 1e-9), None)


def plot(curves: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, pts in curves.items():
        ax.plot([t for t, _ in pts], [a for _, a in pts], marker="o", ms=3, label=name)
    if "sync" in curves:  # the time-to-accuracy target
        ax.axhline(smooth(curves["sync"])[-1][1], color="gray", ls="--", lw=0.8,
                   label="sync final accuracy (smoothed)")
    ax.set_xlabel("wall-clock seconds of training steps (2-core CPU)")
    ax.set_ylabel("held-out greedy accuracy (longtail)")
    ax.set_title("reroll: async vs sync RL, same steps, same start")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(results: dict, curves: dict, target: float) -> str:
    base = results["sync"]
    head = ("| variant | traj/s | tok/s | ratio | median step | occupancy (rows/decode) "
            "| trainer wait | train | engine busy | stale tokens | resumed | dropped stale "
            f"| final acc | mean acc, 2nd half | t to acc>={target:.3f} |")
    lines = [head, "|" + "---|" * 15]
    for name, m in results.items():
        t = time_to(curves[name], target)
        half = [a for _, a in curves[name][1:]][len(curves[name][1:]) // 2:]
        lines.append(
            f"| {name} | {m['traj_per_s']:.0f} | {m['tok_per_s']:.0f} | "
            f"{m['traj_per_s'] / base['traj_per_s']:.2f}x | {m['step_s_median']:.3f} s | "
            f"{m['occupancy']:.2f} ({m['rows_per_decode']:.1f}) | "
            f"{m['wait_share']:.0%} | {m['train_share']:.0%} | {m['gen_busy_share']:.0%} | "
            f"{m['stale_token_share']:.0%} | {m['resumed_share']:.0%} | {m['dropped_stale']} | "
            f"{curves[name][-1][1]:.3f} | {sum(half) / max(1, len(half)):.3f} | "
            f"{'not reached' if t is None else f'{t:.1f} s'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 steps, nine runs")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per variant")
    ap.add_argument("--eval-every", type=int, default=None, help="checkpoint/eval interval")
    ap.add_argument("--out", default="runs/async_vs_sync", help="work directory")
    ap.add_argument("--plot", default="benchmarks/plots/async_vs_sync.png")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for every run (e.g. rollout.batch_groups=16)")
    ap.add_argument("--variants", default="", help="comma-separated subset (sync always runs)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="runs per variant (train.seed 0..N-1); accuracy curves are averaged")
    args = ap.parse_args()
    steps = args.steps or (300 if args.quick else 600)
    every = args.eval_every or (20 if args.quick else 25)
    variants = dict(VARIANTS) if args.quick else {**VARIANTS, **FULL_ONLY}
    if args.variants:
        keep = {"sync", *(v.strip() for v in args.variants.split(","))}
        variants = {k: v for k, v in variants.items() if k in keep}
    repeat = variants.pop("sync (repeat)", None)
    if repeat is not None and args.seeds == 1:  # with seeds, their spread is the noise
        variants["sync (repeat)"] = repeat  # always last
    base = BASE + args.set
    rc = load_checked(None, base).rollout
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}; commit {commit}; {steps} steps x "
          f"{rc.batch_groups} groups x {rc.group_size}; overrides {args.set}", flush=True)

    t0 = time.perf_counter()
    init = warm_start(out, base)
    acc0 = initial_accuracy(init, base)
    print(f"SFT warm start ({SFT_STEPS} steps): greedy accuracy {acc0:.3f} "
          f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    runs: dict[str, list] = {}
    for seed in range(args.seeds):  # seeds outermost: machine drift hits every variant alike
        for name, overrides in variants.items():
            t1 = time.perf_counter()
            tag = name if args.seeds == 1 else f"{name} seed{seed}"
            run, slots = run_variant(out, tag, [*overrides, f"train.seed={seed}"], init, steps,
                                     every, base)
            rows, curve = read_metrics(run), held_out_curve(run, acc0, base)
            runs.setdefault(name, []).append((rows, curve, slots))
            print(f"  {tag}: {summarise(rows, rc.group_size, rc.batch_groups, slots)['traj_per_s']:.1f}"
                  f" traj/s, final acc {curve[-1][1]:.3f} [{time.perf_counter() - t1:.0f} s] "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    results, curves = {}, {}
    for name, rs in runs.items():  # pooled over seeds: summed steps and wall, mean curve
        pooled = [r for rows, _, _ in rs for r in rows]
        results[name] = summarise(pooled, rc.group_size, rc.batch_groups, rs[0][2])
        results[name]["dropped_stale"] = sum(rows[-1].get("pipeline/dropped_stale", 0)
                                             for rows, _, _ in rs)
        results[name]["final_accs"] = [c[-1][1] for _, c, _ in rs]
        curves[name] = mean_curve([c for _, c, _ in rs])
        if name == "sync":
            results[name]["model"] = separate_devices_model(pooled)

    # the synchronous run's own final accuracy, smoothed: does async get there no later?
    target = smooth(curves["sync"])[-1][1]
    print()
    print(table(results, curves, target))
    sm = results["sync"]["model"]
    print(f"\nsync run, per step (measured): trainer waits {sm['wait_s_per_step']:.3f} s (engine "
          f"busy {sm['engine_s_per_step']:.3f} s of it; the rest is admission, scoring and "
          f"hand-off), trains {sm['train_s_per_step']:.3f} s, publishes/records "
          f"{sm['rest_s_per_step']:.3f} s")
    print(f"MODEL (not measured): generation and training on separate devices, one step of "
          f"overlap, step = max(wait, train) + rest: {sm['speedup']:.2f}x vs sync")
    if "sync (repeat)" in results:
        print(f"noise: sync (repeat) / sync = "
              f"{results['sync (repeat)']['traj_per_s'] / results['sync']['traj_per_s']:.2f}x")
    deep = [n for n, o in variants.items()
            if any(x.startswith("runtime.max_staleness=") and int(x.split("=")[1]) >= 2
                   for x in o)]
    if deep:
        best = max(deep, key=lambda n: results[n]["traj_per_s"])
        print(f"MEASURED best at max_staleness >= 2: {best} "
              f"{results[best]['traj_per_s'] / results['sync']['traj_per_s']:.2f}x vs sync "
              f"(target 1.5x)")
    for name, m in results.items():
        accs = m["final_accs"]
        print(f"final accuracy per seed, {name}: {', '.join(f'{a:.3f}' for a in accs)} "
              f"(mean {sum(accs) / len(accs):.3f})")
    t_sync = time_to(curves["sync"], target)
    for name in results:
        t = time_to(curves[name], target)
        print(f"time to sync's final accuracy {target:.3f}: {name}: "
              f"{'not reached' if t is None else f'{t:.1f} s ({t_sync / t:.2f}x faster)'}")
    plot(curves, Path(args.plot))
    (out / "results.json").write_text(json.dumps({"results": results, "curves": curves,
                                                  "acc0": acc0, "commit": commit}, indent=1))
    print(f"plot: {args.plot}; raw: {out / 'results.json'}; total "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""The Control stage against fixed-n GRPO: rollout tokens and training time to a target
held-out accuracy, and accuracy at equal tokens, for every allocator and prompt selector.

Workload: the mixed-difficulty task (``arith_mixed``, ``configs/mixed.toml``: easy, medium
and hard arithmetic, 4,500 train and 300 held-out prompts). One SFT warm start
(``reroll sft configs/mixed.toml``, cached under ``--out``) is the ``init=`` of every RL
run, so every method starts from the same weights. Every run has the same task seed,
rollout.group_size x rollout.batch_groups (8 x 16 = 128 trained samples a step, whatever the
allocator: adaptive groups differ in size, a step takes about 128 samples of them), lr,
steps and evaluation; a method changes only its ``[control]`` keys, at their defaults (none
is tuned here), except ``dars``, which is ``preset=dars`` (its allocator with advantages
without std normalisation and the zero-variance filter, as the authors run it). Seeds via
``train.seed``. Runs go one after another (2 cores) through ``reroll train``, unchanged.

ARRoL (``control.pruner = "arrol"``): ``arrol`` generates 12 samples a
group (overprovision 1.5) and cuts them to 8 inside the engine at its checkpoint (default:
max_new_tokens // 4 = 1 response token here), so a step still trains 16 x 8 samples (plus
any that ended before the checkpoint); its tokens count the pruned samples' tokens too.
``arrol-at2`` moves the checkpoint to 2 tokens (after 1 the head barely tells a group's
members apart) and ``arrol-at2-hidden`` also drops the head's log-prob features (the hidden
state and position only, as in the paper). Diagnostics: pruned samples and head accuracy per
step, share of groups whose trained members hold both outcomes.

DUET: ``duet-alloc`` is its token-budget allocator alone, from the
shared warm start. Its marker gate needs completions with an answer marker, which the plain
task does not write, so ``duet`` (allocator + gate: stop 4 tokens after ``#``, abort at 8
tokens with no marker unless the 5% draw keeps it) and its own baseline ``fixed-marker``
(fixed-n GRPO) start from a second SFT warm start on ``task.args.marker="#"`` (worked
demonstrations, ``-8+12#4``; up to 12 new tokens), and ``duet``'s ratios are against
``fixed-marker``, not ``fixed`` (``BASELINE``).

Per run, from ``RUN/metrics.jsonl`` (``log_every = 1``): held-out greedy accuracy every
``--eval-every`` steps (all 300 held-out prompts, per level too), against
``pipeline/tokens_generated`` (cumulative response tokens the engine generated, dropped or
unused samples included) and against training seconds (the summed ``time/step_s``; the loop
stops a step's timer before it evaluates, so evaluation is already outside it). Every
``record_every`` steps the trained groups are read back from the rollout store
(``RUN/rollouts/``) for the training mix (share of trained samples per level, share in groups
with both outcomes), then the store is deleted.

Noise: one evaluation on 300 prompts near 50% has a standard error of 2.9 points, so curves
are smoothed over ``--smooth`` consecutive evaluations (centred; shorter at the ends) before
a target crossing is looked for, and "final" is the mean of the last three evaluations.

Target: ``--target-frac`` (0.95) x fixed GRPO's final accuracy (mean over seeds), or
``--target``. Reported per method, mean +- sd over seeds: tokens to the target (the first
smoothed evaluation at or above it; seeds that never reach it are counted, not averaged),
training seconds to it, the ratio tokens(fixed) / tokens(method) (on the per-seed means,
and on the seed-mean curve), accuracy at equal tokens (each smoothed curve interpolated at
the smallest final token count of any run), final accuracy overall and per level. Also
printed: tokens to fixed's own final accuracy (frac 1.0). Plots: accuracy vs tokens and
vs training seconds, the seed-mean smoothed curve per method with a +-1 sd band.

    .venv/bin/python benchmarks/control.py [--quick] [--seeds 0 1 2] [--methods ar3po_stages dots]
        [--steps N] [--eval-every N] [--out DIR] [--target-frac F | --target A] [--fresh]

A finished run whose arguments are unchanged is reused (``--fresh`` reruns everything but
the SFT warm start); ``--quick`` is a smoke test (tiny SFT, 30 steps, 1 seed, 60 prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_report import (  # noqa: E402  (curves, summaries, tables, plots)
    final,
    fmt,
    mix_table,
    parse,
    plot,
    ratio,
    read_rows,
    summarise,
    table,
    training_mix,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/mixed.toml"
REROLL = str(Path(sys.executable).parent / "reroll")
# every run: one metrics row per step, the trained mix every 10th step, the main job's lr
BASE = ["log_every=1", "record_every=10", "train.lr=1e-4"]

# name -> overrides; "fixed" (fixed-n GRPO) is the baseline and always runs. A method's
# plain name runs it as its paper does (today's defaults; ``dars`` is the whole method,
# preset=dars, and ``dars-alloc`` its allocator alone under GRPO's std-normalised
# advantages); reroll's variants keep their own names: dars_std (std-normalised schedule),
# *-mean_rate (GDRO binning by recent mean success rate), vade-one_scale (update_decay = 1).
METHODS: dict[str, list[str]] = {
    "fixed": [],
    "ar3po_stages": ["control.allocator=ar3po_stages"],
    "dars": ["preset=dars"],
    "dars-alloc": ["control.allocator=dars"],
    "dars_std": ["control.allocator=dars", "control.allocator_args.std_norm=true"],
    "xrpo": ["control.allocator=xrpo"],
    "gdro-alloc": ["control.allocator=gdro"],
    "gdro-alloc-mean_rate": ["control.allocator=gdro",
                             "control.allocator_args.bin_by=mean_rate"],
    "dots": ["control.selector=dots"],
    "dots-attn": ["control.selector=dots", 'control.selector_args={predict="attention"}'],
    "vade": ["control.selector=vade"],
    "vade-one_scale": ["control.selector=vade", "control.selector_args.update_decay=1.0"],
    "gdro-select": ["control.selector=gdro"],
    "gdro-select-mean_rate": ["control.selector=gdro",
                              "control.selector_args.bin_by=mean_rate"],
    "ar3po_stages+dots": ["control.allocator=ar3po_stages", "control.selector=dots"],
    "gdro+gdro": ["control.allocator=gdro", "control.selector=gdro"],
    "gdro+gdro-mean_rate": ["control.allocator=gdro", "control.selector=gdro",
                            "control.allocator_args.bin_by=mean_rate",
                            "control.selector_args.bin_by=mean_rate"],
    "duet-alloc": ["control.allocator=duet"],
    "fixed-marker": [],
    "duet": ["control.allocator=duet", "control.duet_abort=true", "control.duet_grace=4",
             "control.duet_horizon=8"],
    "arrol": ["control.pruner=arrol"],
    "arrol-at2": ["control.pruner=arrol", "control.pruner_args={at=2}"],
    "arrol-at2-hidden": ["control.pruner=arrol",
                         "control.pruner_args={at=2, confidence=false}"],
}
# completion formats with their own SFT warm start: format -> overrides of the SFT and of
# every RL run of the methods in FORMAT_OF (their ratios are against BASELINE's method)
FORMATS = {"marker": ['task.args.marker="#"', "rollout.max_new_tokens=12"]}
FORMAT_OF = {"fixed-marker": "marker", "duet": "marker"}
BASELINE = {"duet": "fixed-marker"}
NOT_BUILT: dict[str, str] = {}  # methods listed but not measured, with the reason


# ---- runs -------------------------------------------------------------------------------
def sh(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` from the repository root with its output in ``log``; seconds it took (a
    failure stops the benchmark with the log's tail). Shared by the other benchmarks."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{tail}")
    return time.perf_counter() - t0


def warm_start(out: Path, extra: list[str], fmt: str = "") -> Path:
    """The shared SFT checkpoint (``out/sft``, or ``out/sft_FORMAT`` for a completion format
    of `FORMATS`), made once."""
    sft = out / (f"sft_{fmt}" if fmt else "sft")
    extra = extra + FORMATS.get(fmt, [])
    if (sft / "model" / "config.json").is_file():
        return sft
    shutil.rmtree(sft, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sh([REROLL, "sft", CONFIG, f"out_dir={sft}", *extra], out / f"{sft.name}.log")
    print(f"SFT warm start: {time.perf_counter() - t0:.0f} s -> {sft}", flush=True)
    return sft


def run_one(out: Path, name: str, seed: int, overrides: list[str], init: Path, steps: int,
            every: int, extra: list[str], fresh: bool) -> tuple[Path, bool]:
    run = out / "runs" / f"{name.replace('+', '_')}_seed{seed}"
    args = [CONFIG, f"out_dir={run}", f"init={init}", f"train.steps={steps}",
            f"eval.every={every}", f"ckpt_every={steps}", f"train.seed={seed}", *BASE, *extra,
            *overrides]
    spec = run / "bench_args.json"
    rows = read_rows(run)
    if (not fresh and spec.is_file() and json.loads(spec.read_text()) == args
            and rows and rows[-1]["step"] == steps and (run / "mix.json").is_file()):
        return run, True
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    sh([REROLL, "train", *args, "--no-progress"], run.with_name(run.name + ".log"))
    (run / "mix.json").write_text(json.dumps(training_mix(run)))
    shutil.rmtree(run / "rollouts")
    spec.write_text(json.dumps(args))
    return run, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="train.seed values")
    ap.add_argument("--methods", nargs="+", default=None,
                    help=f"subset of {', '.join(METHODS)} (fixed always runs, and a "
                         f"method's own baseline with it)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (500)")
    ap.add_argument("--eval-every", type=int, default=None, help="held-out eval interval (10)")
    ap.add_argument("--out", default="/tmp/reroll_bench_control", help="work directory")
    ap.add_argument("--target-frac", type=float, default=0.95,
                    help="target = this x fixed GRPO's final accuracy (mean over seeds)")
    ap.add_argument("--target", type=float, default=None, help="absolute target accuracy")
    ap.add_argument("--smooth", type=int, default=3, help="evaluations per smoothing window")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for every RL run (e.g. rollout.batch_groups=8)")
    ap.add_argument("--plots", default=str(ROOT / "benchmarks" / "plots"),
                    help="directory for control_tokens.png and control_time.png")
    ap.add_argument("--fresh", action="store_true", help="rerun cached RL runs")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 100-step SFT, 30 RL steps, seed 0, 60 held-out prompts")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    steps = args.steps or (30 if args.quick else 500)
    every = args.eval_every or 10
    out = Path(args.out) / ("quick" if args.quick else "")
    methods = dict(METHODS)
    if args.methods:
        unknown = set(args.methods) - set(METHODS)
        if unknown:
            raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
        wanted = set(args.methods) | {BASELINE[m] for m in args.methods if m in BASELINE}
        methods = {k: v for k, v in METHODS.items() if k == "fixed" or k in wanted}
    sft_extra = ["sft.steps=100"] if args.quick else []
    extra = (["eval.n_examples=60"] if args.quick else []) + args.set
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; commit {commit}; {CONFIG}, {steps} steps, eval every "
          f"{every}, seeds {seeds}; overrides {BASE + extra}", flush=True)
    for name, why in NOT_BUILT.items():
        print(f"  {name}: {why}")

    t0 = time.perf_counter()
    inits = {f: warm_start(out, sft_extra, f)
             for f in sorted({FORMAT_OF.get(n, "") for n in methods})}
    runs: dict[str, list[dict]] = {}
    for seed in seeds:  # seeds outermost: drift in machine load hits every method alike
        for name, ov in methods.items():
            t1 = time.perf_counter()
            form = FORMAT_OF.get(name, "")
            run, cached = run_one(out, name, seed, FORMATS.get(form, []) + ov, inits[form],
                                  steps, every, extra, args.fresh)
            r = parse(run)
            runs.setdefault(name, []).append(r)
            p = r["points"]
            print(f"  {name} seed {seed}: acc {p[0]['acc']:.3f} -> {final(p):.3f} (last 3 "
                  f"evals), {p[-1]['tokens'] / 1e3:.0f}k tokens, {p[-1]['train_s']:.0f} s "
                  f"training, {r['diag']['group_size_mean']:.2f} samples/group "
                  f"[{'cached' if cached else f'{time.perf_counter() - t1:.0f} s'}, load "
                  f"{os.getloadavg()[0]:.2f}]", flush=True)

    base_final = statistics.fmean(final(r["points"]) for r in runs["fixed"])
    target = args.target if args.target is not None else args.target_frac * base_final
    t_eq = min(r["points"][-1]["tokens"] for rs in runs.values() for r in rs)
    summary = summarise(runs, target, args.smooth, t_eq, BASELINE)
    strict = summarise(runs, base_final, args.smooth, t_eq, BASELINE)  # fixed's own final accuracy
    how = (f"--target {args.target}" if args.target is not None else
           f"{args.target_frac} x fixed's final {base_final:.3f}")
    print(f"\ntarget held-out accuracy {target:.3f} ({how}); start (SFT) "
          f"{summary['fixed']['start_acc']:.3f}; equal tokens = {t_eq:.0f} (smallest final "
          f"count); smoothing {args.smooth} evals; tokens in thousands\n")
    if summary["fixed"]["start_acc"] >= target:
        print("WARNING: the SFT start already meets the target; crossings are looked for "
              "from the first evaluation after step 0\n")
    print(table(summary, target, t_eq))
    print("\ntraining mix (recorded every 10th step) and allocator price:\n")
    print(mix_table(summary))
    for name, m in summary.items():
        dg = m["diag"]
        if dg.get("arrol_pruned_per_step") is not None:
            print(f"\n{name}: {dg['arrol_pruned_per_step']:.1f} samples pruned and "
                  f"{dg['arrol_early_per_step']:.1f} ended before the checkpoint per step; "
                  f"groups whose trained members hold both outcomes "
                  f"{dg['arrol_mixed_groups']:.0%}; head accuracy (last 50 steps, before "
                  f"each update) {dg['arrol_head_accuracy_last50']:.3f}")
    print(f"\ntokens to fixed GRPO's own final accuracy {base_final:.3f}:")
    for name, m in strict.items():
        mc = m["tokens_to_target_mean_curve"]
        print(f"  {name}: {fmt(m['tokens_to_target'], 1e3, 1, 'k')} ({m['reached']}/{m['seeds']} "
              f"seeds), fixed / method {ratio(m['ratio_tokens'])}; seed-mean curve "
              f"{'not reached' if mc is None else f'{mc / 1e3:.1f}k'} "
              f"({ratio(m['ratio_tokens_mean_curve'])})")
    for name, why in NOT_BUILT.items():
        print(f"  {name}: {why}")

    cands = {n: m for n, m in summary.items() if n != "fixed"}
    scored = {n: (m["ratio_tokens"] or 0.0) for n, m in cands.items()}
    if scored:
        best = max(scored, key=scored.get)
        r = cands[best]["ratio_tokens"]
        verdict = "MET" if r is not None and r >= 2.0 else "NOT MET"
        print(f"\nTARGET (>= 2x fewer rollout tokens than fixed-n GRPO to {target:.3f}): "
              f"{verdict}; best {best}: {ratio(r)} (seed-mean curve "
              f"{ratio(cands[best]['ratio_tokens_mean_curve'])})")
    plots = Path(args.plots)
    if not args.quick:
        plot(summary, "tokens", target, plots / "control_tokens.png",
             "rollout tokens generated (thousands, cumulative)")
        plot(summary, "train_s", target, plots / "control_time.png",
             "training seconds (summed step time, evaluation excluded; 2-core CPU, shared)")
    else:
        plot(summary, "tokens", target, out / "control_tokens.png", "tokens (thousands)")
        plot(summary, "train_s", target, out / "control_time.png", "training seconds")
    res = {"commit": commit, "steps": steps, "eval_every": every, "seeds": seeds,
           "overrides": BASE + extra, "methods": methods, "not_built": NOT_BUILT,
           "target": target, "fixed_final": base_final, "equal_tokens": t_eq,
           "smooth": args.smooth, "summary": summary,
           "to_fixed_final": {n: {k: m[k] for k in ("reached", "tokens_to_target",
                                                      "ratio_tokens", "ratio_tokens_mean_curve")}
                              for n, m in strict.items()},
           "runs": runs}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    print(f"\nplots: {plots if not args.quick else out}/control_tokens.png, control_time.png; "
          f"raw: {out / 'results.json'}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

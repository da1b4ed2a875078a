"""One recorded run, trained again under grpo, dr_grpo, rloo and gspo with `reroll replay`:
the same rollouts in the same batches, so the estimators differ only in what they make of
them.

Workload: the main job (``configs/arithmetic.toml``, two-digit addition, 16 prompts x 8
samples a step) from its SFT warm start (``reroll sft``, cached under ``--out``), trained
``--steps`` steps with the config's own algorithm (GRPO advantages, PPO clip, token-mean, no
KL) and ``record_every = 1``, so every step's batch is in the rollout store. Then one
``reroll replay`` per preset (dr_grpo's divisor set to the generation limit, 6 tokens), and
one with the run's own settings, which must reproduce the run bitwise (checked: every logged
update metric and the final weights). Each replay evaluates held-out greedy accuracy (all
500 prompts) every ``--eval-every`` steps, as the run did.

Off-policy: the data came from the recorded run's policy. Under another estimator the
replayed policy drifts from it after its first update, so from step 2 on every replayed
batch is off-policy for it; the decoupled objective's truncated importance weights
pi_prox / mu, with the recorded behaviour log-probs mu, are what correct for it. The table's
IS columns (ESS of those weights, k1 KL between pi_prox and mu) say how far each replay
drifted; a replay is a controlled comparison of estimators on identical data, not a
substitute for training each one on its own rollouts.

With ``--on-policy`` each preset also trains from the same warm start on its own rollouts
(``reroll train preset=X``, same steps and seed): what the replay stands in for.

Reported per estimator: final and best held-out greedy accuracy (and on its own rollouts),
mean policy loss, mean gradient norm (before clipping), mean clip fraction (low + high), mean
IS ESS and k1 KL, and training seconds (summed ``time/step_s``; the recorded run's include
generation). PNG: held-out accuracy (on-policy runs dashed), gradient norm, the IS weights' ESS
and the k1 KL to the behaviour policy, per step. Finished runs and replays are reused
(``--fresh`` redoes them; the SFT warm start is always reused).

    .venv/bin/python benchmarks/replay_compare.py [--steps 400] [--eval-every 50]
        [--out runs/bench_replay] [--presets grpo dr_grpo rloo gspo] [--on-policy]
        [--quick] [--fresh]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from control import sh  # noqa: E402  (one runner for every benchmark)

CONFIG = "configs/arithmetic.toml"
REROLL = [str(Path(sys.executable).parent / "reroll")]
REPLAY = [sys.executable, "-m", "reroll.recording.retrain"]
PRESET_ARGS = {"dr_grpo": ["algo.aggregation_args.divisor=6.0"]}  # = rollout.max_new_tokens
# the presets' own correction is their papers' "none" (on-policy); a replay under another
# preset is off-policy from step 2 on, so it reweighs with the recorded behaviour log-probs
REPLAY_ARGS = ["algo.correction=tis_token"]
NOT_REPLAYED = ("time", "throughput/", "pipeline/", "engine/", "score_errors/")


def rows(run: Path) -> list[dict]:
    from reroll.runlog import read_metrics

    return read_metrics(run)


def mean(rs: list[dict], key: str) -> float:
    vals = [r[key] for r in rs if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def summary(run: Path) -> dict:
    rs = [r for r in rows(run) if r["step"] > 0]
    evals = [r for r in rows(run) if "eval/greedy_accuracy" in r]
    for r in rs:
        r["clip_frac"] = r.get("clip_frac_low", 0.0) + r.get("clip_frac_high", 0.0)
    return {"final_greedy": evals[-1]["eval/greedy_accuracy"] if evals else float("nan"),
            "best_greedy": max((r["eval/greedy_accuracy"] for r in evals), default=float("nan")),
            "loss": mean(rs, "loss/policy"), "grad_norm": mean(rs, "grad_norm"),
            "clip_frac": mean(rs, "clip_frac"), "is_ess": mean(rs, "is/ess"),
            "is_kl_k1": mean(rs, "is/kl_k1"),
            "train_s": sum(r.get("time/step_s", 0.0) for r in rs)}


def bitwise(a: Path, b: Path, steps: int) -> bool:
    """Every logged update metric and the final weights of ``b`` equal ``a``'s."""
    import torch
    from safetensors.torch import load_file

    def upd(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(NOT_REPLAYED)} for r in rows(run)]

    def w(run: Path) -> dict:
        return load_file(str(run / "checkpoints" / f"step_{steps:06d}" / "model" /
                             "model.safetensors"))

    wa, wb = w(a), w(b)
    return upd(a) == upd(b) and wa.keys() == wb.keys() and all(
        torch.equal(wa[k], wb[k]) for k in wa)


def plot(runs: dict[str, Path], own: dict[str, Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [("eval/greedy_accuracy", "held-out greedy accuracy", 1),
              ("grad_norm", "gradient norm (before clipping, 10-step mean)", 10),
              ("is/ess", "ESS of the IS weights pi_prox / mu (10-step mean)", 10),
              ("is/kl_k1", "k1 KL(pi_prox || mu): drift from the recorded policy", 10)]
    for ax, (key, title, smooth) in zip(axes.flat, panels):
        for name, run in runs.items():
            rs = [r for r in rows(run) if key in r]
            xs, ys = [r["step"] for r in rs], [r[key] for r in rs]
            if smooth > 1:
                ys = [statistics.fmean(ys[max(0, i - smooth + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, label=name, lw=1.4 if smooth == 1 else 1.0,
                    marker="o" if smooth == 1 else None, ms=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    colours = {name: line.get_color() for name, line in zip(runs, axes[0, 0].get_lines())}
    for name, run in own.items():
        rs = [r for r in rows(run) if "eval/greedy_accuracy" in r]
        axes[0, 0].plot([r["step"] for r in rs], [r["eval/greedy_accuracy"] for r in rs],
                        ls="--", lw=1.0, color=colours.get(name), label=f"{name}, own rollouts")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("the same recorded rollouts, trained under each estimator (reroll replay; "
                 "off-policy after step 1 except 'recorded')", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--sft-steps", type=int, default=525)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_replay")
    ap.add_argument("--presets", nargs="+", default=["grpo", "dr_grpo", "rloo", "gspo"])
    ap.add_argument("--on-policy", action="store_true",
                    help="also train each preset on its own rollouts (reroll train)")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny SFT, 20 steps")
    ap.add_argument("--fresh", action="store_true",
                    help="redo the recorded run, the on-policy runs and the replays")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.eval_every, a.sft_steps = 20, 10, 60
        a.out = a.out.with_name(a.out.name + "_quick")
    a.out.mkdir(parents=True, exist_ok=True)
    extra = ["eval.n_examples=100"] if a.quick else []
    sft = a.out / "sft"
    if not (sft / "model" / "config.json").is_file():
        shutil.rmtree(sft, ignore_errors=True)
        s = sh([*REROLL, "sft", CONFIG, f"out_dir={sft}", f"sft.steps={a.sft_steps}", *extra],
               a.out / "sft.log")
        print(f"SFT warm start: {s:.0f} s", flush=True)
    run = a.out / "recorded"
    if a.fresh or not (run / "checkpoints" / f"step_{a.steps:06d}").is_dir():
        shutil.rmtree(run, ignore_errors=True)
        s = sh([*REROLL, "train", CONFIG, f"out_dir={run}", f"init={sft}",
                f"train.steps={a.steps}", f"eval.every={a.eval_every}", "record_every=1",
                "log_every=1", f"ckpt_every={a.steps}", "--no-progress", *extra],
               a.out / "recorded.log")
        print(f"recorded run: {a.steps} steps in {s:.0f} s", flush=True)
    runs = {"recorded (config's own algo)": run}
    own: dict[str, Path] = {}
    for name in a.presets if a.on_policy else []:
        out = a.out / f"own_{name}"
        if a.fresh or not (out / "checkpoints" / f"step_{a.steps:06d}").is_dir():
            shutil.rmtree(out, ignore_errors=True)
            s = sh([*REROLL, "train", CONFIG, f"out_dir={out}", f"init={sft}",
                    f"preset={name}", *PRESET_ARGS.get(name, []), f"train.steps={a.steps}",
                    f"eval.every={a.eval_every}", "record_every=0", "log_every=1",
                    f"ckpt_every={a.steps}", "--no-progress", *extra], a.out / f"own_{name}.log")
            print(f"{name} on its own rollouts: {s:.0f} s", flush=True)
        own[name] = out
    wall = {}
    for name in ["same", *a.presets]:
        out = a.out / f"replay_{name}"
        if a.fresh or not (out / "checkpoints" / f"step_{a.steps:06d}").is_dir():
            shutil.rmtree(out, ignore_errors=True)
            args = ([] if name == "same" else [f"preset={name}", *PRESET_ARGS.get(name, []),
                                               *REPLAY_ARGS])
            wall[name] = sh([*REPLAY, str(run), *args, f"out_dir={out}", "log_every=1",
                             f"ckpt_every={a.steps}", "--no-progress"],
                            a.out / f"replay_{name}.log")
            print(f"replay {name}: {wall[name]:.0f} s", flush=True)
        if name != "same":
            runs[name] = out
    same = bitwise(run, a.out / "replay_same", a.steps)
    table = {name: summary(p) for name, p in runs.items()}
    table["replay, run's own settings"] = summary(a.out / "replay_same")
    for name, p in own.items():
        table[name]["own"] = summary(p)
    head = ("| estimator | final greedy | best greedy | on own rollouts: final (best) | mean "
            "loss | mean grad norm | mean clip frac | mean IS ESS | mean k1(pi_prox, mu) | "
            "train s |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {n} | {s['final_greedy']:.1%} | {s['best_greedy']:.1%} | "
             + (f"{s['own']['final_greedy']:.1%} ({s['own']['best_greedy']:.1%})" if "own" in s
                else "") +
             f" | {s['loss']:+.4f} | {s['grad_norm']:.3f} | {s['clip_frac']:.4f} | "
             f"{s['is_ess']:.4f} | {s['is_kl_k1']:.1e} | {s['train_s']:.1f} |"
             for n, s in table.items()]
    report = head + "\n".join(lines)
    plot(runs, own, a.out / "replay_compare.png")
    print()
    print(report)
    print(f"\nreplay with the run's own settings bitwise equal to the run (every update "
          f"metric, final weights): {'yes' if same else 'NO'}")
    print("clip fraction: one optimiser step per batch (train.minibatches = 1), so the "
          "ratio pi_theta / pi_prox is 1 at the only update and nothing is clipped")
    print("off-policy: every replay but the run's own trains from step 2 on on rollouts "
          "sampled by another policy (the recorded one); the truncated IS weights "
          "pi_prox / mu with the recorded mu correct for it (IS columns: how far it drifted)")
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; commit {head_rev}; {a.steps} steps; plot "
          f"{a.out / 'replay_compare.png'}")
    (a.out / "replay_compare.json").write_text(json.dumps(
        {"table": table, "bitwise_same": same, "replay_wall_s": wall, "commit": head_rev,
         "steps": a.steps}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

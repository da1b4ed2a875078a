"""Speculative rollouts (``replay.draft``) against plain sampling: freshly generated tokens
per epoch, generation and total wall time, and held-out greedy accuracy, on multi-epoch
training over a fixed small prompt set.

Workload: the main job (``configs/arithmetic.toml``) from its SFT checkpoint, restricted to
``task.args.n_train = 64`` prompts (16 groups x 8 samples a step: an epoch is 4 steps), lr
1e-4, ``--epochs`` epochs, synchronous. Methods change only ``[replay]``:

- ``none``: every response token sampled;
- ``spec_rl``: each sample starts from its prompt's response of last epoch, q = its recorded
  log-probs, lenience 1;
- ``spec_rl_lenient``: the same with lenience e^0.5 = 1.65 (SPEC-RL's README example);
- ``das``: the majority path through the prompt's last 2 epochs of responses, q = 1
  (exact acceptance), verified when a response starts only (``redraft = false``);
- ``das_redraft``: the same, and re-drafting at every decode step from the suffix of the
  response so far (``redraft = true``, the drafter's default).

"Fresh" tokens are ``pipeline/tokens_generated`` (what the engine sampled); accepted draft
tokens are ``draft/tokens_accepted``. Held-out greedy accuracy on the task's 500 test
prompts at the end. Runs go one after another through ``reroll train``.

    .venv/bin/python benchmarks/reuse.py [--epochs 10] [--seeds 0 1] [--out runs/bench_reuse]
        [--methods none das das_redraft]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REROLL = str(Path(sys.executable).with_name("reroll"))
CONFIG = str(ROOT / "configs" / "arithmetic.toml")
N_TRAIN, GROUPS = 64, 16
METHODS: dict[str, list[str]] = {
    "none": [],
    "spec_rl": ["replay.draft=spec_rl"],
    "spec_rl_lenient": ["replay.draft=spec_rl", "replay.draft_args={lenience=1.6487}"],
    "das": ["replay.draft=das", "replay.draft_args={history=2, min_count=2, redraft=false}"],
    "das_redraft": ["replay.draft=das", "replay.draft_args={history=2, min_count=2}"],
}


def sh(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}\n"
                         f"{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def warm_start(out: Path, init: str | None) -> Path:
    """The main job's SFT checkpoint: ``--init``, else ``out/sft`` made once."""
    if init:
        return Path(init)
    sft = out / "sft"
    if not (sft / "model" / "config.json").is_file():
        shutil.rmtree(sft, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        print(f"SFT warm start: {sh([REROLL, 'sft', CONFIG, f'out_dir={sft}'], out / 'sft.log'):.0f} s")
    return sft


def run_one(out: Path, name: str, seed: int, init: Path, epochs: int) -> dict:
    steps = epochs * N_TRAIN // GROUPS
    run = out / "runs" / f"{name}_seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    args = [REROLL, "train", CONFIG, f"out_dir={run}", f"init={init}",
            f"task.args.n_train={N_TRAIN}", f"rollout.batch_groups={GROUPS}",
            f"train.steps={steps}", f"train.seed={seed}", "log_every=1", "record_every=0",
            f"eval.every={steps}", f"ckpt_every={steps}", *METHODS[name], "--no-progress"]
    wall = sh(args, run.with_name(run.name + ".log"))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    by_step = {r["step"]: r for r in rows}
    per = N_TRAIN // GROUPS
    gen = [by_step[e * per]["pipeline/tokens_generated"] for e in range(1, epochs + 1)]
    fresh = [b - a for a, b in zip([0.0] + gen[:-1], gen, strict=True)]
    last = by_step[steps]
    return {"method": name, "seed": seed, "fresh_per_epoch": fresh,
            "accepted": last.get("draft/tokens_accepted", 0.0),
            "redraft": [last.get(f"engine/redraft_tokens_{k}", 0.0)
                        for k in ("proposed", "accepted")],
            "generate_s": sum(r.get("time/generate_s", 0.0) for r in rows),
            "train_loop_s": last["time"], "wall_s": wall,
            "accuracy": last["eval/greedy_accuracy"]}


def summarise(results: list[dict], epochs: int) -> str:
    lines = [f"| method | fresh tokens, epoch 1 | fresh tokens / epoch, epochs 2-{epochs} | "
             "x fewer than none | draft tokens accepted | generate s | train loop s | "
             "held-out greedy acc |", "|---|---|---|---|---|---|---|---|"]
    later = {}
    for name in METHODS:
        rs = [r for r in results if r["method"] == name]
        if rs:
            later[name] = statistics.mean(statistics.mean(r["fresh_per_epoch"][1:]) for r in rs)
    for name in METHODS:
        rs = [r for r in results if r["method"] == name]
        if not rs:
            continue

        def m(key, rs=rs):
            return statistics.mean(r[key] for r in rs)

        first = statistics.mean(r["fresh_per_epoch"][0] for r in rs)
        accs = ", ".join(f"{r['accuracy']:.3f}" for r in rs)
        lines.append(f"| {name} | {first:.0f} | {later[name]:.0f} | "
                     f"{later['none'] / later[name]:.2f} | {m('accepted'):.0f} | "
                     f"{m('generate_s'):.2f} | {m('train_loop_s'):.1f} | {accs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default="runs/bench_reuse")
    ap.add_argument("--init", default=None, help="an SFT checkpoint of the main job")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    a = ap.parse_args()
    if a.epochs < 2:
        raise SystemExit("--epochs must be >= 2 (drafts start in epoch 2)")
    if "none" not in a.methods:
        raise SystemExit("--methods needs none (the baseline the others are compared with)")
    out = ROOT / a.out
    sft = warm_start(out, a.init)
    results = []
    for seed in a.seeds:
        for name in a.methods:
            results.append(run_one(out, name, seed, sft, a.epochs))
            r = results[-1]
            print(f"{name} seed {seed}: fresh/epoch {[int(x) for x in r['fresh_per_epoch']]} "
                  f"acc {r['accuracy']:.3f} re-drafted (proposed, accepted) "
                  f"{[int(x) for x in r['redraft']]} wall {r['wall_s']:.0f} s", flush=True)
    table = summarise(results, a.epochs)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n{platform.processor() or platform.machine()}, seeds {a.seeds}, "
          f"{a.epochs} epochs\n{table}")


if __name__ == "__main__":
    main()

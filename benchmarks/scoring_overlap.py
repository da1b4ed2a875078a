"""Does scoring overlap generation in `reroll train`? (issue: verifiers off the hot path)

Runs the same short training (max_staleness = 1, so the next batch is generated while the
current one is scored and trained on) three times on the long-tail task:

  fast    the exact-match verifier (microseconds per call)
  slow    the same check wrapped in a user reward function that sleeps SLEEP_MS per call,
          scored in the worker pool (reward.workers = 1): reroll's path
  inline  the slow function called inline in the generation thread right after each
          rollout finishes (the baseline: what a trainer without a scoring service does)

and prints, per step: generation time (engine busy time), scoring time added, step time.
If scoring overlaps generation, `slow` has the same generation time as `fast` and its step
time grows by much less than the total scoring time; `inline` grows by all of it.

    .venv/bin/python benchmarks/scoring_overlap.py [--steps 20] [--sleep-ms 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SLEEP_MS = 3.0


def slow_exact(prompts, completions, answer, **_):
    """A user reward function that costs SLEEP_MS per call (a stand-in for a slow judge)."""
    time.sleep(SLEEP_MS / 1000)
    return [float(c.strip() == a.strip()) for c, a in zip(completions, answer)]


class InlineScorer:
    """Baseline: score in the caller's thread, blocking generation (no pool)."""

    def __init__(self, cfg, task):
        from reroll.verifiers import build_reward

        self.reward = build_reward(cfg.reward.verifiers, task.verifier)

    def submit(self, rollout, example) -> Future:
        f: Future = Future()
        f.set_result(self.reward(rollout, example))
        return f

    def combine(self, scores):
        return self.reward.combine(scores)

    def close(self):
        pass

    def stats(self):
        return {}


def run(label: str, out: Path, steps: int, extra: list[str]) -> dict:
    from reroll import build_rollout
    from reroll.config import load_config
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    base = ["task.name=longtail", "rollout.group_size=8", "rollout.batch_groups=8",
            "rollout.max_new_tokens=48", "model.max_position=96", "runtime.threads=1",
            "runtime.max_staleness=1", f"train.steps={steps}", "ckpt_every=100000", f"out_dir={out / label}"]
    cfg = load_config(None, base + extra)  # train checks it
    if label == "inline":
        orig = build_rollout.build_scorer
        build_rollout.build_scorer = InlineScorer
        try:
            train(cfg, progress=False)
        finally:
            build_rollout.build_scorer = orig
    else:
        train(cfg, progress=False)
    rows = read_metrics(out / label)[2:]  # skip warm-up steps
    return {k: statistics.fmean(r[k] for r in rows) for k in
            ("time/generate_s", "time/step_s", "time/train_s", "time/wait_for_rollouts_s")}


def main() -> None:
    global SLEEP_MS
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sleep-ms", type=float, default=3.0)
    args = ap.parse_args()
    SLEEP_MS = args.sleep_ms
    import reroll.verifiers.user  # noqa: F401  (the worker imports this module by path)

    out = Path(tempfile.mkdtemp(prefix="reroll-overlap-"))
    res = {
        "fast": run("fast", out, args.steps, ["reward.workers=1"]),
        "slow": run("slow", out, args.steps, ["reward.workers=1",
                                             'reward.verifiers=[{name="python", args={fn="scoring_overlap:slow_exact"}}]']),
        "inline": run("inline", out, args.steps, ["reward.workers=0",
                                                 'reward.verifiers=[{name="python", args={fn="scoring_overlap:slow_exact"}}]']),
    }
    n = 64
    print(f"per step: {n} rollouts, scoring cost {n * SLEEP_MS / 1000:.3f}s if serialised")
    print(f"{'variant':8s} {'generate_s':>10s} {'wait_s':>8s} {'train_s':>8s} {'step_s':>8s}")
    for k, v in res.items():
        print(f"{k:8s} {v['time/generate_s']:10.3f} {v['time/wait_for_rollouts_s']:8.3f} "
              f"{v['time/train_s']:8.3f} {v['time/step_s']:8.3f}")
    f, sl, inl = (res[k]["time/step_s"] for k in ("fast", "slow", "inline"))
    cost = n * SLEEP_MS / 1000
    print(f"step time added by {cost:.3f}s of scoring: pool {sl - f:+.3f}s "
          f"({(sl - f) / cost:+.0%} of the cost), inline {inl - f:+.3f}s "
          f"({(inl - f) / cost:+.0%} of the cost)")
    for k in ("slow", "inline"):
        print(f"generation time {k}/fast: "
              f"{res[k]['time/generate_s'] / res['fast']['time/generate_s']:.2f}x")

if __name__ == "__main__":
    main()

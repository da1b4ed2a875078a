"""The runs `benchmarks/sim_validate.py` measures: the main job's calibration runs and the
predicted variants (their overrides of configs/arithmetic.toml), each one `reroll train` in
a process of its own, named as its run directory is (a train seed k > 0 adds " seedk")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reroll.config_checks import load_checked

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "arithmetic.toml"
BASE = ["log_every=1", "eval.every=0", "ckpt_every=100000", "record_every=1",
        "runtime.threads=1", "reward.workers=0", "runtime.kind=ray", "runtime.pin_cores=true",
        "log.timeline=true"]  # RUN/timeline.json: each update's marks (`step_marks`)
# the long-tail task (`reroll.tasks.longtail`): responses of 1 to 32 tokens
LONGTAIL = ["task.name=longtail", "task.args={n_train=4000, n_test=100, max_count=31}",
            "model.max_position=64", "rollout.max_new_tokens=32"]
VARIANTS = {
    "sync": [],
    "async 1": ["runtime.max_staleness=1"],
    "async 2": ["runtime.max_staleness=2"],
    "async 4": ["runtime.max_staleness=4"],
    "async 2 no partial": ["runtime.max_staleness=2", "runtime.partial_rollouts=false"],
    "async 1 overprovision 2": ["runtime.max_staleness=1", "runtime.overprovision=2.0"],
    "longtail sync": LONGTAIL,
    "longtail async 2": [*LONGTAIL, "runtime.max_staleness=2"],
}
# synchronous runs of two batch sizes and two response lengths (the untrained policy
# writes to max_new_tokens; the full batch with long responses is what separates the cost
# of a decoded token from a sample's fixed cost), then ones that resume many requests
# (partial rollouts, with 12- and 24-token responses: none of the predicted variants)
CALIBRATION = {"cal 16x8": [], "cal 4x8": ["rollout.batch_groups=4"],
               "cal 4x8 long": ["rollout.batch_groups=4", "rollout.max_new_tokens=12"],
               "cal 16x8 long24": ["rollout.max_new_tokens=24"],
               "cal longtail 16x8 long16": [*LONGTAIL, "rollout.max_new_tokens=16"],
               "cal async 1 long": ["runtime.max_staleness=1", "rollout.max_new_tokens=12"],
               "cal async 1 long24": ["runtime.max_staleness=1", "rollout.max_new_tokens=24"],
               # the long-tail task's requests are resumed with prefixes about twice the main
               # job's (23 tokens against 10.5, which both runs above resume with): without
               # it, a resumed token's cost and a request's are not told apart
               "cal longtail async 1": [*LONGTAIL, "runtime.max_staleness=1"]}
# with --update-cost fit: a run that resumes about twice as many requests a step as the two
# above, which tells an update's own cost (``update_s``) from a request's
UPDATE_CAL = {"cal async 2 long": ["runtime.max_staleness=2", "rollout.max_new_tokens=12"]}
ALL_CAL = {**CALIBRATION, **UPDATE_CAL}
SYNC_CAL = 5  # the synchronous ones come first; the rest resume (partial rollouts)


def train(out: Path, name: str, overrides: list[str], steps: int,
          reuse: bool = False) -> Path | None:
    """One real run of the main job through `reroll train`, in its own process; a run
    whose metrics.jsonl is already in ``out`` is not run again. ``reuse``: none is run (None
    where it is missing)."""
    d = out / name.replace(" ", "_")
    args = [str(CONFIG), *BASE, *overrides, f"train.steps={steps}", f"out_dir={d}"]
    if reuse and not (d / "metrics.jsonl").exists():
        return None
    if not (d / "metrics.jsonl").exists():
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "reroll.cli", "train", *args, "--no-progress"],
                       check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return d


def task_of(overrides: list[str]) -> str:
    """The task a variant's or calibration run's overrides train on."""
    return load_checked(str(CONFIG), [*BASE, *overrides]).task.name


def seeded(name: str, seed: int) -> str:
    """A run's name at a train seed (seed 0's is the name itself, as the variants')."""
    return name if seed == 0 else f"{name} seed{seed}"


def cal_name(run: str) -> str:
    """A calibration run's name without its seed ("cal 4x8 seed2" -> "cal 4x8")."""
    head, _, tail = run.rpartition(" seed")
    return head if head and tail.isdigit() else run

"""Fault injection for real `reroll train` runs (shared by tests/faults and
benchmarks/faults.py): start the CLI in a subprocess, kill it with SIGKILL at a chosen moment
(a random time, inside a checkpoint write, inside a resume's log truncation), resume until the
run finishes, then count what was lost or done twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
        "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
        "rollout.max_new_tokens=6", "reward.workers=0", "log_every=1", "train.lr=3e-4",
        "runtime.threads=1", "ckpt_every=2"]


@dataclass
class Trial:
    kills: list[str] = field(default_factory=list)  # where each kill landed
    resumes: int = 0
    steps: int = 0
    batch: int = 4
    rows: list[int] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    consumed: int = 0
    buffered_lost: int = 0

    @property
    def rows_lost(self) -> int:
        return len(set(range(1, self.steps + 1)) - set(self.rows))

    @property
    def rows_twice(self) -> int:
        return len(self.rows) - len(set(self.rows))

    @property
    def groups_lost(self) -> int:
        return self.steps * self.batch - len(set(self.group_ids)) + self.buffered_lost

    @property
    def groups_twice(self) -> int:
        return len(self.group_ids) - len(set(self.group_ids))

    @property
    def survived(self) -> bool:
        return not (self.rows_lost or self.rows_twice or self.groups_lost or self.groups_twice
                    or self.consumed != self.steps * self.batch)


def _start(out: Path, args: list[str], resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "reroll.cli", "train", "-", *args, f"out_dir={out}",
           "--no-progress"] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _latest_buffer(out: Path) -> set[str]:
    root = out / "checkpoints"
    marker = root / "latest"
    if not marker.is_file():
        return set()
    buf = root / marker.read_text().strip() / "buffers.jsonl"
    if not buf.is_file():
        return set()
    return {json.loads(x)["group_id"] for x in buf.read_text().splitlines() if x.strip()}


def _wait_kill(proc: subprocess.Popen, out: Path, where: str, at_s: float, timeout: float
               ) -> str | None:
    """Kill ``proc`` at the moment ``where`` names; returns what was hit (None: it ended)."""
    t0 = time.monotonic()
    ck = out / "checkpoints"
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        hit = None
        if where == "random" and time.monotonic() - t0 >= at_s:
            hit = "random"
        elif where == "checkpoint" and ck.is_dir() and any(ck.glob(".tmp_step_*")):
            hit = "inside a checkpoint write"
        elif where == "truncate" and (out / "metrics.jsonl.tmp").exists():
            hit = "inside resume truncation"
        elif where == "init" and (out / ".init.tmp").exists():
            hit = "inside building the initial model"
        if hit:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return hit
        time.sleep(0.0005)
    return None


def run_trial(out: Path, *, seed: int, steps: int = 8, staleness: int = 2,
              plan: tuple[str, ...] = ("random",), timeout: float = 240) -> Trial:
    """Run to the end, killing once per entry of ``plan`` ("random", "checkpoint",
    "truncate"); a planned kill whose moment never came is recorded as "missed (...)"
    (the run then finished by itself)."""
    rng = random.Random(seed)
    args = BASE + [f"train.steps={steps}", f"runtime.max_staleness={staleness}"] + (
        ["runtime.overprovision=1.5"] if staleness else [])
    t = Trial(steps=steps)
    buffered: set[str] = set()  # groups a checkpoint held when a kill came
    finished = False
    for where in plan:
        resume = (out / "config.toml").exists()
        proc = _start(out, args, resume)
        t.resumes += resume
        hit = _wait_kill(proc, out, where, rng.uniform(3.0, 14.0), timeout)
        if hit is None:
            err = proc.communicate(timeout=timeout)[1]
            if proc.returncode != 0:
                raise RuntimeError(f"run failed (exit {proc.returncode}): {err[-2000:]}")
            t.kills.append(f"missed ({where})")
            finished = True
            break
        t.kills.append(hit)
        buffered |= _latest_buffer(out)
    if not finished:
        resume = (out / "config.toml").exists()
        final = _start(out, args, resume)
        t.resumes += resume
        err = final.communicate(timeout=timeout)[1]
        if final.returncode != 0:
            raise RuntimeError(f"final run failed (exit {final.returncode}): {err[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    t.rows = [r["step"] for r in rows if r["step"] > 0]
    t.consumed = int(rows[-1]["pipeline/consumed"]) if rows else 0
    recs = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    t.group_ids = [r["group"]["group_id"] for r in recs]
    went_on = set(t.group_ids) | _latest_buffer(out)
    t.buffered_lost = len(buffered - went_on)
    return t

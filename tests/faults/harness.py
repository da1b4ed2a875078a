"""Fault injection for real `reroll train` runs (shared by tests/faults and
benchmarks/faults.py): start the CLI in a subprocess, kill it with SIGKILL at a chosen moment
(a random time, inside a checkpoint write, inside a resume's log truncation), resume until the
run finishes, then count what was lost or done twice.

``Forker`` starts the CLI by forking a warm interpreter (torch and reroll already imported)
instead of a fresh one: the same `reroll.cli.main` in its own process, killed with SIGKILL
the same way, but without the ~2.5 s of imports, so that many kills fit in a test run."""

from __future__ import annotations

import json
import os
import random
import select
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
    logs_cut: int = 0  # kills inside truncation after which a log was not whole (must be 0)

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


class Forker:
    """A warm interpreter that forks one `reroll train` process per ``start``: use as a
    context manager; ``start(argv, stderr_path)`` returns a Popen-like handle."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--forker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buf = b""
        if self._line(timeout=120) != "ready":
            raise RuntimeError("the fork server did not start")

    def _line(self, timeout: float | None) -> str | None:
        """The next line from the server; None if none came within ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the fork server died (exit {self.proc.wait()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def start(self, argv: list[str], stderr: Path) -> _Forked:
        self.proc.stdin.write((json.dumps([argv, str(stderr)]) + "\n").encode())
        self.proc.stdin.flush()
        return _Forked(self, int(self._line(timeout=60)), stderr)

    def __enter__(self) -> Forker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class _Forked:
    """What `_wait_kill` and `run_trial` use of a Popen, for a process the server forked."""

    def __init__(self, server: Forker, pid: int, stderr: Path):
        self.server, self.pid, self.stderr, self.returncode = server, pid, stderr, None

    def poll(self, timeout: float = 0.0) -> int | None:
        if self.returncode is None:
            line = self.server._line(timeout)
            if line is not None:
                self.returncode = int(line.split()[1])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll(timeout) is None:
            raise subprocess.TimeoutExpired("forked reroll train", timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        self.wait(timeout)
        return None, self.stderr.read_text()


def _serve() -> None:
    """The fork server (``harness.py --forker``): one JSON line [argv, stderr path] per run;
    answers the child's pid, then ``exit CODE`` when it ends (-9 when killed by SIGKILL)."""
    import contextlib
    import tempfile

    import torch  # noqa: F401  everything a run imports, so that children start warm
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401

    import reroll.build  # noqa: F401
    import reroll.loop  # noqa: F401
    import reroll.runtime.compose  # noqa: F401
    import reroll.runtime.local  # noqa: F401
    from reroll.cli import main
    from reroll.config_checks import load_checked
    from reroll.models import tiny

    with tempfile.TemporaryDirectory() as d, open(os.devnull, "w") as null, \
            contextlib.redirect_stderr(null):  # transformers imports the model's code lazily
        tiny.load(tiny.build_tiny(load_checked(None, BASE).model, d))

    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin:
        argv, err = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the run: its own stdio, the server's pipes closed
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
                sys.stdin = open(os.devnull)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        out.write(f"{pid}\n".encode())
        out.flush()
        status = os.waitpid(pid, 0)[1]
        out.write(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        out.flush()


def _start(out: Path, args: list[str], resume: bool, forker: Forker | None = None):
    argv = ["train", "-", *args, f"out_dir={out}", "--no-progress"] + (
        ["--resume"] if resume else [])
    if forker is not None:
        return forker.start(argv, out.parent / f".{out.name}.stderr")
    return subprocess.Popen([sys.executable, "-m", "reroll.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _latest_buffer(out: Path) -> set[str]:
    root = out / "checkpoints"
    marker = root / "latest"
    if not marker.is_file():
        return set()
    buf = root / marker.read_text().strip() / "buffers.jsonl"
    if not buf.is_file():
        return set()
    return {json.loads(x)["group_id"] for x in buf.read_text().splitlines() if x.strip()}


def _pad_logs(out: Path, mb: float) -> None:
    """Append ``mb`` MB of rows from after any checkpoint to metrics.jsonl (a long run's log
    whose tail a resume must cut): the resume's truncation then lasts long enough to be hit.
    (Recorded rollouts are one file per step, which a resume deletes whole.)"""
    p = out / "metrics.jsonl"
    if not p.is_file() or mb <= 0:
        return
    row: dict = {}
    for x in reversed(p.read_text().splitlines()):  # the last whole row (a kill may cut one)
        try:
            row = json.loads(x)
            break
        except ValueError:
            continue
    row["step"] = 10**9  # after any checkpoint: the truncation drops it
    line = (json.dumps(row) + "\n").encode()
    with open(p, "ab") as f:
        if p.stat().st_size and not p.read_bytes().endswith(b"\n"):
            f.write(b"\n")
        f.write(line * max(1, int(mb * 2**20 / len(line))))


def _wait_kill(proc, out: Path, where: str, at_s: float, timeout: float) -> str | None:
    """Kill ``proc`` at the moment ``where`` names; returns what was hit (None: it ended)."""
    t0 = time.monotonic()
    ck = out / "checkpoints"
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        hit = None
        if where == "random" and time.monotonic() - t0 >= at_s:
            hit = "random"
        elif where == "checkpoint" and ck.is_dir() and any(ck.glob(".tmp_step_*")):
            hit = "inside a checkpoint write"
        elif where == "truncate" and ((out / "metrics.jsonl.tmp").exists()
                                      or (out / "rollouts.jsonl.tmp").exists()):
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
              plan: tuple[str, ...] = ("random",), timeout: float = 240,
              kill_s: tuple[float, float] = (3.0, 14.0), pad_mb: float = 8.0,
              extra: tuple[str, ...] = (), forker: Forker | None = None) -> Trial:
    """Run to the end, killing once per entry of ``plan`` ("random": at a time drawn from
    ``kill_s`` after the process started; "checkpoint", "truncate", "init": inside that
    window); a planned kill whose moment never came is recorded as "missed (...)" (the run
    then finished by itself). Before a "truncate" resume the logs get ``pad_mb`` MB of rows
    to cut, and after a kill inside the truncation both logs must still be whole."""
    rng = random.Random(seed)
    args = BASE + [f"train.steps={steps}", f"runtime.max_staleness={staleness}"] + (
        ["runtime.overprovision=1.5"] if staleness else []) + list(extra)
    t = Trial(steps=steps)
    buffered: set[str] = set()  # groups a checkpoint held when a kill came
    finished = False
    for where in plan:
        resume = (out / "config.toml").exists()
        logs = {}
        if where == "truncate" and resume:
            _pad_logs(out, pad_mb)
            logs = {n: (out / n).read_bytes() for n in ("metrics.jsonl", "rollouts.jsonl")
                    if (out / n).is_file()}
        proc = _start(out, args, resume, forker)
        t.resumes += resume
        hit = _wait_kill(proc, out, where, rng.uniform(*kill_s), timeout)
        if hit is None:
            err = proc.communicate(timeout=timeout)[1]
            if proc.returncode != 0:
                raise RuntimeError(f"run failed (exit {proc.returncode}): {err[-2000:]}")
            t.kills.append(f"missed ({where})")
            finished = True
            break
        t.kills.append(hit)
        if hit == "inside resume truncation":  # each log is the original or its cut, whole
            for name, before in logs.items():
                now = (out / name).read_bytes()
                kept = b"".join(x + b"\n" for x in before.splitlines()
                                if x.strip() and _step_of(x) <= _ckpt_step(out))
                t.logs_cut += now not in (before, kept)
        buffered |= _latest_buffer(out)
    if not finished:
        resume = (out / "config.toml").exists()
        final = _start(out, args, resume, forker)
        t.resumes += resume
        err = final.communicate(timeout=timeout)[1]
        if final.returncode != 0:
            raise RuntimeError(f"final run failed (exit {final.returncode}): {err[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    t.rows = [r["step"] for r in rows if r["step"] > 0]
    t.consumed = int(rows[-1]["pipeline/consumed"]) if rows else 0
    from reroll.runlog import read_rollouts

    t.group_ids = [g["group_id"] for _, g in read_rollouts(out)]
    went_on = set(t.group_ids) | _latest_buffer(out)
    t.buffered_lost = len(buffered - went_on)
    return t


def _step_of(line: bytes) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


def _ckpt_step(out: Path) -> int:
    marker = out / "checkpoints" / "latest"
    if not marker.is_file():
        return 0
    state = out / "checkpoints" / marker.read_text().strip() / "state.json"
    return json.loads(state.read_text()).get("step", 0) if state.is_file() else 0


if __name__ == "__main__" and sys.argv[1:] == ["--forker"]:
    _serve()

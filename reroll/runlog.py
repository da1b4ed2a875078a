"""The run directory: resolved config, metrics.jsonl, TensorBoard events, recorded rollouts
(the Parquet rollout store under ``RUN/rollouts/``, `reroll.recording.store`).

Owns the rules that protect finished work and a user's files (`claim`, the one place they
are enforced): a run directory is either new and empty, or reroll's own (it holds the marker
file ``.reroll`` that reroll writes when it first takes the directory); never the current
directory by accident (``out_dir`` empty or "."), never a directory holding files reroll did
not write (refused, naming a few of them), never a file; ``~`` is the user's home; a
directory that cannot be written is a clear error. A directory that already holds a run is
never overwritten (resume it or choose another), and resuming with a config that differs in what
shapes the run (model, task, algorithm, rollout) is refused with the differing keys named.
One process at a time holds a run directory (an flock on ``RUN/.lock``, released by the
kernel when the holder dies, so a lock left by kill -9 is never stale). A run directory
holds a run only once the run has started (``commit`` writes ``config.toml`` after the
components are built), so a failed start leaves nothing that blocks the corrected command.
Resume truncation rewrites the logs atomically, and TensorBoard purges the replayed steps.
TensorBoard is imported only here; Weights & Biases (``log.wandb``) only in
`reroll.wandb_log`, when enabled.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from reroll.config import ConfigError, RunConfig, build, dump_toml, read_toml, to_dict

# Keys that may change between a run and its resume (they do not change what is learned;
# train.steps and train.schedule_steps only where they keep a decaying lr schedule's end, below:
# a constant schedule runs on with more train.steps; a decaying one cannot be extended,
# as its learning rate is 0 after its end; docs/runs.md).
RESUMABLE = {"train.steps", "train.schedule_steps", "log_every", "ckpt_every", "record_every",
             "eval", "out_dir", "runtime.threads", "runtime.engine_threads", "runtime.kind", "runtime.engine_workers",
             "runtime.scoring_workers", "runtime.engine_gpus", "runtime.trainer_gpus",
             "log",  # local and Ray runs are bitwise equal
             "runtime.deterministic", "train.fused_optimizer",  # which kernels
             "engine.device", "model.device",  # where each side runs, as runtime.*_gpus
             # where the engine servers are and how to reach them (a served run equals the
             # in-process one; servers move between a stop and a resume)
             "engine.base_url", "engine.api_key", "engine.timeout_s", "engine.weights_dir"}


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = prefix + k
        if isinstance(v, dict) and v and k not in ("args",) and not k.endswith("_args"):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(old: dict, new: dict) -> list[str]:
    a, b = _flat(old), _flat(new)
    diff = []
    for k in sorted(set(a) | set(b)):
        if any(k == r or k.startswith(r + ".") for r in RESUMABLE):
            continue
        if a.get(k) != b.get(k):
            diff.append(f"{k}: {a.get(k)!r} -> {b.get(k)!r}")
    was, now = _decay_horizon(a), _decay_horizon(b)
    if was != now and not diff:  # train.steps moved the end of the lr decay
        end = (f"the {b.get('train.schedule')} lr decay's end (train.schedule_steps, else train.steps): "
               f"{was} -> {now}; ")
        if now < was:  # a shorter run: the decay keeps its end
            diff.append(end + f"set train.schedule_steps={was} to keep the run's")
        else:  # a longer one: the updates after the end would train at a learning rate of 0
            diff.append(end + f"a decaying schedule cannot be extended (its learning rate is 0 "
                        f"after update {was}): keep train.steps <= {was} with "
                        f"train.schedule_steps={was}, or continue this run's weights in a "
                        f"new run (init={b.get('out_dir')}, a new out_dir) with a schedule "
                        f"of its own")
    return diff


def _decay_horizon(flat: dict[str, Any]) -> int | None:
    """The update at which the learning-rate schedule's decay ends, for a schedule whose
    factor depends on it (trait ``needs_steps`` in `reroll.trainer.schedules.SCHEDULES`);
    None for one that does not (constant lr)."""
    from reroll.trainer.schedules import SCHEDULES

    name = flat.get("train.schedule")
    if name not in SCHEDULES or not SCHEDULES.trait(name, "needs_steps", False):
        return None
    return flat.get("train.schedule_steps") or flat.get("train.steps")


def without_secrets(cfg: RunConfig) -> RunConfig:
    """``cfg`` as a run directory records it: ``engine.api_key`` left empty (read from
    $REROLL_API_KEY when the recorded config is run again), so a bearer token never lands on
    disk beside checkpoints and reports."""
    if not cfg.engine.api_key:
        return cfg
    return replace(cfg, engine=replace(cfg.engine, api_key=""))


MARKER = ".reroll"  # in every directory reroll took as a run directory (see `claim`)


def run_path(out_dir: str, key: str = "out_dir") -> Path:
    """``out_dir`` as a path (``~`` expanded), refused when it names no directory of its own:
    empty, or the current directory."""
    if not str(out_dir).strip():
        raise ConfigError(f"{key} is empty: name the run's own directory (e.g. {key}=runs/x); "
                          f"reroll never writes a run into the current directory")
    path = Path(str(out_dir)).expanduser()
    if path.resolve() == Path.cwd().resolve() and not (path / MARKER).is_file():
        raise ConfigError(f"{key} = {str(out_dir)!r} is the current directory "
                          f"({Path.cwd()}): name the run's own directory (e.g. {key}=runs/x)")
    return path


def claim(out_dir: str, key: str = "out_dir") -> Path:
    """The run directory ``out_dir`` names, if reroll may write a run there (it writes
    nothing yet: `mark` does), else a `ConfigError` saying why not: a file, or a directory
    holding files reroll did not write (a few named)."""
    path = run_path(out_dir, key)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is a file, not a directory; name a new "
                          f"directory for the run")
    if path.is_dir() and not (path / MARKER).is_file():
        foreign = sorted(p.name for p in path.iterdir())
        if foreign and not _legacy_run(path):
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                              if len(foreign) > 5 else "")
            raise ConfigError(f"{key} = {str(path)!r} holds files reroll did not write "
                              f"({shown}); reroll writes a run only into a new or empty "
                              f"directory: choose another {key}")
    return path


def mark(path: Path, key: str = "out_dir") -> None:
    """Create the run directory ``path`` (`claim`ed) and its marker, or a `ConfigError` when
    it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not (path / MARKER).is_file():
            (path / MARKER).write_text("a run directory of reroll\n")
    except OSError as e:
        raise ConfigError(f"{key} = {str(path)!r} cannot be written "
                          f"({e.strerror or e}); choose a directory you can write") from None


def _legacy_run(path: Path) -> bool:
    """A run written before the marker: its config.toml reads as a reroll config and it has
    checkpoints, or an sft run's model/."""
    if not (path / "config.toml").is_file() or not (
            (path / "checkpoints").is_dir() or (path / "model").is_dir()):
        return False
    try:
        build(RunConfig, read_toml(path / "config.toml"))
    except Exception:  # not reroll's
        return False
    return True


class RunDir:
    def __init__(self, cfg: RunConfig, resume: bool = False):
        self.path = claim(cfg.out_dir)
        self.cfg = cfg
        cfg_file = self.path / "config.toml"
        if cfg_file.exists():
            if not resume:
                raise ConfigError(f"run directory {str(self.path)!r} already holds a run "
                                  f"({cfg_file}); pass --resume to continue it or set "
                                  f"out_dir to a new directory")
            # the saved config through the dataclasses: a key added to reroll since the run
            # started reads as its default, not as a difference
            saved = to_dict(build(type(cfg), read_toml(cfg_file)))
            diff = config_diff(json.loads(json.dumps(saved)),
                               json.loads(json.dumps(to_dict(cfg))))
            if diff:
                raise ConfigError(f"cannot resume {self.path}: the config differs from the "
                                  f"run's in: " + "; ".join(diff))
        elif resume:
            raise ConfigError(f"--resume: {str(self.path)!r} holds no run to resume")
        mark(self.path)
        self._lock = _lock(self.path)
        self._metrics = None
        self._tb = None
        self._rollouts = None
        self._wandb = None
        self._purge: int | None = None
        self.t0 = time.time()

    def commit(self) -> None:
        """The run has started: from now on the directory holds it (config.toml)."""
        tmp = self.path / "config.toml.tmp"
        tmp.write_text(dump_toml(without_secrets(self.cfg)))
        tmp.replace(self.path / "config.toml")

    def truncate(self, step: int) -> None:
        """On resume from the checkpoint at ``step``: forget rows logged after it (they belong
        to updates the checkpoint does not contain and will be redone)."""
        if (self.path / "rollouts").is_dir():
            self._store().truncate(step)  # whole files go: a kill mid-way leaves no torn one
        for name in ("metrics.jsonl", "rollouts.jsonl"):  # rollouts.jsonl: runs before the store
            p = self.path / name
            if not p.exists():
                continue
            tmp = p.with_name(p.name + ".tmp")  # a kill mid-way leaves the original whole
            with open(p) as src, open(tmp, "w") as dst:
                for line in src:
                    if line.strip() and _step_of(line) <= step:
                        dst.write(line if line.endswith("\n") else line + "\n")
                dst.flush()
                os.fsync(dst.fileno())
            tmp.replace(p)
        self._purge = step + 1  # TensorBoard drops events of the steps that will be redone

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self._metrics is None:
            self._metrics = open(self.path / "metrics.jsonl", "a")
        row = {"step": step, "time": round(time.time() - self.t0, 3), **metrics}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._tensorboard(step, metrics)
        if self.cfg.log.wandb:
            if self._wandb is None:
                from reroll.wandb_log import WandbLogger

                self._wandb = WandbLogger(self.cfg.log, Path(self.cfg.out_dir).name,
                                          to_dict(self.cfg), self.path)
            self._wandb.log(step, metrics)

    def _tensorboard(self, step: int, metrics: dict[str, float]) -> None:
        """The row's scalars as ONE TensorBoard event (a summary of many values, which
        TensorBoard reads as one scalar per tag): ``add_scalar`` per key queued an event each,
        and its queue of 10 made the training thread wait on the writer thread every row
        (15% of the main thread's wall time at ``log_every = 1``, py-spy)."""
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"), purge_step=self._purge)
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()
                  if isinstance(v, (int, float))]
        if values:
            self._tb._get_file_writer().add_summary(Summary(value=values), step)

    def record(self, step: int, groups) -> None:
        """Store the groups consumed by ``step`` in the rollout store (``RUN/rollouts/``, one
        Parquet file per step; replayable under another estimator with `reroll replay`)."""
        self._store().append(step, groups)

    def _store(self):
        if self._rollouts is None:
            from reroll.recording.store import RolloutStore  # pyarrow only when recording

            self._rollouts = RolloutStore(self.path)
        return self._rollouts

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _lock(path: Path):
    """Hold ``path/.lock`` (flock) for this process, or refuse naming the holder."""
    try:
        f = open(path / ".lock", "a+")
    except OSError as e:
        raise ConfigError(f"out_dir = {str(path)!r} cannot be written ({e.strerror or e}); "
                          f"choose a directory you can write") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ConfigError(f"run directory {str(path)!r} is in use by {holder}; wait for it "
                          f"to finish or stop it (one process per run directory)") from None
    f.seek(0)
    f.truncate()
    f.write(f"process {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def _step_of(line: str) -> float:
    """The step of a JSONL row; a row cut short by a kill counts as after any checkpoint."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return float("inf")


def read_rollouts(run_dir: str | Path) -> list[tuple[int, dict]]:
    """(step, group as a dict) for every recorded group, in training order: the rollout
    store's, after the rows of a ``rollouts.jsonl`` that a run made before the store."""
    p = Path(run_dir) / "rollouts.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
    out = [(r["step"], r["group"]) for r in rows]
    if (Path(run_dir) / "rollouts").is_dir():
        from reroll.recording.store import RolloutStore

        out += [(s, g.to_dict()) for s, g in RolloutStore(run_dir).groups()]
    return out


def read_metrics(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []

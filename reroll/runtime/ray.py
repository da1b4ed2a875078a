"""The Ray runtime: engine replicas and the trainer as Ray actors behind the EngineCore and
TrainerHandle interfaces, so the same rollout pipeline, workflows and loop drive them
(`components` is what `reroll.runtime.compose.run` gets from here). With `ray_trainer.py`
(the trainer actor), `ray_scoring.py` (scoring actors behind the scorer interface) and
`ray_placement.py` (starting Ray, GPU placement), the only modules that import ray.

- `EngineActor` wraps a `TorchEngine` built from a model directory in its own process.
- `RayEnginePool` spreads requests over the actors (least loaded first), steps them in
  parallel, publishes weights once per version through the object store, and keeps a copy
  of every request it handed out: when an actor dies, a fresh actor is started with the
  current weights and that actor's in-flight requests are re-queued from their last known
  prefix, so nothing is lost (counted in `stats()["requeued"]`). New weights may come as an
  object-store reference (from the trainer actor): they then never pass through the driver.
  They may be partial (a LoRA publish after the first): the pool keeps the last full state
  dict it published next to the latest, and a fresh actor loads both, in that order.
- `TrainerActor` and `RayTrainer` (`reroll.runtime.ray_trainer`): the trainer in an actor
  that writes the checkpoints itself, and the driver's `TrainerHandle` for it.

GPUs: with `runtime.engine_gpus` / `runtime.trainer_gpus` > 0 each engine actor / the trainer
actor reserves that many (fractions share one), Ray places it where they are free and shows
it only those, and its model goes on the first; a reservation the cluster can never meet is
refused before any actor starts, where Ray would leave the actor pending
(`reroll.runtime.ray_placement`). `placement()` on the pool and the trainer says where each
actor landed.

Install with `pip install reroll[ray]`. Ray is started locally (`ray.init`) when no cluster
is connected; on this 2-core machine it adds overhead, not speed: the local runtime is the
default and this one exists to scale out.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from reroll.config import RunConfig
from reroll.devices import engine_device, resolve_device
from reroll.rollout import Rollout
from reroll.runtime.ray_placement import actor_device, check_gpus, init_ray, placement
from reroll.runtime.ray_trainer import RayTrainer, TrainerActor

__all__ = ["EngineActor", "RayEnginePool", "RayTrainer", "TrainerActor", "components",
           "init_ray"]


def _as_ref(state_dict):
    """One copy of the weights in the object store for all engine actors."""
    return state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)


@ray.remote
class EngineActor:
    def __init__(self, model_dir: str, dtype: str, max_batch: int, threads: int,
                 engine_name: str, keep_memory: bool, version: int, state_dict=None,
                 device: str = "cpu", deterministic: bool = False, gpus: float = 0.0,
                 pin: tuple[int, int] | None = None, gc_freeze: bool = False):
        import torch

        from reroll.engine import ENGINES
        from reroll.memory import keep_freed_memory
        from reroll.models import load

        torch.set_num_threads(threads)
        if pin is not None:  # runtime.pin_cores: (this replica's index, engine workers)
            from reroll.runtime.cores import pin as pin_core

            pin_core(*pin)
        if keep_memory:  # runtime.keep_freed_memory, in this actor's own process
            keep_freed_memory()
        if deterministic:  # runtime.deterministic, likewise
            from reroll.build import deterministic_kernels

            deterministic_kernels()
        model, tok = load(model_dir, dtype)
        self.names = frozenset(model.state_dict())
        # `model.device`: resolved in the driver, or here where the actor reserved GPUs
        self.device = actor_device(device, gpus, "engine.device (else model.device)")
        model = model.to(self.device)
        self.engine = ENGINES.get(engine_name)(model, tok, max_batch=max_batch, version=version)
        if state_dict is not None:  # merged, or in LoRA adapter form: the engine's own load
            self.engine.update_weights(state_dict, version)
        if gc_freeze:  # runtime.gc_freeze: this actor's set-up is never scanned again
            from reroll.memory import freeze_heap

            freeze_heap()

    def add(self, rollouts: list[Rollout], turns=None) -> None:
        self.engine.add(rollouts, turns)

    def step(self) -> list[Rollout]:
        return self.engine.step()

    def abort(self, sample_ids=None) -> list[Rollout]:
        return self.engine.abort(sample_ids)

    def update_weights(self, state_dict, version: int) -> bool:
        """Load them (`TorchEngine.update_weights`); whether they held every tensor."""
        self.engine.update_weights(state_dict, version)
        return self.names <= state_dict.keys()

    def stats(self) -> dict:
        return self.engine.stats()

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict[str, Any]:
        return placement(self.device)


class RayEnginePool:
    """`EngineCore` over `workers` EngineActor replicas (an `EngineService` drives it)."""

    def __init__(self, model_dir: str | Path, *, workers: int = 1, dtype: str = "float32",
                 max_batch: int = 64, threads: int = 1, version: int = 0, state_dict=None,
                 engine: str = "torch", keep_memory: bool = True, device: str = "cpu",
                 deterministic: bool = False, gpus: float = 0.0, pin_cores: bool = False,
                 gc_freeze: bool = False):
        """``gpus``: GPUs each actor reserves (`runtime.engine_gpus`); ``device`` is then
        resolved in the actor, among the GPUs Ray gives it. ``pin_cores``: actor i is pinned
        to core i (`runtime.pin_cores`, `reroll.runtime.cores`)."""
        init_ray(workers)
        self.args = (str(model_dir), dtype, max_batch, threads, engine, keep_memory)
        self.device, self.deterministic, self.gpus = str(device), deterministic, gpus
        self.workers, self.pin_cores, self.gc_freeze = workers, pin_cores, gc_freeze
        self.version = version
        # the last full state dict published (None: the model directory's weights are the
        # base) and the latest one, which may hold some tensors only
        self._full = self._weights = _as_ref(state_dict) if state_dict is not None else None
        self.actors = [self._spawn(i) for i in range(workers)]
        self.inflight: list[dict[str, Rollout]] = [{} for _ in self.actors]
        self.turns: dict[str, tuple[int, int] | None] = {}  # sample id -> its call's turn
        self.requeued = 0
        self.restarts = 0
        self._stats: dict[str, float] = {}
        self._adds: list[tuple] = []  # (replica, actor, ref, sample ids) not yet confirmed

    def _spawn(self, i: int):
        """A fresh actor (replica ``i``) holding the current weights: the last full ones, then
        the latest."""
        actor = EngineActor.options(num_gpus=self.gpus).remote(
            *self.args, self.version, self._full, self.device, self.deterministic, self.gpus,
            (i, self.workers) if self.pin_cores else None, self.gc_freeze)
        if self._weights is not self._full:  # waited for: a refusal is raised here
            ray.get(actor.update_weights.remote(self._weights, self.version))
        return actor

    def placement(self) -> list[dict[str, Any]]:
        """Where each engine actor runs (`placement`)."""
        return [ray.get(a.placement.remote()) for a in self.actors]

    # ---- EngineCore interface ----------------------------------------------------------
    def add(self, rollouts: list[Rollout], turns=None) -> None:
        by_group: dict[str, list[Rollout]] = {}
        for j, r in enumerate(rollouts):  # keep a group together so its prefill is shared
            by_group.setdefault(r.group_id, []).append(r)
            self.turns[r.sample_id] = turns[j] if turns else None
        # not waited for here: an actor runs one caller's calls in order, so its next step,
        # abort or weight update comes after them, and `_confirm_adds` raises their errors
        # before it (a round trip a group held the event loop 30 ms for 16 groups)
        for rs in by_group.values():
            i = min(range(len(self.actors)), key=lambda k: len(self.inflight[k]))
            new = [r.sample_id for r in rs if r.sample_id not in self.inflight[i]]
            for r in rs:
                self.inflight[i][r.sample_id] = copy.deepcopy(r)
            actor = self.actors[i]
            self._adds.append((i, actor, actor.add.remote(rs, [self.turns[r.sample_id]
                                                              for r in rs]), new))

    def _confirm_adds(self) -> None:
        """Wait for the adds sent so far; an actor found dead is replaced once (its
        requests, these adds' included, re-queued); an add the engine refused leaves its
        requests out of the pool's records, and the first such error is raised once every
        add has been looked at."""
        adds, self._adds = self._adds, []
        failed: BaseException | None = None
        for i, actor, ref, ids in adds:  # every one looked at, whatever an earlier raised
            try:
                ray.get(ref)
            except RayActorError:
                if self.actors[i] is actor:  # the first of its calls to fail
                    self._replace(i)
            except Exception as e:  # the engine refused it: its new requests are not there
                for sid in ids:
                    self.inflight[i].pop(sid, None)
                failed = failed or e
        if failed is not None:
            raise failed

    def pending(self) -> int:
        return sum(len(x) for x in self.inflight)

    def step(self) -> list[Rollout]:
        self._confirm_adds()
        busy = [i for i in range(len(self.actors)) if self.inflight[i]]
        refs = {i: self.actors[i].step.remote() for i in busy}
        done: list[Rollout] = []
        for i, ref in refs.items():
            try:
                finished = ray.get(ref)
            except RayActorError:
                self._replace(i)
                continue
            for r in finished:
                self.inflight[i].pop(r.sample_id, None)
                self.turns.pop(r.sample_id, None)
            done += finished
        return done

    def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        self._confirm_adds()
        out = []
        for i in range(len(self.actors)):
            try:
                part = self._call(i, "abort", sample_ids)
            except RayActorError:
                part = []
            for r in part or []:
                self.inflight[i].pop(r.sample_id, None)
            out += part or []
        return out

    def sync(self) -> list[Rollout]:
        """Copies of every in-flight record, up to date: the actors' requests are aborted
        and added back (a remote record cannot be read without stopping it)."""
        aborted = self.abort()
        for r in aborted:
            r.finish = "running"
            self.add([r], [self.turns.get(r.sample_id)])
        return [copy.deepcopy(r) for r in aborted]

    def update_weights(self, state_dict, version: int) -> None:
        """``state_dict``: a dict of tensors, or an object-store reference to one; every
        tensor of the model, or some (`TorchEngine.update_weights`)."""
        self._confirm_adds()
        self._weights = _as_ref(state_dict)
        self.version = version
        full = [self._call(i, "update_weights", self._weights, version)
                for i in range(len(self.actors))]
        if any(full):  # else the last full dict stays, the new one loaded over it
            self._full = self._weights

    def stats(self) -> dict[str, float]:
        agg: dict[str, float] = {}
        for a in self.actors:
            try:
                for k, v in ray.get(a.stats.remote()).items():
                    agg[k] = agg.get(k, 0.0) + float(v)
            except RayActorError:
                pass
        for k in ("tokens_generated",):  # keep counters monotonic across actor restarts
            self._stats[k] = max(self._stats.get(k, 0.0), agg.get(k, 0.0))
            agg[k] = self._stats[k]
        agg["requeued"], agg["restarts"] = float(self.requeued), float(self.restarts)
        agg["mean_occupancy"] = agg.get("mean_occupancy", 0.0) / max(1, len(self.actors))
        return agg

    # ---- fault handling -----------------------------------------------------------------
    def _call(self, i: int, method: str, *args):
        try:
            return ray.get(getattr(self.actors[i], method).remote(*args))
        except RayActorError:
            self._replace(i)  # requests it held were recorded and are re-queued there
            return None

    def _replace(self, i: int) -> None:
        """Actor i died: start a new one with the current weights, re-queue its requests."""
        lost = list(self.inflight[i].values())
        self.restarts += 1
        self.actors[i] = self._spawn(i)
        self.inflight[i] = {}
        for r in lost:
            r.finish = "running"
        if lost:
            self.requeued += len(lost)
            self.add(lost, [self.turns.get(r.sample_id) for r in lost])

    def kill_worker(self, i: int = 0) -> int:
        """Kill actor i's process (for fault-injection tests); returns its pid."""
        pid = ray.get(self.actors[i].pid.remote())
        ray.kill(self.actors[i], no_restart=True)
        return pid

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a, no_restart=True)


# ---- the composition ----------------------------------------------------------------------
def components(cfg: RunConfig, init_dir: Path, ckpt: Path | None, tok, task):
    """Trainer actor, engine actors (started with the trainer's weights, by reference) and
    scorer (scoring actors with `runtime.scoring_workers`, else a local process pool) for
    ``task`` (the run's, built once by `reroll.runtime.compose.run`; the actors load their
    own tokenizer from ``init_dir``)."""
    from reroll import build, build_rollout
    from reroll.runtime.compose import Components

    init_ray(max(1, cfg.runtime.engine_workers))
    check_gpus(cfg)
    trainer = RayTrainer(cfg, init_dir, ckpt)
    workers = max(1, cfg.runtime.engine_workers)
    gpus, device = cfg.runtime.engine_gpus, engine_device(cfg)
    core = RayEnginePool(init_dir, workers=workers, dtype=cfg.model.dtype,
                         max_batch=-(-build.engine_slots(cfg) // workers),
                         version=trainer.version, threads=build.engine_threads(cfg),
                         state_dict=trainer.weights(), engine=cfg.engine.name,
                         keep_memory=cfg.runtime.keep_freed_memory,
                         deterministic=cfg.runtime.deterministic, gpus=gpus,
                         pin_cores=cfg.runtime.pin_cores, gc_freeze=cfg.runtime.gc_freeze,
                         device=device if gpus > 0 else resolve_device(device))
    if cfg.runtime.pin_cores:  # the driver steps the engines and scores: generation's core
        from reroll.runtime.cores import pin_driver

        trainer.on_close.append(pin_driver(workers))
    if cfg.runtime.scoring_workers > 0 and build_rollout.uses_verifiers(cfg):
        from reroll.runtime.ray_scoring import RayScoringPool

        scorer = RayScoringPool(cfg.reward.verifiers, task.verifier,
                                actors=cfg.runtime.scoring_workers, workers=cfg.reward.workers,
                                timeout_s=cfg.reward.timeout_s,
                                max_worker_crashes=cfg.reward.max_worker_crashes)
    else:
        scorer = build_rollout.build_scorer(cfg, task)
    return Components(trainer=trainer, engine_core=core, scorer=scorer)

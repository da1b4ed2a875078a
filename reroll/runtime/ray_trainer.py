"""The trainer of the Ray runtime (`reroll.runtime.ray`): `TrainerActor` builds the policy,
reference model, objective and `Trainer` with `reroll.build.build_trainer` (the same function
the local runtime uses) in its own process and writes checkpoints itself (on a multi-node
cluster the run directory must be shared storage); `RayTrainer` is the driver's
`TrainerHandle` for it. If the actor dies the run stops with an error naming it; the
checkpoints already written are intact and `--resume` continues from the last one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from reroll.config import RunConfig
from reroll.devices import resolve_device
from reroll.rollout import Group
from reroll.runtime.ray_placement import actor_device, init_ray, placement


# num_cpus=0: the actor takes the place of the trainer that ran inside the driver, which Ray
# never counted; reserving a CPU would leave no room for the engine workers on a small box.
@ray.remote(num_cpus=0)
class TrainerActor:
    def __init__(self, cfg: RunConfig, init_dir: str, ckpt: str | None):
        import torch

        from reroll import build

        build.prepare_process(cfg)
        if cfg.runtime.pin_cores:  # the core after the engine replicas'
            from reroll.runtime.cores import pin

            pin(max(1, cfg.runtime.engine_workers), max(1, cfg.runtime.engine_workers))
        torch.manual_seed(cfg.train.seed)
        # `model.device`: resolved in the driver, or here where the actor reserved GPUs
        self.device = actor_device(cfg.model.device, cfg.runtime.trainer_gpus)
        cfg = replace(cfg, model=replace(cfg.model, device=self.device))
        self.trainer = build.build_trainer(cfg, Path(init_dir), Path(ckpt) if ckpt else None)
        if cfg.runtime.gc_freeze:  # this actor's set-up is never scanned again
            from reroll.memory import freeze_heap

            freeze_heap()

    def version(self) -> int:
        return self.trainer.version

    def step(self, groups: list[Group], referenced: set[int] | None = None
             ) -> tuple[dict[str, float], int]:
        return self.trainer.step(groups, referenced), self.trainer.version

    @ray.method(num_returns=2)
    def weights(self, trained_only: bool = False, adapters: bool = False):
        """(version, state dict): stored as returned, before any later update (no clone);
        the caller checks the small version, never fetching the weights. On the CPU (copied
        there from a GPU): the engine actors and the driver load them onto their own device,
        and none has to unpickle CUDA tensors. In the trainer's ``publish_dtype``, as the local
        runtime publishes (bf16 training ships half the bytes); ``trained_only`` and
        ``adapters`` as `Trainer.weights` takes them."""
        from reroll.lora import adapter_state_dict, engine_state_dict, is_lora

        dt, model = self.trainer.publish_dtype, self.trainer.model
        if adapters and is_lora(model):  # cast as `adapter_state_dict` chose
            return self.trainer.version, {
                k: v.to("cpu") for k, v in adapter_state_dict(
                    model, dtype=dt, adapter_only=trained_only).items()}
        sd = {k: v.detach().to("cpu", dt if dt is not None and v.is_floating_point() else None)
              for k, v in engine_state_dict(model, adapted_only=trained_only).items()}
        return self.trainer.version, sd

    def save_checkpoint(self, run_dir: str, step: int, state: dict, groups: list[Group]) -> str:
        return str(self.trainer.save_checkpoint(Path(run_dir), step, state, groups))

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict[str, Any]:
        return placement(self.device)


class RayTrainer:
    """TrainerHandle over a `TrainerActor`. Holds no model, except a lazily loaded copy of
    the current weights when `policy()` is asked for (in-loop evaluation)."""

    def __init__(self, cfg: RunConfig, init_dir: str | Path, ckpt: str | Path | None = None):
        init_ray(max(1, cfg.runtime.engine_workers))
        self.cfg, self.init_dir = cfg, Path(init_dir).resolve()
        # "auto" resolved here, as for the engine actors, unless the actor reserves GPUs of
        # its own: then it decides among those (`actor_device`)
        if cfg.runtime.trainer_gpus <= 0:
            cfg = replace(cfg, model=replace(cfg.model, device=resolve_device(cfg.model.device)))
        self.actor = TrainerActor.options(num_gpus=cfg.runtime.trainer_gpus).remote(
            cfg, str(self.init_dir), str(Path(ckpt).resolve()) if ckpt else None)
        try:
            self._version = ray.get(self.actor.version.remote())
        except RayActorError as e:  # build_trainer raised inside the actor
            raise RuntimeError(f"the trainer actor could not start (model {self.init_dir}, "
                               f"checkpoint {ckpt}): {e}") from e
        self._policy = None
        self._policy_version = -1
        self.on_close: list = []  # what the composition undoes when the run ends

    def _get(self, ref):
        try:
            return ray.get(ref)
        except RayActorError as e:
            raise RuntimeError(
                f"the trainer actor died, so the run in {self.cfg.out_dir} stopped at policy "
                f"version {self._version}. Checkpoints already written are intact: run again "
                f"with --resume to continue from the last checkpoint. Cause: {e}") from e

    @property
    def version(self) -> int:
        return self._version

    def step(self, groups: Sequence[Group], referenced: set[int] | None = None
             ) -> dict[str, float]:
        metrics, self._version = self._get(self.actor.step.remote(list(groups), referenced))
        return metrics

    def weights(self, trained_only: bool = False, adapters: bool = False) -> ray.ObjectRef:
        """A reference to the current weights in the object store (not fetched here)."""
        version_ref, weights_ref = self.actor.weights.remote(trained_only, adapters)
        self._get(version_ref)  # raises the clear error if the actor is gone
        return weights_ref

    def save_checkpoint(self, run_dir: Path, step: int, state: dict[str, Any],
                        groups: Sequence[Group]) -> Path:
        path = self.actor.save_checkpoint.remote(str(Path(run_dir).resolve()), step, state,
                                                 list(groups))
        return Path(self._get(path))

    def policy(self):
        """A driver-side model with the trainer's current weights (fetched once per version)."""
        from reroll import build

        if self._policy is None:
            cfg = self.cfg
            if cfg.runtime.trainer_gpus > 0:
                # model.device names the trainer actor's GPUs, which the driver may not have
                # and must not take (on one machine its "cuda" is a reserved GPU): the CPU
                cfg = replace(cfg, model=replace(cfg.model, device="cpu"))
            self._policy = build.load_model(self.init_dir, cfg)[0]
        if self._policy_version != self._version:
            self._policy.load_state_dict(self._get(self.weights()))
            self._policy_version = self._version
        return self._policy

    def kill(self) -> int:
        """Kill the trainer actor (for fault-injection tests); returns its pid."""
        pid = self._get(self.actor.pid.remote())
        ray.kill(self.actor, no_restart=True)
        return pid

    def placement(self) -> dict[str, Any]:
        """Where the trainer actor runs (`placement`)."""
        return self._get(self.actor.placement.remote())

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)
        while self.on_close:
            self.on_close.pop()()

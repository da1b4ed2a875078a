"""Starting Ray, and GPU placement of the Ray runtime's actors (`reroll.runtime.ray`).

With `runtime.engine_gpus` / `runtime.trainer_gpus` > 0 an engine actor / the trainer actor
reserves that many GPUs (fractions share one) and Ray shows it only those
(CUDA_VISIBLE_DEVICES): its model goes on the first, resolved inside the actor, since the
driver (on a cluster, often a CPU-only head node) cannot see them. Without a reservation the
actors see every GPU of their node and take `model.device` as the driver resolved it (one
machine, one shared device). A reservation the cluster can never meet is refused before any
actor starts: Ray itself would leave such an actor pending for ever.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from reroll.config import RunConfig
from reroll.config_checks import resolve_device


def init_ray(engine_workers: int) -> None:
    """Start a local Ray instance when none is connected: one CPU per engine worker and one
    for the driver (the trainer actor reserves none, see
    `reroll.runtime.ray_trainer.TrainerActor`)."""
    if not ray.is_initialized():
        # by default the actors reserve no GPU (engines and trainer share the node's);
        # older Ray releases hide every GPU from such actors (CUDA_VISIBLE_DEVICES=""), and
        # model.device=cuda would fail. Actors that reserve GPUs (runtime.engine_gpus,
        # runtime.trainer_gpus) see only theirs. Ray counts this machine's GPUs itself.
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        ray.init(num_cpus=max(2, engine_workers + 1), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


def check_gpus(cfg: RunConfig) -> None:
    """Refuse, before any actor starts, GPU reservations the cluster can never meet (Ray
    would leave such actors pending for ever): runtime.engine_gpus x engine_workers +
    runtime.trainer_gpus against the cluster's GPUs, and each actor's against the largest
    node's (an actor's GPUs are on one node)."""
    rt = cfg.runtime
    workers = max(1, rt.engine_workers)
    want = rt.engine_gpus * workers + rt.trainer_gpus
    if want <= 0:
        return
    total = float(ray.cluster_resources().get("GPU", 0.0))
    nodes = [float(n.get("Resources", {}).get("GPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    largest = max(nodes, default=0.0)
    asked = (f"runtime.engine_gpus = {rt.engine_gpus:g} x {workers} engine worker(s) + "
             f"runtime.trainer_gpus = {rt.trainer_gpus:g} = {want:g} GPU(s)")
    if want > total + 1e-9:
        raise ValueError(f"{asked}, but the Ray cluster has {total:g} GPU(s): lower the "
                         f"reservations or runtime.engine_workers, or add GPU nodes")
    for key, one in (("engine_gpus", rt.engine_gpus), ("trainer_gpus", rt.trainer_gpus)):
        if one > largest + 1e-9:
            raise ValueError(f"runtime.{key} = {one:g} GPUs for one actor, but no node of the "
                             f"Ray cluster has more than {largest:g} (an actor's GPUs are on "
                             f"one node)")


def actor_device(name: str, reserved: float) -> str:
    """The device of a model in this actor: ``name`` resolved here, where Ray has set what
    the actor may see (its reserved GPUs, or with none reserved its node's); a clear error
    when it asks for CUDA and there is none."""
    import torch

    device = resolve_device(name)
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            raise RuntimeError(
                f"model.device = {name!r} in a Ray actor that sees "
                f"{torch.cuda.device_count()} CUDA device(s) (Ray gave it GPU ids {gpus}, "
                f"{reserved:g} reserved; CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__})")
    return device


def placement(device: str) -> dict[str, Any]:
    """Where this actor runs: its node, process, the GPU ids Ray gave it and its device."""
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "device": device,
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

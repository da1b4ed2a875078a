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

from reroll.config import ConfigError, RunConfig
from reroll.devices import cuda_visible, resolve_device


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
    runtime.trainer_gpus against the cluster's GPUs, each actor's against the largest
    node's (an actor's GPUs are on one node), and then all of them packed as Ray places
    them (`packs`)."""
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
        raise ConfigError(f"{asked}, but the Ray cluster has {total:g} GPU(s): lower the "
                          f"reservations or runtime.engine_workers, or add GPU nodes")
    for key, one in (("engine_gpus", rt.engine_gpus), ("trainer_gpus", rt.trainer_gpus)):
        if one > largest + 1e-9:
            raise ConfigError(f"runtime.{key} = {one:g} GPUs for one actor, but no node of "
                              f"the Ray cluster has more than {largest:g} (an actor's GPUs are "
                              f"on one node)")
    if not packs([rt.trainer_gpus] + [rt.engine_gpus] * workers, nodes):
        raise ConfigError(f"{asked} do not fit on the Ray cluster's GPUs ({len(nodes)} "
                          f"node(s) with {', '.join(f'{n:g}' for n in nodes)}): a fraction of a "
                          f"GPU must fit within one GPU beside the others' fractions, a whole "
                          f"number takes that many whole GPUs of one node")


def packs(requests: list[float], nodes: list[float]) -> bool:
    """Whether actors reserving ``requests`` GPUs each fit on nodes with ``nodes`` GPUs, the
    way Ray counts them: a whole number takes that many free GPUs of one node, a fraction
    a share of one GPU (first fit, largest requests first)."""
    free = [[1.0] * int(n) for n in nodes]  # free share of each GPU, by node
    for r in sorted((r for r in requests if r > 0), reverse=True):
        if r >= 1:
            node = next((g for g in free if sum(x >= 1 - 1e-9 for x in g) >= r), None)
            if node is None:
                return False
            for _ in range(int(r)):
                node[next(i for i, x in enumerate(node) if x >= 1 - 1e-9)] = 0.0
        else:
            gpu = next(((g, i) for g in free for i, x in enumerate(g) if x >= r - 1e-9), None)
            if gpu is None:
                return False
            gpu[0][gpu[1]] -= r
    return True


def actor_device(name: str, reserved: float, key: str = "model.device") -> str:
    """The device of a model in this actor: ``name`` resolved here, where Ray has set what
    the actor may see (its reserved GPUs, or with none reserved its node's); a clear error
    when it asks for CUDA and there is none."""
    import torch

    device = resolve_device(name)
    if device.startswith("cuda"):
        if not cuda_visible(device):
            gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            raise RuntimeError(
                f"{key} = {name!r} in a Ray actor that sees "
                f"{torch.cuda.device_count()} CUDA device(s) (Ray gave it GPU ids {gpus}, "
                f"{reserved:g} reserved; CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__})")
    return device


def placement(device: str) -> dict[str, Any]:
    """Where this actor runs: its node, process, the cores it may use, the GPU ids Ray gave
    it and its device."""
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "device": device,
            "cores": sorted(os.sched_getaffinity(0)),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

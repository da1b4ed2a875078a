"""Checkpoints: weights (safetensors via save_pretrained), optimiser, step, RNG, data cursor,
and the runtime's buffers (partial rollouts, ready groups), written atomically.

Layout of ``RUN/checkpoints/step_000123/``: ``model/`` (a loadable model directory, so
`reroll eval` works on any checkpoint), ``optimizer.pt``, ``rng.pt``, ``state.json`` (step,
version, data cursor, counters) and ``buffers.jsonl`` (one Group per line). A checkpoint is
written to a temporary directory and renamed, so a kill during the write leaves the previous
checkpoint intact. Knows nothing of how the buffers are used.

The trainer's process writes the checkpoint (on the Ray runtime, the trainer actor): on a
multi-node cluster the run directory must be on storage that every node shares.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reroll.config import CheckpointError
from reroll.rollout import Group


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save(run_dir: Path, step: int, model, tokenizer, optimizer, state: dict[str, Any],
         groups: list[Group] = (), keep: int = 2, lr_scheduler=None) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler else None},
               tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=1))
    with open(tmp / "buffers.jsonl", "w") as f:
        for g in groups:
            f.write(g.to_json() + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").replace(root / "latest")  # atomic: never an empty marker
    for old in sorted(root.glob("step_*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    marker = root / "latest"
    name = marker.read_text().strip() if marker.is_file() else ""
    if name.startswith("step_") and (root / name).is_dir():
        return root / name
    found = sorted(root.glob("step_*")) if root.is_dir() else []
    return found[-1] if found else None


def check_optimizer_state(ckpt: Path, optimizer, saved: dict[str, Any]) -> None:
    """torch checks only the number of parameters per group; a state tensor of another
    shape (a checkpoint of a different model) would fail later, inside the first update."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for idx, st in saved.get("state", {}).items():
        if not isinstance(idx, int) or idx >= len(params):
            raise CheckpointError(f"checkpoint {ckpt} does not match the model/optimiser the "
                                  f"config builds: optimiser state for parameter {idx}, the "
                                  f"model has {len(params)} parameters")
        for name, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.shape != params[idx].shape:
                raise CheckpointError(
                    f"checkpoint {ckpt} does not match the model/optimiser the config builds: "
                    f"optimiser {name} of parameter {idx} has shape {tuple(v.shape)}, the "
                    f"model's is {tuple(params[idx].shape)}")


def load_trainer_state(ckpt: Path, optimizer, lr_scheduler=None) -> None:
    """Restore optimiser, LR schedule and RNG (in the process that trains)."""
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    check_optimizer_state(ckpt, optimizer, opt["optimizer"])
    try:
        optimizer.load_state_dict(opt["optimizer"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint {ckpt} does not match the model/optimiser the "
                              f"config builds: {e}") from None
    if lr_scheduler is not None and opt.get("lr_scheduler"):
        lr_scheduler.load_state_dict(opt["lr_scheduler"])
    set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))


def read_state(ckpt: Path) -> dict[str, Any]:
    """state.json of a checkpoint: step, version, data cursor, counters."""
    return json.loads((ckpt / "state.json").read_text())


def read_groups(ckpt: Path) -> list[Group]:
    """The unconsumed groups a checkpoint holds (buffers.jsonl)."""
    buf = ckpt / "buffers.jsonl"
    if not buf.is_file():
        return []
    return [Group.from_json(line) for line in buf.read_text().splitlines() if line.strip()]


def load_state(ckpt: Path, optimizer, lr_scheduler=None) -> tuple[dict[str, Any], list[Group]]:
    """Restore optimiser, LR schedule and RNG; return (state.json, buffered groups)."""
    state = read_state(ckpt)
    load_trainer_state(ckpt, optimizer, lr_scheduler)
    return state, read_groups(ckpt)

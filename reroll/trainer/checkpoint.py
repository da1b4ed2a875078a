"""Checkpoints: weights (safetensors via save_pretrained), optimiser, step, RNG, data cursor,
and the runtime's buffers (partial rollouts, ready groups), written atomically.

Layout of ``RUN/checkpoints/step_000123/``: ``model/`` (a loadable model directory, so
`reroll eval` works on any checkpoint), ``optimizer.pt``, ``rng.pt``, ``state.json`` (step,
version, data cursor, counters) and ``buffers.jsonl`` (one Group per line). A checkpoint is
written to a temporary directory and renamed, so a kill during the write leaves the previous
checkpoint intact; ``manifest.json`` (written last) lists every file with its size and
SHA-256, so a checkpoint damaged afterwards (a truncated safetensors file, say) is found
before it is loaded, and `latest` falls back to the previous complete one with a warning; a
checkpoint without its manifest is never trusted. `check_whole` guards the commands that
read a checkpoint's model (eval, export).
A full disk is an error naming the path, and the previous checkpoint stays intact. Knows
nothing of how the buffers are used.

The trainer's process writes the checkpoint (on the Ray runtime, the trainer actor): on a
multi-node cluster the run directory must be on storage that every node shares.
"""

from __future__ import annotations

import errno
import hashlib
import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reroll.config import CheckpointError
from reroll.rollout import Group


def rng_state() -> dict[str, Any]:
    """The CPU, numpy and Python generators' states, and each CUDA device's where this
    process has used CUDA (a CPU-only process never initialises it just to save nothing)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_initialized():  # (asking is_available() first would touch the driver)
        state["cuda"] = torch.cuda.get_rng_state_all()  # CPU byte tensors, one per device
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state`'s generators. CUDA's come back only where this process sees as
    many devices as the saving one did (else the states could land on other GPUs): a warning
    otherwise, and the resumed run's CUDA draws are not the uninterrupted run's."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    saved = state.get("cuda")
    if not saved:
        return
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen != len(saved):
        warnings.warn(f"checkpoint: the CUDA random state of {len(saved)} device(s) is not "
                      f"restored: this process sees {seen}", RuntimeWarning, stacklevel=2)
        return
    torch.cuda.set_rng_state_all(saved)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, say); the previous one is intact."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(ckpt: Path) -> None:
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != "manifest.json")
    (ckpt / "manifest.json").write_text(json.dumps(
        {str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "sha256": _digest(p)}
         for p in files}, indent=1))


def damage(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint (a missing or altered file), or None if it is whole.
    One without its manifest is never trusted (nothing says its files are whole)."""
    man = ckpt / "manifest.json"
    if not man.is_file():
        return f"{man} is missing, so nothing says its files are whole"
    try:
        files = json.loads(man.read_text())
    except json.JSONDecodeError:
        return f"{man} is not valid JSON"
    for rel, want in files.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{p} is missing"
        if p.stat().st_size != want["bytes"]:
            return f"{p} has {p.stat().st_size} bytes, {want['bytes']} were written"
        if _digest(p) != want["sha256"]:
            return f"{p} does not match its checksum"
    return None


def save(run_dir: Path, step: int, model, tokenizer, optimizer, state: dict[str, Any],
         groups: list[Group] = (), keep: int = 2, lr_scheduler=None,
         extras: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint of ``step``; ``extras``: more files, name -> object saved with
    ``torch.save`` (a component's own state, e.g. ARRoL's quality head), in the manifest
    like the rest."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write(tmp, model, tokenizer, optimizer, state, step, groups, lr_scheduler, extras)
    except (OSError, RuntimeError) as e:  # torch's own writer reports ENOSPC as RuntimeError
        free = shutil.disk_usage(root).free if root.exists() else 0
        full = getattr(e, "errno", None) == errno.ENOSPC or free < (1 << 20)
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(run_dir, check=False)
        why = "no space left on device" if full else f"{type(e).__name__}: {e}"
        raise CheckpointWriteError(
            errno.ENOSPC if full else getattr(e, "errno", None) or errno.EIO,
            f"could not write the checkpoint of step {step} at {tmp}: {why}; the previous "
            f"checkpoint ({prev or 'none'}) is intact") from e
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").replace(root / "latest")  # atomic: never an empty marker
    for old in sorted(root.glob("step_*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(tmp: Path, model, tokenizer, optimizer, state, step, groups, lr_scheduler,
           extras=None) -> None:
    from reroll.lora import is_lora, save_adapter

    if is_lora(model):  # the adapter, naming its base (`reroll.lora`)
        save_adapter(model, tmp / "model")
    else:
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
    for name, obj in (extras or {}).items():
        torch.save(obj, tmp / name)
    write_manifest(tmp)


def latest(run_dir: Path, check: bool = True) -> Path | None:
    """The newest complete checkpoint. With ``check``, a damaged one is skipped with a
    warning naming the file (the previous one is used); if every one is damaged, a
    CheckpointError names the newest's damage."""
    root = Path(run_dir) / "checkpoints"
    marker = root / "latest"
    name = marker.read_text().strip() if marker.is_file() else ""
    found = sorted(root.glob("step_*"), reverse=True) if root.is_dir() else []
    if name.startswith("step_") and (root / name) in found:  # the marker's first
        found.remove(root / name)
        found.insert(0, root / name)
    if not check:
        return found[0] if found else None
    first_damage = None
    for ck in found:
        bad = damage(ck)
        if bad is None:
            if first_damage:
                warnings.warn(f"checkpoint damaged ({first_damage}); resuming from the "
                              f"previous complete checkpoint {ck}", RuntimeWarning, stacklevel=2)
            return ck
        first_damage = first_damage or bad
    if first_damage:
        raise CheckpointError(f"no complete checkpoint in {root}: {first_damage}")
    return None


def check_whole(model_dir: Path) -> None:
    """A checkpoint's ``model/`` is read only if the checkpoint is whole (a `CheckpointError`
    naming the damage otherwise); any other model directory passes."""
    ckpt = Path(model_dir).parent
    if model_dir.name == "model" and ((ckpt / "manifest.json").is_file()
                                      or (ckpt / "state.json").is_file()):
        bad = damage(ckpt)
        if bad:
            raise CheckpointError(f"checkpoint {ckpt} is damaged ({bad}); use an intact one "
                                  f"(the run directory names its latest intact checkpoint)")


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
    # on the CPU, so that a GPU run's checkpoint loads anywhere: load_state_dict moves each
    # state tensor onto its parameter's device
    opt = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=False)
    check_optimizer_state(ckpt, optimizer, opt["optimizer"])
    # which kernels run the update is this process's choice (train.fused_optimizer), not the
    # checkpoint's: the saved groups' flags would come back with them, and they also decide
    # where the state's step counters are put (on the parameter's device for fused kernels)
    for saved, group in zip(opt["optimizer"]["param_groups"], optimizer.param_groups):
        saved.update({k: group.get(k) for k in ("fused", "foreach")})
    try:
        optimizer.load_state_dict(opt["optimizer"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint {ckpt} does not match the model/optimiser the "
                              f"config builds: {e}") from None
    if lr_scheduler is not None and opt.get("lr_scheduler"):
        lr_scheduler.load_state_dict(opt["lr_scheduler"])
    set_rng_state(torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=False))


def read_state(ckpt: Path) -> dict[str, Any]:
    """state.json of a checkpoint: step, version, data cursor, counters."""
    return json.loads((ckpt / "state.json").read_text())


def read_extra(ckpt: Path, name: str) -> Any:
    """A file ``save`` wrote from ``extras`` (a CheckpointError when it is missing), its
    tensors on the CPU (``load_state_dict`` copies them onto the caller's device)."""
    path = ckpt / name
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no {name}: it was written by a run "
                              f"configured differently")
    return torch.load(path, map_location="cpu", weights_only=False)


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

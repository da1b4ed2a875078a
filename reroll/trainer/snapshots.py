"""Per-version old log-probs: trainer-side weight snapshots, one per policy version a
trained token may still carry ("Missing Old Logits in Asynchronous Agentic RL", Guan et al.
2026, its exact repair).

The ratio of a token sampled by the engine at version v factorises at that version,

    pi_theta / mu_v = [pi_train,v / mu_v] x [pi_theta / pi_train,v],

the first factor the engine/trainer mismatch at the same weights (the objective's
correction, masked or truncated), the second the staleness (the surrogate's clip). An
asynchronous pipeline without pi_train,v (the trainer's log-probs under the weights that
generated the token) substitutes the update's starting weights, which mixes the two. With
snapshots the trainer computes each token's pi_train,v under its own version's weights and
uses it as that token's pi_prox; tokens of the current version need none (their snapshot is
the current weights).

Which versions are kept (`VersionSnapshots`): a version's snapshot is taken when the trainer
starts an update at it, and is held exactly while the version is referenced: by a sample of
the batch being trained, or by a group the loop still holds (ready in its buffer or in
flight) or a sample its replay stage holds (to be replayed or reused), which the loop passes
with every update (`reroll.control.staleness.referenced_versions`). Versions below the
admission bound (a group trained at version i started at version >= i - lag, ``lag`` =
runtime.max_staleness, one more with APRIL's overprovision) are never needed again: such a
group is dropped as stale. Without the loop's set (a trainer driven directly, a recorded
run's replay) the bound alone decides: every version >= current - lag is referenced. The rule is the pure function `release_plan`.

Memory: at most ``max_snapshots`` (train.old_snapshots, counting the current version's)
copies of the weights on the trainer's device (a tied embedding held once: `copy_state`),
plus one scratch model they are loaded into;
held count and bytes are the metrics ``offpol/snapshots_held`` and ``offpol/snapshot_bytes``.
At the bound, unreferenced versions are already gone; the oldest referenced ones go next
(counted in ``offpol/snapshots_evicted``), and a token whose version has no snapshot
(evicted, or older than the bound, as a replayed sample's may be) falls back to the update's
pi_prox; the share of trained tokens that did is the metric ``offpol/snapshot_fallback_frac``.

Owns the store, its checkpoint state (``SNAPSHOT_FILE``) and the per-token merge. Must not
know the objective, the optimiser or the loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from reroll.trainer.batch import Batch

SNAPSHOT_FILE = "version_snapshots.pt"


class VersionSnapshots:
    """Weights of each kept policy version (``{version: state dict}``) and the scratch model
    their log-probs are computed with."""

    def __init__(self, model: torch.nn.Module, max_snapshots: int, lag: int):
        if max_snapshots < 1 or lag < 0:
            raise ValueError(f"VersionSnapshots: need max_snapshots >= 1 and lag >= 0, got "
                             f"{max_snapshots} and {lag}")
        self.max_snapshots, self.lag = max_snapshots, lag
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.scratch = copy.deepcopy(model).eval()
        for p in self.scratch.parameters():
            p.requires_grad_(False)
        self.evicted = 0  # snapshots dropped at the bound while still referenced

    def needed(self, version: int, referenced: set[int] | None) -> set[int]:
        """The versions to hold at trainer ``version``: the current one and those the loop
        says are ``referenced`` (None: all within the admission bound), none below it."""
        floor = version - self.lag
        if referenced is None:
            return set(range(max(floor, 0), version + 1))
        return {v for v in referenced if floor <= v <= version} | {version}

    def keep(self, version: int, model: torch.nn.Module, referenced: set[int] | None = None,
             using: set[int] = frozenset()) -> None:
        """Snapshot ``model`` as ``version`` (the trainer's current one), then hold what
        `release_plan` keeps of the versions `needed` plus ``using`` (the batch's)."""
        if version not in self.weights:
            self.weights[version] = copy_state(model.state_dict())
        self._apply(self.needed(version, referenced) | set(using))

    def release(self, version: int, referenced: set[int] | None = None) -> None:
        """After the update's old log-probs: drop the versions only its batch needed."""
        self._apply(self.needed(version, referenced))

    def _apply(self, needed: set[int]) -> None:
        _, released, evicted = release_plan(self.weights, needed, self.max_snapshots)
        for v in released + evicted:
            del self.weights[v]
        self.evicted += len(evicted)

    def nbytes(self) -> int:
        """Bytes of the held snapshots (the scratch model not counted)."""
        unique = {id(t): t for w in self.weights.values() for t in w.values()}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def metrics(self) -> dict[str, float]:
        return {"offpol/snapshots_held": float(len(self.weights)),
                "offpol/snapshot_bytes": float(self.nbytes()),
                "offpol/snapshots_evicted": float(self.evicted)}

    @torch.no_grad()
    def old_logprobs(self, batch: Batch, version: int,
                     logprobs: Callable[[torch.nn.Module, Batch], torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(pi_train,v [N, T], has [N, T] bool, metrics) for the trained tokens of ``batch``
        whose version is older than ``version`` and has a snapshot; ``logprobs(model,
        batch)`` is the trainer's no-grad log-prob function. Only the rows holding a token of
        a version are passed under its snapshot."""
        m = batch.mask > 0
        old = torch.zeros(batch.targets.shape, dtype=torch.float32, device=batch.mask.device)
        has = torch.zeros_like(m)
        stale = m & (batch.versions < version)
        for v in sorted(set(batch.versions[stale].tolist()) & set(self.weights)):
            of_v = stale & (batch.versions == v)  # [N, T]
            rows = of_v.any(-1).nonzero().flatten()
            self.scratch.load_state_dict(self.weights[v])
            lp = logprobs(self.scratch, batch.slice(rows))  # [r, T]
            sub = of_v[rows]
            old[rows] = torch.where(sub, lp.to(old.dtype), old[rows])
            has[rows] = has[rows] | sub
        n = max(int(m.sum()), 1)
        return old, has, {"offpol/snapshot_frac": float(has.sum()) / n,
                          "offpol/snapshot_fallback_frac": float((stale & ~has).sum()) / n}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: every kept version's weights (on the CPU), the eviction
        count and the bound."""
        return {"max_snapshots": self.max_snapshots, "lag": self.lag, "evicted": self.evicted,
                "weights": {v: copy_state(w, "cpu", clone=False)
                            for v, w in self.weights.items()}}

    def load(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's snapshots bit for bit, onto the scratch model's device; the
        bound and lag are this run's (a resume may change them: they decide what is kept,
        not what a kept snapshot holds)."""
        dev = next(self.scratch.parameters()).device
        self.evicted = int(state["evicted"])
        self.weights = {int(v): copy_state(w, dev, clone=False)
                        for v, w in sorted(state["weights"].items())}
        self._apply(set(self.weights))  # a smaller bound on resume: the oldest go


def copy_state(state: dict[str, torch.Tensor], device=None,
               clone: bool = True) -> dict[str, torch.Tensor]:
    """``state``'s tensors copied (``clone``) or moved to ``device``, once per tensor they
    view: entries that share memory (tied input and output embeddings) share it in the copy
    too, so a snapshot of a tied model holds the embedding once."""
    out, done = {}, {}
    for k, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if key not in done:
            c = t.detach()
            c = c.clone() if clone else c
            done[key] = c if device is None else c.to(device)
        out[k] = done[key]
    return out


def release_plan(held, needed: set[int], cap: int) -> tuple[list[int], list[int], list[int]]:
    """(keep, release, evict), each ascending, for the ``held`` snapshot versions: keep the
    newest ``cap`` of those ``needed``; release every one not needed; evict the needed ones
    beyond the cap (oldest first: their tokens fall back to the update's pi_prox)."""
    if cap < 1:
        raise ValueError(f"release_plan: cap must be >= 1, got {cap}")
    held = sorted(held)
    wanted = [v for v in held if v in needed]
    keep = wanted[-cap:]
    return keep, [v for v in held if v not in needed], wanted[:-cap] if len(wanted) > cap else []


def record_old_logprobs(rollouts: list, old: torch.Tensor, has: torch.Tensor) -> None:
    """Write each rollout's per-token pi_train,v into ``Rollout.old_logprobs`` (None where
    not computed). ``old``/``has`` [N, L-1] are on target positions: token t + 1's entry."""
    old, has = old.cpu().tolist(), has.cpu().tolist()
    for r, lp, h in zip(rollouts, old, has):
        n = len(r.tokens)
        r.old_logprobs = [None] + [lp[t] if h[t] else None for t in range(n - 1)]

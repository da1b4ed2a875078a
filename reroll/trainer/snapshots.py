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
starts an update at it, and is released once no sample that can still reach the trainer may
hold a token of it. The trainer cannot see the loop's buffers, so it counts references by
the bound the admission rule proves (`reroll.control.staleness`): a group trained at version
i started at version >= i - lag (``lag`` = runtime.max_staleness, one more with APRIL's
overprovision), so after reaching version V only versions >= V - lag are referenced. At most
``max_snapshots`` are kept (train.old_snapshots, counting the current version's): at the
bound the oldest goes first, and a token whose version has no snapshot (evicted, older than
the bound, or a replayed sample's) falls back to the update's pi_prox; the share of trained
tokens that did is the metric ``offpol/snapshot_fallback_frac``. Memory: ``max_snapshots``
copies of the weights on the trainer's device, plus one scratch model they are loaded into.

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

    def keep(self, version: int, model: torch.nn.Module) -> None:
        """Snapshot ``model`` as ``version`` (the trainer's current one), release the versions
        no sample can reference any more (< version - lag) and evict the oldest beyond the
        bound."""
        if version not in self.weights:
            self.weights[version] = {k: v.detach().clone()
                                     for k, v in model.state_dict().items()}
        for v in [v for v in self.weights if v < version - self.lag]:
            del self.weights[v]
        while len(self.weights) > self.max_snapshots:
            del self.weights[min(self.weights)]
            self.evicted += 1

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
                          "offpol/snapshot_fallback_frac": float((stale & ~has).sum()) / n,
                          "offpol/snapshots_kept": float(len(self.weights)),
                          "offpol/snapshots_evicted": float(self.evicted)}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: every kept version's weights (on the CPU), the eviction
        count and the bound."""
        return {"max_snapshots": self.max_snapshots, "lag": self.lag, "evicted": self.evicted,
                "weights": {v: {k: t.cpu() for k, t in w.items()}
                            for v, w in self.weights.items()}}

    def load(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's snapshots bit for bit, onto the scratch model's device; the
        bound and lag are this run's (a resume may change them: they decide what is kept,
        not what a kept snapshot holds)."""
        dev = next(self.scratch.parameters()).device
        self.evicted = int(state["evicted"])
        self.weights = {int(v): {k: t.to(dev) for k, t in w.items()}
                        for v, w in sorted(state["weights"].items())}
        while len(self.weights) > self.max_snapshots:
            del self.weights[min(self.weights)]
            self.evicted += 1


def record_old_logprobs(rollouts: list, old: torch.Tensor, has: torch.Tensor) -> None:
    """Write each rollout's per-token pi_train,v into ``Rollout.old_logprobs`` (None where
    not computed). ``old``/``has`` [N, L-1] are on target positions: token t + 1's entry."""
    old, has = old.cpu().tolist(), has.cpu().tolist()
    for r, lp, h in zip(rollouts, old, has):
        n = len(r.tokens)
        r.old_logprobs = [None] + [lp[t] if h[t] else None for t in range(n - 1)]

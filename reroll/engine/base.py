"""The engine protocols: what workflows, the scheduler and evaluation call to generate tokens.

Owns the contracts only. Two layers:

- `Engine` (what everything above the engine uses) is asynchronous: ``generate(rollout)``
  returns an awaitable that resolves when the request finishes. The engine appends sampled
  tokens to the given `Rollout` record with their behaviour log-prob and policy version, and
  sets ``finish`` ("stop" / "length", or "pruned" by the request's ``sampling.stop_rule``
  or, in an engine holding a quality head, by its group's ``sampling.prune``) and
  ``completion``. ``turn=(start, end)`` limits one call to one turn of a multi-turn
  episode (see `reroll.engine.requests.make_request`).
  ``update_weights(weights, version, interrupt=True)`` aborts in-flight requests, keeps their
  prefix (tokens, log-probs, versions), swaps the weights and resumes them (a resume is
  counted on the record): their awaitables simply resolve later. ``abort(ids)`` stops
  requests for good (a pruner, an over-provisioned group no longer needed): their awaitables
  resolve with ``finish = "abort"`` and the prefix kept. ``sync()`` brings every
  in-flight record up to date for a checkpoint without interrupting anything.
  An engine that can fork sequences also has ``fork(parent, children, at)``, one awaitable
  per child (`EngineService` over `TorchEngine`; `reroll.engine.fork`): the children share
  the parent's first ``at`` tokens and its cached keys/values, and sample on with their own
  seeds. It is a capability, not part of the protocol (``hasattr(engine, "fork")``); so is
  ``branch(root, spares)`` (LATR trees, `reroll.engine.branch`): one awaitable per member;
  where the root's ``sampling.branch_rule`` fires, the next spare branches off with the
  alternative token, and spares the tree did not use are generated independently.
- `EngineCore` is the step-wise engine an `EngineService` drives from its own thread:
  `reroll.engine.TorchEngine` in this process, or `reroll.runtime.ray.RayEnginePool` over
  engine actors. Cores are chosen by the `ENGINES` registry (``engine.name``).

Engines know nothing of rewards, groups' advantages, trainers or staleness.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, runtime_checkable

from reroll.registry import Registry
from reroll.rollout import Rollout

ENGINES = Registry("engine")
"""name -> builder(model, tokenizer, *, max_batch, version) -> EngineCore (local process)."""

Turn = tuple[int, int]


@runtime_checkable
class Engine(Protocol):
    version: int
    """Policy version of the weights the engine samples with now."""

    def generate(self, rollout: Rollout, turn: Turn | None = None) -> Awaitable[Rollout]:
        """Sample into ``rollout`` (its ``sampling`` says how; a record that already holds
        sampled tokens of this turn is a resume). Resolves to the same record, finished."""
        ...

    async def update_weights(self, weights: Any, version: int, interrupt: bool = True) -> None:
        """New weights between decode steps. ``interrupt``: abort, keep prefixes, resume
        under the new weights; otherwise running requests keep the keys/values computed
        with the old weights (only their new tokens carry the new version)."""
        ...

    async def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        """Stop the named in-flight requests (all if None): their awaitables resolve to
        their records with ``finish = "abort"`` and the prefix sampled so far (tokens,
        log-probs, versions); generating such a record again resumes it. Returns them."""
        ...

    async def sync(self) -> None:
        """Every in-flight record holds all tokens sampled so far (a consistent snapshot)."""
        ...

    def stats(self) -> dict[str, float]:
        """Monotone counters: tokens_generated, decode_steps, ... (see TorchEngine.stats)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class EngineCore(Protocol):
    version: int

    def add(self, rollouts: list[Rollout], turns: list[Turn | None] | None = None) -> None:
        """Queue requests (each rollout's ``sampling`` says how to sample it)."""
        ...

    def step(self) -> list[Rollout]:
        """Admit waiting requests (prefill), then one decode step for every running one.
        Returns the rollouts that finished during this step."""
        ...

    def pending(self) -> int:
        """Waiting + running requests."""
        ...

    def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        """Remove the named in-flight requests (all if None) and return them with
        ``finish = "abort"``; their tokens, log-probs and versions so far are kept."""
        ...

    def sync(self) -> None:
        """Write every in-flight request's sampled tokens into its record."""
        ...

    def update_weights(self, state_dict: Any, version: int) -> None: ...

    def stats(self) -> dict[str, float]: ...

"""The Engine protocol: what the rollout scheduler and evaluation call to generate tokens.

Owns the contract only. An engine takes `Rollout` records whose ``tokens`` are the prompt (plus
a kept prefix when resuming), appends sampled tokens with their behaviour log-prob and policy
version, and sets ``finish`` ("stop" / "length", or "abort" when pulled out early) and
``completion``. It knows nothing of rewards, groups' advantages, trainers or threads.

Step-wise driving (what the RL loop does)::

    engine.add(group.rollouts)
    while engine.pending():
        for r in engine.step():   # rollouts that finished during this step
            score(r)

Weight updates and interruptible rollouts: ``update_weights`` swaps the weights between two
steps without restarting anything. Requests already running keep the KV cache they computed
with the old weights (only their new tokens are tagged with the new version). A caller that
wants every new token conditioned on new-weight keys/values aborts first and adds the aborted
records back: that is a resume (prompt + kept prefix re-prefilled under the current weights,
``resume_count += 1``), so one record can hold tokens of several versions.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from reroll.rollout import Rollout


@runtime_checkable
class Engine(Protocol):
    version: int
    """Policy version of the weights the engine samples with now."""

    def add(self, rollouts: list[Rollout]) -> None:
        """Queue requests. Each rollout's ``sampling`` says how (temperature, top_p, top_k,
        max_new_tokens counted over the whole response across resumes, stop_token_ids,
        stop_strings, seed). A rollout with ``finish == "abort"`` is a resume."""
        ...

    def step(self) -> list[Rollout]:
        """One scheduler iteration: admit waiting requests (prefill), then one decode step
        for every running one. Returns the rollouts that finished during this step."""
        ...

    def pending(self) -> int:
        """Waiting + running requests."""
        ...

    def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        """Remove the named in-flight requests (all if None) and return them with
        ``finish = "abort"``; their tokens, log-probs and versions so far are kept."""
        ...

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """New weights, applied between decode steps; see the module docstring."""
        ...

    def generate(self, rollouts: list[Rollout]) -> list[Rollout]:
        """Add, then step until these rollouts finish; returns them in input order."""
        ...

    def stats(self) -> dict[str, float]:
        """Running counters: tokens_generated, decode_steps, mean_occupancy, prefill_tokens,
        ... (monotone, so a caller can difference two snapshots)."""
        ...

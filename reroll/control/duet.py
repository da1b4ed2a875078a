"""DUET (ALGORITHMS.md 3.4): two controls under one token budget.

Owns the DUET policy; the engine only follows the per-request `StopRule` it hands out.

1. **Marker gate** (`MarkerGate`). Before a sample is generated, ``prepare`` gives it a
   `StopRule`: stop ``grace`` tokens after the answer marker; with a horizon H, a sample
   that has sampled H tokens without a marker is pruned unless its ``keep`` draw says go
   on. The draw ``u`` is a hash of the sample's own sampling seed (a function of the run
   seed, the group's admission number and the sample's index), so the decision depends on
   nothing else running, a repeated run draws the same, and a resumed sample carries it in
   its record. ``keep = u < q`` (`rules.duet_keep`).

   After scoring (``settle``), the sample's weight: 1 for a sample that showed its marker
   by H or ended by then (EOS or its length limit at H); for one that passed H without a
   marker, 1/q when kept and 0 when pruned, so E[weight] = 1 and the policy gradient stays
   unbiased for per-sequence aggregations (with token-mean, the normaliser counts the
   trained tokens, as for any excluded sample). A pruned sample keeps its record
   (``finish = "pruned"``, ``loss_exclusion = "duet_abort"``, weight 0): it stays in its
   group, scored on its truncated text (usually wrong: it had not given its answer), so the
   group's baseline and the per-prompt statistics count it, and the loss leaves it out
   (collation zeroes its tokens). The weight reaches the loss through
   ``Rollout.sample_weight``. ``Rollout.control["duet"]`` records the marker position, the
   horizon, the keep draw, the weight and how the sample ended ("marker_stop", "aborted",
   "eos" or "length").

2. **Token-budget allocation** (`reroll.control.allocators.DUETAllocator`, allocator
   ``duet``). Groups
   are admitted one at a time, before the rest of their step is known, so the batch rule
   (`rules.duet_allocation`) cannot be applied as such; instead each group decides alone
   against a shadow price ``mu`` on tokens: n = informativeness / (mu x expected length)
   (`rules.duet_size`), the solution of "most information for the tokens" with log returns
   in samples, which with one price for all groups is the batch rule's proportional split.
   Informativeness is p(1 - p) of a Beta posterior of the prompt's recent success rate
   (`rules.duet_informativeness`; 0.25 for an unseen prompt), the expected length the
   prompt's mean policy tokens per sample (the pooled mean for an unseen prompt). ``mu``
   moves by dual ascent at step boundaries so the mean expected tokens per group meet the
   budget. A step still trains on about rollout.batch_groups x group_size samples (the
   loop's step is counted in samples), so the budget is per group: ``tokens`` (0: group_size
   x the pooled mean length, fixed-n GRPO's spend, redistributed toward informative and
   short prompts).

Knows nothing of engines, threads or the event loop.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from reroll.control import rules
from reroll.rollout import Group, Rollout, StopRule

ABORTED = "duet_abort"  # the loss_exclusion of a pruned sample


def keep_draw(seed: int) -> float:
    """The sample's u ~ U[0, 1) for the keep decision: a hash of its sampling seed alone."""
    digest = hashlib.sha256(f"duet-keep:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def marker_at(tokens: list[int], marker: tuple[int, ...]) -> int:
    """Position (tokens of the response) where ``marker`` first ends, -1 if it never does."""
    m = len(marker)
    for i in range(len(tokens) - m + 1):
        if tuple(tokens[i:i + m]) == marker:
            return i + m
    return -1


class MarkerGate:
    """DUET's marker-gated abort: hands each new sample its `StopRule` (``prepare``) and
    weighs it once scored (``settle``); see the module docstring."""

    def __init__(self, marker: list[int], *, grace: int, horizon: int, q: float):
        if not marker:
            raise ValueError("MarkerGate: the answer marker has no tokens")
        rules.duet_keep(0.0, q=q)  # checks q in (0, 1]
        self.marker, self.grace, self.horizon, self.q = tuple(marker), grace, horizon, q

    def prepare(self, r: Rollout) -> None:
        """Give a fresh sample its rule, with its own keep draw (always kept without a
        horizon). Needs the sample's sampling seed."""
        if r.sampling.seed is None:
            raise ValueError(f"rollout {r.sample_id}: DUET's keep draw needs a sampling seed")
        keep = self.horizon == 0 or rules.duet_keep(keep_draw(r.sampling.seed), q=self.q)[0]
        rule = StopRule(self.marker, grace=self.grace, horizon=self.horizon, keep=keep)
        r.sampling = replace(r.sampling, stop_rule=rule)

    def settle(self, r: Rollout) -> None:
        """Weight and record of a finished sample (once: a settled sample is left as is)."""
        rule = r.sampling.stop_rule
        if rule is None or "duet" in r.control:
            return
        resp = r.response_tokens
        at = marker_at(resp, rule.marker)
        past = rule.horizon > 0 and (r.finish == "pruned" or (
            len(resp) > rule.horizon and not 0 <= at <= rule.horizon))
        weight = (1.0 / self.q if rule.keep else 0.0) if past else 1.0
        if r.finish == "pruned":
            end = "aborted"
            r.loss_exclusion = r.loss_exclusion or ABORTED
        elif (r.finish == "stop" and at >= 0 and len(resp) == at + rule.grace
              and resp[-1] not in r.sampling.stop_token_ids):  # not EOS there by chance
            end = "marker_stop"
        else:
            end = "eos" if r.finish == "stop" else r.finish
        r.sample_weight *= weight
        r.control["duet"] = {"marker_at": at, "horizon": rule.horizon, "grace": rule.grace,
                             "keep": rule.keep, "past_horizon": past, "weight": weight,
                             "end": end}

    @staticmethod
    def metrics(groups: list[Group]) -> dict[str, float]:
        """Per step, over the consumed samples the gate weighed: how many stopped at their
        marker, were aborted, were kept past the horizon; the mean weight."""
        recs = [r.control["duet"] for g in groups for r in g.rollouts if "duet" in r.control]
        if not recs:
            return {}
        return {"control/duet_marker_stops": float(sum(d["end"] == "marker_stop"
                                                       for d in recs)),
                "control/duet_aborted": float(sum(d["end"] == "aborted" for d in recs)),
                "control/duet_kept": float(sum(d["past_horizon"] and d["keep"] for d in recs)),
                "control/duet_weight_mean": sum(d["weight"] for d in recs) / len(recs)}

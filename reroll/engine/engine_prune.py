"""TorchEngine's pruning (ARRoL, `reroll.control.arrol`): the members of a group that carry a
`PruneRule` are cut at the rule's checkpoint inside the engine, from the quality head's
prediction on the hidden state the decode step computes anyway, with no re-prefill.

Owns the engine side: the head the engine holds (it arrives with the policy weights, keys
``arrol.*``, same version), the hidden state of each forward (a forward pre-hook on the
output embedding: the rows the logits are made from, nothing copied), admitting a group's
waiting members together, feeding `GroupGate` and retiring the rows it names with finish
"pruned". A mixin of `reroll.engine.torch_engine.TorchEngine`; uses its slots and counters.

Members admitted together decode in lockstep, so they reach the checkpoint ``at`` (``at``
response tokens sampled: the decode step that feeds the ``at``-th token, whose hidden state
summarises the prompt and those tokens) in the same step, and the pruned ones are retired
there before they sample anything more. A member that ends earlier (EOS or its limit) is
predicted on the last hidden state computed for it and survives. Should members come apart
(admitted in different steps), the ones ahead wait for the others while decoding on, and
are retired where they are when the group is decided; a member that ends meanwhile
survives. A row is gated only while its record has no decision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.control.arrol import (
    GroupGate,
    head_from_tensors,
    prefix_confidence,
    split_weights,
)
from reroll.engine.requests import Request
from reroll.rollout import Rollout


class Pruning:
    """`load_head`, the gated admission and the checkpoint step, for `TorchEngine`."""

    head = None  # the quality head (None: no pruning; a request with a rule is refused)
    head_warm = False  # whether the head decides (else the warm-up's seeded draws)
    _hidden: Tensor | None = None

    @property
    def pruning(self) -> bool:
        return self.head is not None

    def load_head(self, tensors: dict[str, Tensor]) -> None:
        """Take the head's tensors (`reroll.control.arrol.head_tensors`); the first call
        starts capturing hidden states."""
        out = self.model.get_output_embeddings()
        head, self.head_warm = head_from_tensors(tensors, out.in_features)
        if self.head is None:  # the first head: gates, counters, the hidden-state hook
            self.gates: dict[str, GroupGate] = {}
            self.counts.update(requests_pruned=0.0, prune_decisions=0.0)
            out.register_forward_pre_hook(lambda mod, args: setattr(self, "_hidden", args[0]))
        self.head = head.to(self.device)

    def _take_head(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """The policy's part of published weights; the head's part is loaded here."""
        policy, head = split_weights(state_dict)
        if head:
            self.load_head(head)
        return policy

    def _hidden_rows(self, rows: Tensor | None) -> Tensor:
        """Hidden states [R, H] aligned with `_forward`'s logits rows."""
        h = self._hidden
        if rows is None:
            return h[:, -1]
        return h[0] if self.keep_arg else h[0, rows]

    # ---- admission ---------------------------------------------------------------------
    def _check_rule(self, r: Rollout) -> None:
        rule = r.sampling.prune
        if rule is not None and self.head is None:
            raise ValueError(f"rollout {r.sample_id} carries a prune rule but the engine has "
                             f"no quality head (load_head)")
        if rule is not None and r.sampling.draft is not None:
            raise ValueError(f"rollout {r.sample_id}: a prune rule and a draft together are "
                             f"not supported")
        if rule is not None and rule.size > self.max_batch:
            raise ValueError(f"rollout {r.sample_id}: its group of {rule.size} must decode "
                             f"together, more than the engine's {self.max_batch} slots")

    def _group_fits(self, q: Request, used: int) -> bool:
        """For a gated request first in line: move its group's other waiting members right
        behind it; whether all of them fit the ``max_batch - used`` free slots."""
        if q.rollout.sampling.prune is None or "decision" in q.rollout.control.get("arrol", {}):
            return True
        gid = q.rollout.group_id
        mates = [w for w in self.waiting if w is not q and w.rollout.group_id == gid]
        for w in mates:
            self.waiting.remove(w)
        self.waiting.extendleft(reversed(mates))
        self.waiting.remove(q)
        self.waiting.appendleft(q)
        return used + 1 + len(mates) <= self.max_batch

    @staticmethod
    def _same_group(q: Request, chosen: list) -> bool:
        """A member following its group's first in this admission (kept with it)."""
        return bool(chosen) and q.rollout.sampling.prune is not None and (
            chosen[-1][0].rollout.group_id == q.rollout.group_id)

    # ---- the checkpoint ------------------------------------------------------------------
    def _gated_sample(self, logits: Tensor, hidden: Tensor, start: int) -> list[Rollout]:
        """`_sample` for the rows from ``start`` (logits [n, V], hidden [n, H]) with the
        checkpoint first: predictions for the gated rows at their checkpoint, decisions of
        complete groups, the pruned rows retired; then members that ended early settle
        (predicted on this step's hidden state). The head runs on those rows only."""
        rows = self.rows[start:]
        arrived: list[tuple[int, int]] = []  # (row, position) of members at the checkpoint
        cut: set[int] = set()
        for j, q in enumerate(rows):
            rec = q.rollout.control.get("arrol", {})
            if q.rollout.sampling.prune is None or rec.get("decision") not in (None, "pruned"):
                continue
            if rec.get("decision") == "pruned":  # decided while it was away
                cut.add(j)
            elif (k := self._resp_len(q)) >= q.rollout.sampling.prune.at or "p" in rec:
                arrived.append((j, k))
        lps = [self._prefix_logprobs(rows[j], k) for j, k in arrived]
        for (j, k), p in zip(arrived, self._predict(hidden, arrived, lps)):
            self._gate_of(rows[j].rollout).arrive(rows[j].rollout, p, k, self.version)
        if arrived:
            cut |= self._decide_ready(rows)
        row_of = {q.rollout.sample_id: j for j, q in enumerate(rows)}
        done = self._retire([start + j for j in sorted(cut)])
        if cut:
            logits = logits[torch.tensor([row_of[q.rollout.sample_id]
                                          for q in self.rows[start:]],
                                         device=logits.device, dtype=torch.long)]
        fin = self._sample(logits, slice(start, len(self.rows)))
        early = [r for r in fin if r.sampling.prune is not None
                 and "decision" not in r.control.get("arrol", {})]
        need = [r for r in early if "p" not in r.control.get("arrol", {})]
        fresh = [(row_of[r.sample_id], r.response_len - 1) for r in need]
        lps = [r.logprobs[r.prompt_len:r.prompt_len + r.response_len - 1] for r in need]
        preds = dict(zip([j for j, _ in fresh], self._predict(hidden, fresh, lps)))
        for r in early:  # ended before the group was decided: a survivor
            rec, j = r.control.get("arrol", {}), row_of[r.sample_id]
            p, k = (rec["p"], rec["at"]) if "p" in rec else (preds[j], r.response_len - 1)
            self._gate_of(r).arrive(r, p, k, self.version, finished=True)
        if early:
            fin += self._retire(sorted(self._decide_ready(self.rows)))
        return done + fin

    def _predict(self, hidden: Tensor, at: list[tuple[int, int]], lps: list[list[float]]
                 ) -> list[float]:
        """The head's p for rows ``j`` at positions ``k`` (``at`` = [(j, k)]) whose prefixes
        were sampled with log-probs ``lps``."""
        if not at:
            return []
        j = torch.tensor([x for x, _ in at], device=hidden.device)
        k = torch.tensor([x for _, x in at], device=self.device)
        lp = torch.tensor([prefix_confidence(x) for x in lps], device=self.device)
        return self.head.predict(hidden[j], k, lp).tolist()

    @staticmethod
    def _prefix_logprobs(q: Request, k: int) -> list[float]:
        """Behaviour log-probs of a request's first ``k`` response tokens (flushed or not)."""
        r = q.rollout
        return (r.logprobs[r.prompt_len:] + q.lps[q.flushed:])[:k]

    def _gate_of(self, r: Rollout) -> GroupGate:
        gate = self.gates.get(r.group_id)
        if gate is None:
            gate = self.gates[r.group_id] = GroupGate(r.sampling.prune)
        return gate

    def _decide_ready(self, rows: list[Request]) -> set[int]:
        """Decide every complete group; indices (into ``rows``) of the rows to retire."""
        cut: set[int] = set()
        for gid in [g for g, gate in self.gates.items() if gate.ready]:
            pruned = self.gates.pop(gid).decide(self.head_warm)
            self.counts["prune_decisions"] += 1
            cut |= {j for j, q in enumerate(rows) if q.rollout.group_id == gid
                    and q.rollout.index_in_group in pruned}
        return cut

    def _retire(self, slots: list[int]) -> list[Rollout]:
        out = [self.rows[i].finish("pruned", self.version, self._decode_text) for i in slots]
        self._compact(slots)
        self.counts["requests_pruned"] += len(out)
        self.counts["requests_finished"] += len(out)
        return out

    @staticmethod
    def _resp_len(q: Request) -> int:
        """Response tokens sampled so far (the unflushed ones included)."""
        r = q.rollout
        return len(r.tokens) - r.prompt_len + len(q.toks) - q.flushed

"""The pruning plug-in (ARRoL, `reroll.engine.quality`): the members of a group that carry
a `PruneRule` are cut at the rule's checkpoint inside the engine, from the quality head's
prediction on the hidden state the decode step computes anyway, with no re-prefill.

Owns the head the engine holds (it arrives with the policy weights, keys ``arrol.*``, same
version: the `weights` hook), the hidden state of each forward (a forward pre-hook on the
output embedding: the rows the logits are made from, nothing copied), admitting a group's
waiting members together, feeding the groups' gates (`reroll.engine.quality.GroupGate`) and
retiring the rows they name with finish "pruned". Knows nothing of the other plug-ins; while
it holds a head it asks the engine for one-token decode steps (``one_token``).

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

from reroll.engine.plugin import EnginePlugin
from reroll.engine.quality import GroupGate, head_from_tensors, prefix_confidence, split_weights
from reroll.engine.requests import Request
from reroll.rollout import Rollout


class Pruning(EnginePlugin):
    """`load_head`, the gated admission and the checkpoint step."""

    def __init__(self, core) -> None:
        super().__init__(core)
        self.head = None  # the quality head (None: no pruning; a request with a rule is refused)
        self.head_warm = False  # whether the head decides (else the warm-up's seeded draws)
        self.gates: dict[str, GroupGate] = {}
        self._hidden: Tensor | None = None

    @property
    def one_token(self) -> bool:
        return self.head is not None

    def load_head(self, tensors: dict[str, Tensor]) -> None:
        """Take the head's tensors (`reroll.engine.quality.head_tensors`); the first call
        starts capturing hidden states."""
        core = self.core
        out = core.model.get_output_embeddings()
        head, self.head_warm = head_from_tensors(tensors, out.in_features)
        if self.head is None:  # the first head: counters, the hidden-state hook
            core.add_counters("requests_pruned", "prune_decisions")
            out.register_forward_pre_hook(lambda mod, args: setattr(self, "_hidden", args[0]))
        self.head = head.to(core.device)

    # ---- hooks -------------------------------------------------------------------------------
    def weights(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """The policy's part of published weights; the head's part is loaded here."""
        policy, head = split_weights(state_dict)
        if head:
            self.load_head(head)
        return policy

    def added(self, q: Request) -> None:
        r = q.rollout
        rule = r.sampling.prune
        if rule is not None and self.head is None:
            raise ValueError(f"rollout {r.sample_id} carries a prune rule but the engine has "
                             f"no quality head (load_head)")
        if rule is not None and r.sampling.draft is not None:
            raise ValueError(f"rollout {r.sample_id}: a prune rule and a draft together are "
                             f"not supported")
        if rule is not None and rule.size > self.core.max_batch:
            raise ValueError(f"rollout {r.sample_id}: its group of {rule.size} must decode "
                             f"together, more than the engine's {self.core.max_batch} slots")

    def admit(self, q: Request, chosen: list, used: int) -> str | None:
        """A pruned group's members are admitted together (lockstep): one following its
        group's first in this admission comes "with" it; the first waits until all fit."""
        if self.head is None:
            return None
        if self._same_group(q, chosen):
            return "with"
        return None if self._group_fits(q, used) else "wait"

    def sample(self, logits: Tensor, start: int, rows: Tensor | None,
               pick: Tensor | None) -> list[Rollout] | None:
        if self.head is None:
            return None
        hidden = self.core.logit_rows(self._hidden, rows)
        return self._gated_sample(logits, hidden if pick is None else hidden[pick], start)

    def _group_fits(self, q: Request, used: int) -> bool:
        """For a gated request first in line: move its group's other waiting members right
        behind it; whether all of them fit the ``max_batch - used`` free slots."""
        if q.rollout.sampling.prune is None or "decision" in q.rollout.control.get("arrol", {}):
            return True
        gid = q.rollout.group_id
        waiting = self.core.waiting
        mates = [w for w in waiting if w is not q and w.rollout.group_id == gid]
        for w in mates:
            waiting.remove(w)
        waiting.extendleft(reversed(mates))
        waiting.remove(q)
        waiting.appendleft(q)
        return used + 1 + len(mates) <= self.core.max_batch

    @staticmethod
    def _same_group(q: Request, chosen: list) -> bool:
        """A member following its group's first in this admission (kept with it)."""
        return bool(chosen) and q.rollout.sampling.prune is not None and (
            chosen[-1][0].rollout.group_id == q.rollout.group_id)

    # ---- the checkpoint ------------------------------------------------------------------
    def _gated_sample(self, logits: Tensor, hidden: Tensor, start: int) -> list[Rollout]:
        """The engine's `sample` for the rows from ``start`` (logits [n, V], hidden [n, H]) with the
        checkpoint first: predictions for the gated rows at their checkpoint, decisions of
        complete groups, the pruned rows retired; then members that ended early settle
        (predicted on this step's hidden state). The head runs on those rows only."""
        core = self.core
        rows = core.rows[start:]
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
            self._gate_of(rows[j].rollout).arrive(rows[j].rollout, p, k, core.version)
        if arrived:
            cut |= self._decide_ready(rows)
        row_of = {q.rollout.sample_id: j for j, q in enumerate(rows)}
        done = self._retire([start + j for j in sorted(cut)])
        if cut:
            logits = logits[torch.tensor([row_of[q.rollout.sample_id]
                                          for q in core.rows[start:]],
                                         device=logits.device, dtype=torch.long)]
        fin = core.sample(logits, slice(start, len(core.rows)))
        early = [r for r in fin if r.sampling.prune is not None
                 and "decision" not in r.control.get("arrol", {})]
        need = [r for r in early if "p" not in r.control.get("arrol", {})]
        fresh = [(row_of[r.sample_id], r.response_len - 1) for r in need]
        lps = [r.logprobs[r.prompt_len:r.prompt_len + r.response_len - 1] for r in need]
        preds = dict(zip([j for j, _ in fresh], self._predict(hidden, fresh, lps)))
        for r in early:  # ended before the group was decided: a survivor
            rec, j = r.control.get("arrol", {}), row_of[r.sample_id]
            p, k = (rec["p"], rec["at"]) if "p" in rec else (preds[j], r.response_len - 1)
            self._gate_of(r).arrive(r, p, k, core.version, finished=True)
        if early:
            fin += self._retire(sorted(self._decide_ready(core.rows)))
        return done + fin

    def _predict(self, hidden: Tensor, at: list[tuple[int, int]], lps: list[list[float]]
                 ) -> list[float]:
        """The head's p for rows ``j`` at positions ``k`` (``at`` = [(j, k)]) whose prefixes
        were sampled with log-probs ``lps``."""
        if not at:
            return []
        j = torch.tensor([x for x, _ in at], device=hidden.device)
        k = torch.tensor([x for _, x in at], device=self.core.device)
        lp = torch.tensor([prefix_confidence(x) for x in lps], device=self.core.device)
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
            self.core.count("prune_decisions")
            cut |= {j for j, q in enumerate(rows) if q.rollout.group_id == gid
                    and q.rollout.index_in_group in pruned}
        return cut

    def _retire(self, slots: list[int]) -> list[Rollout]:
        core = self.core
        out = [core.finish(core.rows[i], "pruned") for i in slots]
        core.release(slots)
        core.count("requests_pruned", len(out))
        core.count("requests_finished", len(out))
        return out

    @staticmethod
    def _resp_len(q: Request) -> int:
        """Response tokens sampled so far (the unflushed ones included)."""
        r = q.rollout
        return len(r.tokens) - r.prompt_len + len(q.toks) - q.flushed

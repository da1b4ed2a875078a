"""The branching plug-in (LATR trees, `reroll.engine.branch`): a request carrying a
`BranchRule` spawns a child at every token where the rule fires, while its tree has spares.

Owns the engine side of `reroll.engine.branch` (which decides) and the live trees (its
`TreeTable`): `branch` (a root with its spares), turning a decision into a child (its record:
the parent's prefix, then the alternative token as a ``"forced"`` span; its slot: the
engine's `seat`, a copy of the parent's cache rows or the re-prefill fallback when no slot is
free), under LATR's argmax-parent rule the parent's own token at the branch point (the most
likely one, a ``"forced"`` span where it had sampled another, fed as its next token), and
the spares of finished trees, which are added as independent requests, and LATR's lookahead
pruning: ``prune_at`` tokens after its branch point a child is compared with its parent
there (`reroll.engine.branch_prune`) and, when too similar, retired from its slot and made a
spare of its tree again (counted in ``branch_pruned``). Knows nothing of the other plug-ins.

A forced token's recorded log-prob is its log-prob under the distribution the member sampled
from at that position (the parent's top token as much as the child's alternative): what the
trainer's behaviour log-prob must be for the importance ratio of a policy token. The choice
itself is not a draw from that distribution; the correction does not undo it (at staleness
0 the ratio of a forced token is 1, as for a sampled one), as LATR trains its leaves as
independent samples.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from reroll.engine.branch import TreeTable, Watch, branch_tokens
from reroll.engine.branch_prune import too_similar
from reroll.engine.fork import check_fork, inherit
from reroll.engine.plugin import EnginePlugin
from reroll.engine.requests import Request
from reroll.engine.sampling import scaled_logits
from reroll.rollout import FINISHED, Rollout


class Branches(EnginePlugin):
    """`branch` and the rule's hooks in sampling, retiring and aborting."""

    counters = ("branch_children", "branch_children_prefilled", "branch_spares_independent",
                "branch_pruned")

    def __init__(self, core) -> None:
        super().__init__(core)
        self.trees = TreeTable()
        self.orphans: list[Rollout] = []  # spares of trees whose last member was pruned

    def branch(self, root: Rollout, spares: list[Rollout]) -> None:
        """Generate ``root`` (its ``sampling.branch_rule`` says where it branches) as the
        root of a tree whose children take ``spares`` (unstarted rollouts of its prompt) in
        order; children carry their own ``sampling`` (seed, and a rule to branch further).
        Every member finishes through `step` like any request; the spares no child took are
        added as independent requests once no member of the tree is left in the engine
        (``branch_spares_independent``). A greedy root never branches."""
        if root.sampling.branch_rule is None:
            raise ValueError(f"branch of rollout {root.sample_id}: it has no "
                             f"sampling.branch_rule")
        check_fork(root, spares, root.prompt_len, self.core.live(), what="branch")
        self.core.add([root])
        if spares:
            self.trees.plant(root, list(spares))

    # ---- hooks -----------------------------------------------------------------------------
    def held(self) -> set[str]:
        return self.trees.held() if self.trees else set()

    def sampled(self, sl: slice, logits: Tensor, tok: Tensor, ban: Tensor | None,
                fin: list[int]) -> list[Rollout]:
        """The children of slots ``sl`` (logits [n, V], just sampled ``tok`` [n]) whose rule
        fires at this token, spawned in the order of their members' ranks in their trees
        (`TreeTable.rank`) while the trees have spares; returns those that finished at once
        (their forced token ends them). Children copy the rows of a parent that just
        finished: its slot is still there. Then the lookahead windows of the children in
        ``sl`` (`_lookahead`)."""
        if not self.trees:
            return []
        done = self._spawn_all(sl, logits, tok, ban, fin)
        if self.trees.watch:
            self._lookahead(sl, fin)
        return done

    def _spawn_all(self, sl: slice, logits: Tensor, tok: Tensor, ban: Tensor | None,
                   fin: list[int]) -> list[Rollout]:
        core = self.core
        rows = core.rows[sl]
        banned = ban.tolist() if ban is not None else [-1] * len(rows)
        pick = [j for j, q in enumerate(rows)
                if not q.greedy and q.rollout.sampling.branch_rule is not None
                and banned[j] < 0 and self.trees.can_spawn(q.rollout.sample_id)]
        if not pick:
            return []
        at = torch.tensor(pick, device=core.device)
        slots = at + sl.start
        logp = torch.log_softmax(scaled_logits(
            logits[at], core.temp[slots], core.top_k[slots], core.top_p[slots],
            any_greedy=False, any_filter=any(rows[j].filtered for j in pick)), dim=-1)  # [k, V]
        rules = [rows[j].rollout.sampling.branch_rule for j in pick]
        taus = torch.tensor([[r.tau_abs, r.tau_rel] for r in rules], device=core.device)
        # a row that already finished on its sampled token keeps it ("sampled" for it)
        ended = set(fin)
        argmax = torch.tensor([r.parent == "argmax" and sl.start + j not in ended
                               for r, j in zip(rules, pick, strict=True)], device=core.device)
        forced, own = (x.tolist() for x in branch_tokens(logp, tok[at], taus[:, 0],
                                                         taus[:, 1], argmax))
        done = []
        # rows that fire together take their trees' spares by rank in the tree, not by slot:
        # slots move as unrelated requests finish, a tree's shape must not
        order = sorted(range(len(pick)),
                       key=lambda k: self.trees.rank(rows[pick[k]].rollout.sample_id))
        for k in order:
            j, f = pick[k], forced[k]
            child = self.trees.spawn(rows[j].rollout.sample_id) if f >= 0 else None
            if child is None:  # None: no fire, or an earlier row took the tree's last spare
                continue
            if own[k] != int(tok[at[k]]):
                done += self._take(rows[j], sl.start + j, own[k], float(logp[k, own[k]]), fin)
            done += self._spawn(rows[j], sl.start + j, child, f, float(logp[k, f]))
        return done

    def _lookahead(self, sl: slice, fin: list[int]) -> None:
        """LATR's pruning: each child of slots ``sl`` that has sampled a window (``prune_at``
        tokens from its forced token on) is compared with its parent's tokens there, once
        the parent has them; a child too similar (`too_similar`) leaves its slot (it joins
        ``fin``: the step releases it) and becomes its tree's next spare again. A window is
        skipped where either member ends inside it (its last token there, as LATR skips a
        window holding EOS), and a child ending at this token is not compared."""
        core = self.core
        by_id = {q.rollout.sample_id: q for q in core.rows}
        for j, q in enumerate(core.rows[sl]):
            w = self.trees.watch.get(q.rollout.sample_id)
            if w is None or sl.start + j in fin:
                continue
            mine = _tokens(q)
            pq = by_id.get(w.parent.sample_id)
            theirs = _tokens(pq) if pq is not None else w.parent.tokens
            ended = pq is None and w.parent.finish in FINISHED
            while w.left and len(mine) >= w.at + w.left[0]:
                end = w.at + w.left[0]
                if len(theirs) < end or (ended and len(theirs) == end):
                    if ended:  # the parent ended inside this window (and every later one)
                        w.left.clear()
                    break  # else the parent has not sampled it yet
                w.left.pop(0)
                if too_similar(mine[w.at:end], theirs[w.at:end], w.rule):
                    fin.append(sl.start + j)
                    self.orphans += self.trees.prune(q.rollout)
                    core.count("branch_pruned")
                    break

    def stepped(self, done: list[Rollout]) -> None:
        """Finished members leave their trees; a tree's unused spares become requests."""
        if self.orphans:
            self._add_spares(self.orphans)
            self.orphans = []
        if self.trees:
            self._add_spares(self.trees.end(r.sample_id for r in done))

    def aborted(self, wanted: set[str]) -> list[Rollout]:
        """Named members and spares stop for good; returns the named spares (aborted)."""
        if not self.trees:
            return []
        named, free = self.trees.drop(wanted)
        for c in named:
            c.finish = "abort"
        self._add_spares(free)
        return named

    def added(self, q: Request) -> None:
        """LATR's argmax parent replaces a sampled token, which a stop rule has already
        counted: the two do not go together."""
        rule = q.rollout.sampling.branch_rule
        if rule is not None and rule.parent == "argmax" and q.rule is not None:
            raise ValueError(f"rollout {q.rollout.sample_id}: a BranchRule with parent "
                             f"\"argmax\" cannot go with a stop rule (parent \"sampled\" can)")

    # ---- children ----------------------------------------------------------------------------
    def _take(self, q: Request, slot: int, token: int, logprob: float,
              fin: list[int]) -> list[Rollout]:
        """At a branch point the member in ``slot`` takes ``token`` (LATR's most likely
        token) instead of the one it just sampled: span ``"forced"`` with ``logprob``, the
        token fed next. Returns its record when that token ends it (its slot joins ``fin``:
        the step releases it after the hooks)."""
        core = self.core
        q.toks.pop()
        q.lps.pop()
        q.flush(core.version)
        q.toks.append(token)
        q.lps.append(logprob)
        q.flush(core.version, "forced")
        core.next_tok[slot] = token
        if reason := q.stop_reason(token, core.decode_text):
            fin.append(slot)
            return [core.finish(q, reason)]
        return []

    def _spawn(self, q: Request, slot: int, child: Rollout, token: int,
               logprob: float) -> list[Rollout]:
        """``child`` branches off ``q`` (in ``slot``) at the token just sampled: the parent's
        tokens before it, then ``token`` (span ``"forced"``, ``logprob``). Returns it when
        that token already ends it."""
        core = self.core
        q.flush(core.version)
        t = len(q.rollout.tokens) - 1  # the position just sampled
        inherit(child, q.rollout, t)
        c = core.request(child)
        c.toks.append(token)
        c.lps.append(logprob)
        reason = c.stop_reason(token, core.decode_text)
        c.flush(core.version, "forced")
        child.timings["engine_add"] = time.time()
        core.count("requests_added")
        core.count("branch_children")
        rule = child.sampling.branch_rule or q.rollout.sampling.branch_rule
        if rule is not None and rule.prune_at:
            self.trees.watch[child.sample_id] = Watch(q.rollout, t,
                                                         sorted(set(rule.prune_at)), rule)
        if reason:
            return [core.finish(c, reason)]
        if not core.seat([c], slot, t, token):
            core.count("branch_children_prefilled")
        return []

    def _add_spares(self, spares: list[Rollout]) -> None:
        if spares:
            self.core.count("branch_spares_independent", len(spares))
            self.core.add(spares)


def _tokens(q: Request) -> list[int]:
    """A running request's tokens, those sampled and not yet in its record included."""
    return q.rollout.tokens + q.toks[q.flushed:]

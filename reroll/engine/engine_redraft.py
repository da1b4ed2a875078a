"""TorchEngine's re-drafting inside decode (DAS, `reroll.replay.suffix`): a request carrying a
`SuffixSource` gets, at every decode step, a draft proposed from the suffix of its response so
far, verified in the step's own forward.

Owns the multi-token decode step: every running row feeds its next token plus its draft
(``1 + D_i`` queries, padded to ``1 + max D`` with masked dummy queries, `SlotCache.plan_extend`),
each draft is verified exactly (`reroll.engine.speculative.verify`, q = 1, lenience 1), the
accepted prefix is recorded as span "draft" with the current policy's log-probs, stop rules
truncate it as in `reroll.engine.engine_drafts`, and every row then samples its next token
after its accepted prefix, from the residual after a rejected draft token. A row without a
source (or without a proposal this step) is a one-token decode row of the same forward.
Steps where no running row has a proposal take the plain decode path, unchanged. A mixin of
`reroll.engine.torch_engine.TorchEngine`; uses its slots and counters.

A request resumed after an abort verifies, in its re-prefill, the proposal its next decode
step would have verified (`_resume_draft`), so a seeded request samples across an abort what
it samples without one.

Drafts are clipped to the request's remaining token budget only (which keeps its real
positions below ``max_seq_len``), never to its batch-mates', so a seeded request samples the
same whatever shares its batch; padded queries past the cache's end write at its last
position (`SlotCache.plan_extend`). Engines with a quality head
(ARRoL) never re-draft: their rows need the per-step hidden states of the one-token path.
"""

from __future__ import annotations

import time

import torch

from reroll.engine.kv_cache import extend_mask
from reroll.engine.requests import Request
from reroll.engine.speculative import verify
from reroll.rollout import Draft, Rollout


class Redrafting:
    """`_redraft_decode`, for `TorchEngine`."""

    redrafting = False  # set once a request with a suffix source is added

    def _proposal(self, q: Request) -> list[int]:
        """Row ``q``'s draft this step: at most its remaining budget (which keeps its own
        positions below ``max_seq_len``), whatever shares its batch."""
        if q.suffix is None:
            return []
        r = q.rollout
        resp = r.tokens[r.prompt_len:] + q.toks[q.flushed:]  # the sampled token included
        limit = min(q.budget - len(q.toks), q.suffix.budget(len(resp)))
        return q.suffix.propose(resp, limit)

    def _resume_draft(self, q: Request) -> None:
        """A resumed request (re-prefilled after an abort) takes, as the draft its prefill
        verifies, the proposal its next decode step would have verified: the token after the
        prefix is then drawn from the same random numbers as without the abort (an
        acceptance uniform, not a sampling one), so a seeded request samples the same."""
        if q.suffix is None or not q.resume or q.budget <= 0 or self.pruning:
            return
        r = q.rollout
        resp = r.tokens[r.prompt_len:]
        d = q.suffix.propose(resp, min(q.budget, q.suffix.budget(len(resp))))
        if d:
            q.draft = Draft(tuple(d))

    def _redraft_decode(self) -> list[Rollout] | None:
        """One decode step with drafts; None when no row has a proposal (the plain step)."""
        t0 = time.perf_counter()
        n = len(self.rows)
        pos = self.pos[:n]
        drafts = [self._proposal(q) for q in self.rows]
        dmax = max(len(d) for d in drafts)
        if dmax == 0:
            return None
        ql, length = 1 + dmax, min(int(pos.max()) + 1 + dmax, self.max_seq_len)
        ids = torch.zeros(n, ql, dtype=torch.long)
        for i, d in enumerate(drafts):
            ids[i, 1:1 + len(d)] = torch.tensor(d, dtype=torch.long)
        ids = ids.to(self.device)
        ids[:, 0] = self.next_tok[:n]
        self.cache.plan_extend(pos, ql, length)
        mask = extend_mask(pos, ql, length, self.arange, self.dtype, self.additive)
        kw = {self.cache_kw: self.cache, **({"logits_to_keep": 0} if self.keep_arg else {})}
        posn = (pos.unsqueeze(1) + self.arange[:ql]).clamp(max=self.max_seq_len - 1)
        logits = self.model(input_ids=ids, position_ids=posn, attention_mask=mask,
                            use_cache=True, **kw).logits  # [n, ql, V]
        self.counts["decode_steps"] += 1
        self.counts["decode_rows"] += n
        self.counts["redraft_steps"] += 1
        pick, fin, done = {}, [], []
        for i, (q, d) in enumerate(zip(self.rows, drafts, strict=True)):
            p, kept, reason = int(pos[i]), 0, None
            if d:
                s = q.rollout.sampling
                a, lps = verify(logits[i, :len(d)], tuple(d), (), 1.0,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                key=q.seed, pos0=p + 1)
                self.counts["redraft_tokens_proposed"] += len(d)
                if a:
                    q.flush(self.version)  # the tokens sampled before the draft
                for t, lp in zip(d[:a], lps):
                    q.toks.append(t)
                    q.lps.append(lp)
                    kept += 1
                    if reason := q.stop_reason(t, self._decode_text):
                        break
                self.counts["redraft_tokens_accepted"] += kept
                if kept:
                    q.flush(self.version, "draft")
            self.pos[i] = p + 1 + kept  # the fed token and the kept draft are cached
            if reason:
                fin.append(i)
                done.append(q.finish(reason, self.version, self._decode_text))
                done += self._fire(q.rollout, len(q.rollout.tokens), None, True)
                continue
            pick[id(q)] = (i, kept, d[kept] if kept < len(d) else -1)
        self._compact(fin)
        self.counts["requests_finished"] += len(done)
        if self.rows:
            at = [pick[id(q)] for q in self.rows]
            z = dict(dtype=torch.long, device=self.device)
            rows = logits[torch.tensor([i for i, _, _ in at], **z),
                          torch.tensor([k for _, k, _ in at], **z)]  # [n', V]
            done += self._sample(rows, slice(0, len(self.rows)),
                                 torch.tensor([b for _, _, b in at], **z))
        self.counts["time_decode_s"] += time.perf_counter() - t0
        return done

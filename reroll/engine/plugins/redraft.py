"""The re-drafting plug-in (DAS): a request carrying a draft source
(`reroll.engine.requests.DraftSource`; for a `SuffixSource`, `reroll.engine.suffix`) gets, at
every decode step, a draft proposed from its response so far, verified in the step's own
forward.

Owns the multi-token decode step: every running row feeds its next token plus its draft (the
engine's `extend`), each draft is verified exactly (`reroll.engine.speculative.verify`, q = 1,
lenience 1), the accepted prefix is recorded as span "draft" with the current policy's
log-probs, stop rules truncate it as at admission (`reroll.engine.plugins.drafts`), and every
row then samples its next token after its accepted prefix, from the residual after a
rejected draft token (rule ``"residual"``, exact for these deterministic drafts). A row without a source (or without a proposal this step) is a
one-token decode row of the same forward. Steps where no running row has a proposal take the
plain decode path, unchanged.

A request resumed after an abort verifies, in its re-prefill, the proposal its next decode
step would have verified (`added`), so a seeded request samples across an abort what it
samples without one.

Drafts are clipped to the request's remaining token budget only (which keeps its real
positions below ``max_seq_len``), never to its batch-mates', so a seeded request samples the
same whatever shares its batch; padded queries past the cache's end write at its last
position (`SlotCache.plan_extend`). While a plug-in needs one-token steps (the engine's
``one_token``: a quality head reads the per-step hidden states), nothing is re-drafted.
Knows nothing of the other plug-ins nor of where a source's responses come from.
"""

from __future__ import annotations

import time

import torch

from reroll.engine.plugin import EnginePlugin
from reroll.engine.requests import Request
from reroll.engine.speculative import resample_ban, verify
from reroll.rollout import Draft, Rollout


class Redrafts(EnginePlugin):
    """The multi-token decode step and the resumed request's draft."""

    counters = ("redraft_steps", "redraft_tokens_proposed", "redraft_tokens_accepted")

    def __init__(self, core) -> None:
        super().__init__(core)
        self.active = False  # set once a request with a source is added

    def added(self, q: Request) -> None:
        """A resumed request (re-prefilled after an abort) takes, as the draft its prefill
        verifies, the proposal its next decode step would have verified: the token after the
        prefix is then drawn from the same random numbers as without the abort (an
        acceptance uniform, not a sampling one), so a seeded request samples the same."""
        if q.suffix is None:
            return
        self.active = True
        if not q.resume or q.budget <= 0 or self.core.one_token:
            return
        r = q.rollout
        resp = r.tokens[r.prompt_len:]
        d = q.suffix.propose(resp, min(q.budget, q.suffix.budget(len(resp))))
        if d:
            q.draft = Draft(tuple(d))

    def decode(self) -> list[Rollout] | None:
        """One decode step with drafts; None when no row has a proposal (the plain step)."""
        core = self.core
        if not self.active or core.one_token or all(q.suffix is None for q in core.rows):
            return None
        t0 = time.perf_counter()
        drafts = [_proposal(q) for q in core.rows]
        if max(len(d) for d in drafts) == 0:
            return None
        pos = core.pos[:len(core.rows)]
        logits = core.extend(drafts)  # [n, 1 + max D, V]
        core.count("redraft_steps")
        pick, fin, done = {}, [], []
        for i, (q, d) in enumerate(zip(core.rows, drafts, strict=True)):
            p, kept, reason = int(pos[i]), 0, None
            if d:
                s = q.rollout.sampling
                a, lps = verify(logits[i, :len(d)], tuple(d), (), 1.0,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                key=q.seed, pos0=p + 1)
                core.count("redraft_tokens_proposed", len(d))
                if a:
                    q.flush(core.version)  # the tokens sampled before the draft
                for t, lp in zip(d[:a], lps):
                    q.toks.append(t)
                    q.lps.append(lp)
                    kept += 1
                    if reason := q.stop_reason(t, core.decode_text):
                        break
                core.count("redraft_tokens_accepted", kept)
                if kept:
                    q.flush(core.version, "draft")
            core.pos[i] = p + 1 + kept  # the fed token and the kept draft are cached
            if reason:
                fin.append(i)
                done.append(core.finish(q, reason))
                done += core.ended(q.rollout)
                continue
            pick[id(q)] = (i, kept, resample_ban(tuple(d), kept, "residual"))
        core.release(fin)
        core.count("requests_finished", len(done))
        if core.rows:
            at = [pick[id(q)] for q in core.rows]
            z = dict(dtype=torch.long, device=core.device)
            rows = logits[torch.tensor([i for i, _, _ in at], **z),
                          torch.tensor([k for _, k, _ in at], **z)]  # [n', V]
            done += core.sample(rows, slice(0, len(core.rows)),
                                torch.tensor([b for _, _, b in at], **z))
        core.count("time_decode_s", time.perf_counter() - t0)
        return done


def _proposal(q: Request) -> list[int]:
    """Row ``q``'s draft this step: at most its remaining budget (which keeps its own
    positions below ``max_seq_len``), whatever shares its batch."""
    if q.suffix is None:
        return []
    r = q.rollout
    resp = r.tokens[r.prompt_len:] + q.toks[q.flushed:]  # the sampled token included
    limit = min(q.budget - len(q.toks), q.suffix.budget(len(resp)))
    return q.suffix.propose(resp, limit)

"""The draft plug-in (speculative rollouts, SPEC-RL / DAS): requests admitted with a draft
keep its accepted prefix and sample on from the first rejected position.

Owns the engine side of `reroll.engine.speculative` (which holds the acceptance rule):
reading each draft's rows of the packed prefill logits (the engine prefills a request's
draft after its prompt, with one logits row per draft token + 1), recording the kept tokens
(span "draft", the current policy's log-probs), retiring requests that end inside their
draft, and sampling every other just-admitted slot (at a rejected position from the whole
current distribution or from its residual, as the draft's ``resample`` says). Knows nothing of the other plug-ins.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.engine.plugin import EnginePlugin
from reroll.engine.requests import Request
from reroll.engine.speculative import resample_ban, verify
from reroll.rollout import Rollout


class Drafts(EnginePlugin):
    """The sampling after a prefill that holds drafts."""

    counters = ("draft_tokens_proposed", "draft_tokens_accepted")

    def prefilled(self, logits: Tensor, chosen: list[tuple[Request, int]], nd: list[int],
                  n0: int) -> list[Rollout]:
        """Just-prefilled slots ``n0 ..`` (logits [R, V]: D + 1 rows per unique sequence
        with a D-token draft, 1 without): keep each draft's accepted prefix (span "draft"),
        retire requests that end inside it, then sample every other slot's next token (after
        a rejected draft token by the draft's ``resample`` rule, `reroll.engine.speculative`)."""
        core = self.core
        off = [0]
        for d in nd:
            off.append(off[-1] + d + 1)
        pick, fin, done = {}, [], []
        for j, (q, u) in enumerate(chosen):
            d, ban = q.draft, -1
            if d is not None:
                s, r = q.rollout.sampling, q.rollout
                n, lps = verify(logits[off[u]:off[u] + nd[u]], d.tokens, d.logprobs, d.lenience,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                key=q.seed, pos0=len(r.tokens))
                core.count("draft_tokens_proposed", nd[u])
                reason = None
                for t, lp in zip(d.tokens[:n], lps):
                    q.toks.append(t)
                    q.lps.append(lp)
                    if reason := q.stop_reason(t, core.decode_text):
                        break
                core.count("draft_tokens_accepted", len(q.toks))
                q.flush(core.version, "draft")
                core.pos[n0 + j] = len(r.tokens)  # the cache beyond is overwritten as it grows
                if reason:  # its children re-prefill (the slot's rows are not picked below)
                    fin.append(n0 + j)
                    done.append(core.finish(q, reason))
                    done += core.ended(r)
                    continue
                ban, n_rows = resample_ban(d.tokens, n, d.resample), n
            else:
                n_rows = nd[u]
            pick[id(q)] = (off[u] + n_rows, ban)
        core.release(fin)
        core.count("requests_finished", len(done))
        if len(core.rows) > n0:
            at = [pick[id(q)] for q in core.rows[n0:]]
            ban = torch.tensor([b for _, b in at], dtype=torch.long, device=core.device)
            done += core.sample(logits[torch.tensor([i for i, _ in at], device=core.device)],
                                slice(n0, len(core.rows)), ban)
        return done

"""TorchEngine's draft verification (speculative rollouts, SPEC-RL / DAS): requests admitted
with a draft keep its accepted prefix and sample on from the first rejected position.

Owns the engine side of `reroll.engine.speculative` (which holds the acceptance rule):
reading each draft's rows of the packed prefill logits, recording the kept tokens (span
"draft", the current policy's log-probs), retiring requests that end inside their draft, and
sampling every other just-admitted slot. A mixin of
`reroll.engine.torch_engine.TorchEngine`; uses its slots, sampler and counters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.engine.requests import Request
from reroll.engine.speculative import verify
from reroll.rollout import Rollout


class Drafting:
    """`_verify_drafts`, for `TorchEngine`."""

    def _verify_drafts(self, logits: Tensor, chosen: list[tuple[Request, int]], nd: list[int],
                       n0: int) -> list[Rollout]:
        """Just-prefilled slots ``n0 ..`` (logits [R, V]: D + 1 rows per unique sequence
        with a D-token draft, 1 without): keep each draft's accepted prefix (span "draft"),
        retire requests that end inside it, then sample every other slot's next token, from
        the residual after a rejected draft token (`reroll.engine.speculative`)."""
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
                self.counts["draft_tokens_proposed"] += nd[u]
                reason = None
                for t, lp in zip(d.tokens[:n], lps):
                    q.toks.append(t)
                    q.lps.append(lp)
                    if reason := q.stop_reason(t, self._decode_text):
                        break
                self.counts["draft_tokens_accepted"] += len(q.toks)
                q.flush(self.version, "draft")
                self.pos[n0 + j] = len(r.tokens)  # the cache beyond is overwritten as it grows
                if reason:  # its children re-prefill (the slot's rows are not picked below)
                    fin.append(n0 + j)
                    done.append(q.finish(reason, self.version, self._decode_text))
                    done += self._fire(r, len(r.tokens), None, True)
                    continue
                ban, n_rows = (d.tokens[n] if n < nd[u] else -1), n
            else:
                n_rows = nd[u]
            pick[id(q)] = (off[u] + n_rows, ban)
        self._compact(fin)
        self.counts["requests_finished"] += len(done)
        if len(self.rows) > n0:
            at = [pick[id(q)] for q in self.rows[n0:]]
            ban = torch.tensor([b for _, b in at], dtype=torch.long, device=self.device)
            done += self._sample(logits[torch.tensor([i for i, _ in at], device=self.device)],
                                 slice(n0, len(self.rows)), ban)
        return done

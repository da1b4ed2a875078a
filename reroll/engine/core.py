"""The decode core of `reroll.engine.torch_engine.TorchEngine`: the model and its KV-cache
slots, the per-slot sampling state, the forwards, sampling and recording, the stats counters,
and the surface its plug-ins use (`reroll.engine.plugin`).

Owns what a slot is: slot i holds ``rows[i]`` (a `Request`), its cache rows, ``pos[i]``
(tokens cached), ``next_tok[i]`` (sampled, not cached) and its sampling parameters; live
slots are always 0..n-1 (`release` compacts). Knows nothing of when requests are admitted
(`TorchEngine`) nor of what any plug-in does: it calls their hooks (`EnginePlugin`), only
those a plug-in's class overrides.
"""

from __future__ import annotations

import inspect
import time
from collections import deque

import torch
from torch import Tensor

from reroll.engine.kv_cache import SlotCache, extend_mask
from reroll.engine.plugin import HOOKS, overrides
from reroll.engine.requests import Request, make_request
from reroll.engine.sampling import sample, seed_key, uniforms
from reroll.rollout import Rollout

CORE_COUNTERS = ("tokens_generated", "decode_steps", "decode_rows", "prefill_forwards",
                 "prefill_tokens", "prefill_tokens_shared", "requests_added",
                 "requests_finished", "requests_aborted", "requests_resumed", "resumed_tokens",
                 "time_prefill_s", "time_decode_s")


class DecodeCore:
    def __init__(self, model, tokenizer, *, max_batch: int = 64, max_seq_len: int | None = None,
                 version: int = 0, max_prefill_tokens: int = 1024,
                 admit_batch: int | None = None, plugins: tuple = ()):
        cfg = model.config
        if max_batch < 1:
            raise ValueError(f"TorchEngine: max_batch must be >= 1, got {max_batch}")
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 2048)
        self.max_seq_len = int(max_seq_len or min(limit, 2048))
        window = getattr(cfg, "sliding_window", None)
        if window and getattr(cfg, "use_sliding_window", True) and self.max_seq_len > window:
            raise ValueError(f"TorchEngine: max_seq_len={self.max_seq_len} exceeds the model's "
                             f"sliding_window={window}, which this engine does not apply")
        if cfg._attn_implementation not in ("sdpa", "eager"):
            model.set_attn_implementation("sdpa")
        self.model, self.tok = model.eval(), tokenizer
        self.additive = cfg._attn_implementation == "eager"
        self.max_batch, self.version = max_batch, version
        self.max_prefill_tokens = max_prefill_tokens
        # a prefill forward costs about one decode step of overhead, so admissions wait until
        # this many slots are free (or every waiting request fits)
        self.admit_batch = max(1, max_batch // 8) if admit_batch is None else max(1, admit_batch)
        self.vocab = model.get_input_embeddings().num_embeddings
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self.keep_arg = "logits_to_keep" in params
        # the KV cache's keyword: ``cache`` from transformers 5.24 (``past_key_values``
        # deprecated there, to be removed in 5.40), ``past_key_values`` before
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = SlotCache(cfg.get_text_config().num_hidden_layers, max_batch,
                               self.max_seq_len)
        z = dict(device=self.device)
        self.pos = torch.zeros(max_batch, dtype=torch.long, **z)  # tokens in the slot's cache
        self.next_tok = torch.zeros(max_batch, dtype=torch.long, **z)  # sampled, not cached
        self.seed = torch.zeros(max_batch, dtype=torch.long, **z)  # seed_key of each request
        self.temp = torch.ones(max_batch, **z)
        self.top_k = torch.zeros(max_batch, dtype=torch.long, **z)
        self.top_p = torch.ones(max_batch, **z)
        self.arange = torch.arange(self.max_seq_len, **z)
        self.rows: list[Request] = []  # slot i <-> rows[i]
        self.waiting: deque[Request] = deque()
        self.unclaimed: list[Rollout] = []  # finished inside generate() for other callers
        self.plugins = tuple(cls(self) for cls in plugins)  # their hooks run in this order
        self.counts = dict.fromkeys(CORE_COUNTERS + tuple(
            c for p in self.plugins for c in p.counters), 0.0)
        self._hooks = {h: overrides(self.plugins, h) for h in HOOKS}

    def _forward(self, ids: Tensor, posn: Tensor, mask: Tensor, rows: Tensor | None) -> Tensor:
        """Logits [R, V]: at ``rows`` of a packed prefill ([1, T] input), or the last position
        of each decode row ([n, 1] input)."""
        kw = {self.cache_kw: self.cache}
        if self.keep_arg:
            kw["logits_to_keep"] = rows if rows is not None else 1
        out = self.model(input_ids=ids, position_ids=posn, attention_mask=mask,
                         use_cache=True, **kw)
        logits = out.logits
        if rows is None:
            return logits[:, -1]
        return logits[0] if self.keep_arg else logits[0, rows]

    def _place(self, n0: int, entries: list[tuple[Request, int]]) -> None:
        """Slots n0, n0+1, ... take the prefilled requests (each with its cached length):
        one indexed write per per-slot tensor, not one per request."""
        sl, z = slice(n0, n0 + len(entries)), dict(device=self.device)
        params = [q.rollout.sampling for q, _ in entries]
        greedy = [p.temperature == 0.0 for p in params]
        self.pos[sl] = torch.tensor([n for _, n in entries], dtype=torch.long, **z)
        self.seed[sl] = torch.tensor([q.seed for q, _ in entries], dtype=torch.long, **z)
        self.temp[sl] = torch.tensor([p.temperature for p in params], dtype=self.temp.dtype, **z)
        self.top_k[sl] = torch.tensor([0 if g else p.top_k for p, g in zip(params, greedy)],
                                      dtype=torch.long, **z)
        self.top_p[sl] = torch.tensor([1.0 if g else p.top_p for p, g in zip(params, greedy)],
                                      dtype=self.top_p.dtype, **z)
        now = time.time()
        for q, filled in entries:  # filled: the cache positions the request now holds
            q.rollout.timings["engine_prefill"] = now
            if q.resume:  # prompt + kept prefix re-prefilled under the current weights
                q.rollout.resume_count += 1
                self.counts["requests_resumed"] += 1
                self.counts["resumed_tokens"] += filled
            self.rows.append(q)

    def _sample_from(self, logits: Tensor, start: int, rows: Tensor | None,
                     pick: Tensor | None) -> list[Rollout]:
        """Sampling after a forward for slots ``start ..`` (see `EnginePlugin.sample`)."""
        for hook in self._hooks["sample"]:
            if (got := hook(logits, start, rows, pick)) is not None:
                return got
        return self.sample(logits, slice(start, len(self.rows)))

    # ---- the plug-ins' surface (reroll.engine.plugin) -----------------------------------
    def sample(self, logits: Tensor, sl: slice, ban: Tensor | None = None) -> list[Rollout]:
        """Sample for slots ``sl`` (logits [n, V]; ``ban`` [n], see `sample`), record,
        retire finished slots."""
        rows = self.rows[sl]
        u = uniforms(self.seed[sl], self.pos[sl])
        tok, lp = sample(logits, self.temp[sl], self.top_k[sl], self.top_p[sl], u,
                         any_greedy=any(q.greedy for q in rows),
                         any_filter=any(q.filtered for q in rows), ban=ban)
        self.next_tok[sl] = tok
        self.counts["tokens_generated"] += len(rows)
        fin, done = [], []
        for j, (q, t, p) in enumerate(zip(rows, tok.tolist(), lp.tolist(), strict=True)):
            q.toks.append(t)
            q.lps.append(p)
            if reason := q.stop_reason(t, self.decode_text):
                fin.append(sl.start + j)
                done.append(self.finish(q, reason))
        for hook in self._hooks["sampled"]:  # before the compaction: finished rows are there
            done += hook(sl, logits, tok, ban, fin)
        self.release(fin)
        self.counts["requests_finished"] += len(done)
        return done

    def release(self, gone: list[int]) -> None:
        """Drop slots ``gone``; move the last live slots into the holes so that the live
        ones are 0..n-1 again (cache, sampling state and rows)."""
        if not gone:
            return
        n = len(self.rows)
        dead = set(gone)
        n_new = n - len(dead)
        holes = [i for i in sorted(dead) if i < n_new]
        movers = [i for i in range(n_new, n) if i not in dead]
        if holes:
            dst = torch.tensor(holes, device=self.device)
            src = torch.tensor(movers, device=self.device)
            self.cache.move(dst, src, int(self.pos[src].max()) + 1)
            for t in (self.pos, self.next_tok, self.seed, self.temp, self.top_k, self.top_p):
                t[dst] = t[src]
            for h, m in zip(holes, movers, strict=True):
                self.rows[h] = self.rows[m]
        del self.rows[n_new:]

    def seat(self, reqs: list[Request], slot: int | None, cached: int, feed: int) -> int:
        """Free slots take ``reqs`` with a copy of ``slot``'s first ``cached`` cache rows and
        ``feed`` as the token to decode next; the rest (all when ``slot`` is None) go to the
        front of the queue and re-prefill their prefix. Returns how many took a slot."""
        k = 0 if slot is None else min(len(reqs), self.max_batch - len(self.rows))
        if k:
            n0 = len(self.rows)
            self._place(n0, [(q, cached) for q in reqs[:k]])
            dst = torch.arange(n0, n0 + k, device=self.device)
            self.cache.move(dst, torch.full((k,), slot, device=self.device), cached)
            self.next_tok[dst] = feed
        for q in reversed(reqs[k:]):
            self.waiting.appendleft(q)
        return k

    def extend(self, drafts: list[list[int]]) -> Tensor:
        """One forward of every running slot over its next token and its draft (``1 + D_i``
        queries, padded to ``1 + max D`` with masked dummy queries): logits [n, 1 + max D, V].
        Counts a decode step; the caller sets each slot's ``pos`` to what it keeps."""
        n, dmax = len(self.rows), max(len(d) for d in drafts)
        pos = self.pos[:n]
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
        return logits

    def logit_rows(self, t: Tensor, rows: Tensor | None) -> Tensor:
        """The rows of a forward's per-position tensor ``t`` (e.g. hidden states) that its
        logits were made from (`_forward`'s ``rows``)."""
        if rows is None:
            return t[:, -1]
        return t[0] if self.keep_arg else t[0, rows]

    @property
    def one_token(self) -> bool:
        """Whether a plug-in needs one-token decode steps now (no multi-token step)."""
        return any(p.one_token for p in self.plugins)

    def request(self, r: Rollout) -> Request:
        """The request of a child whose record holds its inherited prefix (not a resume)."""
        seed = r.sampling.seed
        seed = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
        q = make_request(r, vocab=self.vocab, max_seq_len=self.max_seq_len, seed=seed_key(seed))
        q.resume = False  # its prefix is inherited, not a resume of its own
        return q

    def finish(self, q: Request, reason: str) -> Rollout:
        return q.finish(reason, self.version, self.decode_text)

    def ended(self, r: Rollout) -> list[Rollout]:
        """``r`` finished with no cache row to share: the plug-ins' `ended` hooks."""
        done = []
        for hook in self._hooks["ended"]:
            done += hook(r)
        return done

    def emit(self, rollouts: list[Rollout]) -> None:
        """Records finished outside a step, handed out by the next `step`."""
        self.unclaimed += rollouts

    def count(self, name: str, n: float = 1.0) -> None:
        self.counts[name] += n

    def add_counters(self, *names: str) -> None:
        """Stats counters that start now (at 0; kept if they exist)."""
        for name in names:
            self.counts.setdefault(name, 0.0)

    def live(self) -> set[str]:
        """Sample ids in the engine: running, waiting, or held by a plug-in."""
        live = {q.rollout.sample_id for q in self.rows} | {q.rollout.sample_id for q in self.waiting}
        for hook in self._hooks["held"]:
            live |= hook()
        return live

    @staticmethod
    def length(q: Request) -> int:
        """The request's sequence length, sampled tokens not yet flushed included."""
        return len(q.rollout.tokens) + len(q.toks) - q.flushed

    def decode_text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

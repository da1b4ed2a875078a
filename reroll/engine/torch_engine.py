"""TorchEngine: continuous batching over a fixed pool of KV-cache slots, any transformers
causal LM, CPU or GPU.

Owns the scheduling of requests into slots (admit with one packed prefill, one decode step for
all running slots, retire and compact), the per-slot sampling state and the engine's policy
version. Knows nothing of rewards, groups' advantages, trainers or threads; the records it
fills are `reroll.rollout.Rollout`.

Per step: waiting requests are admitted while slots are free (identical token sequences, the
n samples of one prompt, are prefilled once and their keys/values copied into each slot), each
admitted request samples its first token from its prefill logits, then every running slot
decodes one token. The model runs through its normal ``forward`` with a `SlotCache`, explicit
per-row ``position_ids`` and a 4D mask, so rows of different lengths never need padding.

Behaviour log-probs are recorded under the distribution actually sampled from (see
`reroll.engine.sampling`): with ``top_k = 0`` and ``top_p = 1`` that is exactly the trainer's
``log_softmax(logits / temperature)`` over the full vocabulary; greedy requests record the
temperature-1 log-prob of the argmax token. Every token carries the engine ``version`` at the
moment it was sampled. ``update_weights`` does not touch running slots' caches (computed with
the old weights); abort + add (a resume) re-prefills them under the new ones.

Seeds: a request with ``sampling.seed`` samples reproducibly whatever shares its batch (the
random number of each token is a hash of (seed, token position)); a request without one gets a
seed from torch's global generator when it is added.

Forks (`fork`, in `reroll.engine.engine_forks`): children of a running sequence take free
slots with a copy of its cache rows (no forward over the shared prefix) and decode from the
next step on; children that find no free slot re-prefill the prefix instead
(``fork_children_prefilled``). Branches (`branch`, in `reroll.engine.engine_branches`): a
request carrying a `BranchRule` spawns, where the rule fires, a child that takes the next spare
of its tree, a copy of its cache rows and the alternative token. Drafts
(`reroll.engine.engine_drafts`): a request's draft is prefilled after its prompt and verified
in the same forward; a request carrying a `SuffixSource` re-drafts at every decode step
(`reroll.engine.engine_redraft`). Pruning
(`reroll.engine.engine_prune`, with a quality head loaded): the members of a group carrying a
`PruneRule` are admitted together and cut at its checkpoint from their hidden states there.
"""

from __future__ import annotations

import inspect
import time
from collections import deque

import torch
from torch import Tensor

from reroll.engine.branch import TreeTable
from reroll.engine.engine_branches import Branching
from reroll.engine.engine_drafts import Drafting
from reroll.engine.engine_forks import Forking
from reroll.engine.engine_prune import Pruning
from reroll.engine.engine_redraft import Redrafting
from reroll.engine.fork import ForkTable
from reroll.engine.kv_cache import SlotCache, decode_mask, prefill_mask
from reroll.engine.requests import Request, make_request
from reroll.engine.sampling import sample, seed_key, uniforms
from reroll.rollout import Rollout


class TorchEngine(Forking, Branching, Drafting, Redrafting, Pruning):
    def __init__(self, model, tokenizer, *, max_batch: int = 64, max_seq_len: int | None = None,
                 version: int = 0, max_prefill_tokens: int = 1024,
                 admit_batch: int | None = None):
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
        self.counts = dict.fromkeys(
            ["tokens_generated", "decode_steps", "decode_rows", "prefill_forwards",
             "prefill_tokens", "prefill_tokens_shared", "requests_added", "requests_finished",
             "requests_aborted", "requests_resumed", "time_prefill_s", "time_decode_s",
             "draft_tokens_proposed", "draft_tokens_accepted", "fork_children",
             "fork_tokens_shared", "fork_children_prefilled", "branch_children",
             "branch_children_prefilled", "branch_spares_independent", "redraft_steps",
             "redraft_tokens_proposed", "redraft_tokens_accepted"], 0.0)
        self.forks = ForkTable()
        self.trees = TreeTable()

    # ---- public API (reroll.engine.base.Engine) ----------------------------------------
    def add(self, rollouts: list[Rollout],
            turns: list[tuple[int, int] | None] | None = None) -> None:
        live = self._live()
        new = []
        for i, r in enumerate(rollouts):
            seed = r.sampling.seed if isinstance(r, Rollout) else None
            seed = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
            q = make_request(r, vocab=self.vocab, max_seq_len=self.max_seq_len,
                             seed=seed_key(seed), turn=turns[i] if turns else None)
            if r.sample_id in live:
                raise ValueError(f"rollout {r.sample_id} is already in the engine")
            self._check_rule(r)
            self.redrafting |= q.suffix is not None
            self._resume_draft(q)
            live.add(r.sample_id)
            new.append(q)
        now = time.time()
        for q in new:
            r = q.rollout
            r.finish = "running"  # q.resume (tokens of this call already sampled) counts later
            if r.start_version < 0:
                r.start_version = self.version
            r.timings["engine_add"] = now
            self.waiting.append(q)
        self.counts["requests_added"] += len(new)

    def pending(self) -> int:
        """Waiting + running requests, plus finished ones that `generate` collected for
        another caller and the next `step` hands out."""
        return len(self.waiting) + len(self.rows) + len(self.unclaimed)

    def step(self) -> list[Rollout]:
        done, self.unclaimed = self.unclaimed, []
        with torch.inference_mode():
            done += self._admit()
            if self.rows:
                done += self._decode()
        if self.trees:
            self._settle_trees(done)
        return done

    def generate(self, rollouts: list[Rollout]) -> list[Rollout]:
        self.add(rollouts)
        mine = {r.sample_id for r in rollouts}
        while mine:
            for r in self.step():
                if r.sample_id in mine:
                    mine.discard(r.sample_id)
                else:
                    self.unclaimed.append(r)
        return list(rollouts)

    def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        wanted = None if sample_ids is None else set(sample_ids)
        hit = (lambda q: True) if wanted is None else (lambda q: q.rollout.sample_id in wanted)
        out = []
        for q in [q for q in self.waiting if hit(q)]:
            self.waiting.remove(q)
            out.append(q.finish("abort", self.version, self._decode_text))
        rows = [i for i, q in enumerate(self.rows) if hit(q)]
        out += [self.rows[i].finish("abort", self.version, self._decode_text) for i in rows]
        with torch.inference_mode():
            self._compact(rows)
        if sample_ids is not None:  # children waiting for a fork (abort(None) keeps them)
            for c in self.forks.drop(wanted):
                c.finish = "abort"
                out.append(c)
            if self.trees:  # spares named, or left over by members stopped for good
                out += self._abort_trees(wanted)
        self.counts["requests_aborted"] += len(out)
        return out

    def sync(self) -> list[Rollout]:
        """Bring every in-flight record up to date (all tokens sampled so far, with their
        log-probs and versions), without interrupting anything; returns them."""
        for q in self.rows:
            q.flush(self.version)
        return [q.rollout for q in self.rows] + [q.rollout for q in self.waiting]

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        for q in self.rows:
            q.flush(self.version)  # tokens sampled so far keep the old version
        state_dict = self._take_head(state_dict)  # ARRoL's quality head, if published
        try:
            with torch.no_grad():
                self.model.load_state_dict(state_dict, strict=True)
        except RuntimeError as e:
            raise ValueError(f"update_weights(version={version}): state_dict does not match "
                             f"the engine's model: {e}") from e
        self.version = int(version)

    def stats(self) -> dict[str, float]:
        s = dict(self.counts)
        steps = max(s["decode_steps"], 1.0)
        s["mean_batch"] = s["decode_rows"] / steps
        s["mean_occupancy"] = s["decode_rows"] / steps / self.max_batch
        s["running"], s["waiting"] = float(len(self.rows)), float(len(self.waiting))
        s["kv_cache_bytes"] = float(self.cache.nbytes())
        s["version"] = float(self.version)
        return s

    # ---- scheduling -------------------------------------------------------------------
    def _admit(self) -> list[Rollout]:
        """Prefill as many waiting requests as there are free slots (packed, deduplicated)."""
        done, chosen, uniq, lens, nd = [], [], {}, [], []
        budget = self.max_prefill_tokens
        if self.max_batch - len(self.rows) < min(self.admit_batch, len(self.waiting)):
            return done
        while self.waiting and len(self.rows) + len(chosen) < self.max_batch:
            q = self.waiting[0]
            if self.pruning and not self._same_group(q, chosen) and not self._group_fits(
                    q, len(self.rows) + len(chosen)):
                break  # a pruned group's members are admitted together (lockstep)
            if q.budget <= 0:  # nothing left to sample (max_new_tokens already reached)
                self.waiting.popleft()
                done.append(q.finish("length", self.version, self._decode_text))
                done += self._fire(q.rollout, len(q.rollout.tokens), None, True)
                continue
            d = q.draft.tokens if q.draft is not None else ()
            key = (tuple(q.rollout.tokens) + d, len(d))  # a draft is prefilled after its prompt
            if key not in uniq:
                if lens and sum(lens) + len(key[0]) > budget and not (
                        self.pruning and self._same_group(q, chosen)):
                    break
                uniq[key] = len(lens)
                lens.append(len(key[0]))
                nd.append(len(d))
            chosen.append((q, uniq[key]))
            self.waiting.popleft()
        if not chosen:
            return done
        t0 = time.perf_counter()
        keys = [k for k, _ in uniq]
        starts = torch.tensor([0] + lens[:-1]).cumsum(0)  # [U] packed offset of each sequence
        ids = torch.tensor([t for k in keys for t in k], device=self.device)
        posn = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        n0, k = len(self.rows), len(chosen)
        which = torch.tensor([u for _, u in chosen])  # [k] unique sequence of each request
        n = torch.tensor(lens)[which]  # [k] its length
        slot = torch.repeat_interleave(torch.arange(n0, n0 + k), n)  # [sum n] cache row
        first = torch.repeat_interleave(n.cumsum(0) - n, n)  # [sum n] its row's first entry
        pos = torch.arange(len(slot)) - first  # [sum n] position within the sequence
        src = torch.repeat_interleave(starts[which], n) + pos  # [sum n] packed prefill index
        self.cache.plan_prefill(slot.to(self.device), pos.to(self.device), src.to(self.device))
        last = starts + torch.tensor(lens) - 1  # [U]
        if any(nd):  # a draft of D tokens needs the D + 1 rows from its prompt's last on
            last = torch.cat([torch.arange(e - d, e + 1) for e, d in zip(last.tolist(), nd)])
        mask = prefill_mask(lens, self.dtype, self.additive, self.device)
        logits = self._forward(ids[None], posn[None], mask, last.to(self.device))  # [R, V]
        self._place(n0, [(q, lens[u]) for q, u in chosen])
        self.counts["prefill_forwards"] += 1
        self.counts["prefill_tokens"] += sum(lens)
        self.counts["prefill_tokens_shared"] += sum(lens[u] for _, u in chosen) - sum(lens)
        if any(nd):
            done += self._verify_drafts(logits, chosen, nd, n0)
        elif self.pruning:
            w = which.to(self.device)
            done += self._gated_sample(logits[w], self._hidden_rows(last.to(self.device))[w], n0)
        else:
            done += self._sample(logits[which.to(self.device)], slice(n0, n0 + k))
        self.counts["time_prefill_s"] += time.perf_counter() - t0
        return done

    def _decode(self) -> list[Rollout]:
        if self.redrafting and not self.pruning and any(q.suffix is not None for q in self.rows):
            done = self._redraft_decode()
            if done is not None:
                return done
        t0 = time.perf_counter()
        n = len(self.rows)
        pos = self.pos[:n]
        length = int(pos.max()) + 1
        self.cache.plan_decode(pos, length)
        mask = decode_mask(pos, length, self.arange, self.dtype, self.additive)
        logits = self._forward(self.next_tok[:n, None], pos[:, None], mask, None)
        pos += 1  # the fed token is now cached; the new one sits at index pos
        self.counts["decode_steps"] += 1
        self.counts["decode_rows"] += n
        done = (self._gated_sample(logits, self._hidden_rows(None), 0) if self.pruning
                else self._sample(logits, slice(0, n)))
        self.counts["time_decode_s"] += time.perf_counter() - t0
        return done

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
        for q, _ in entries:
            q.rollout.timings["engine_prefill"] = now
            if q.resume:  # prompt + kept prefix re-prefilled under the current weights
                q.rollout.resume_count += 1
                self.counts["requests_resumed"] += 1
            self.rows.append(q)

    def _sample(self, logits: Tensor, sl: slice, ban: Tensor | None = None) -> list[Rollout]:
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
            if reason := q.stop_reason(t, self._decode_text):
                fin.append(sl.start + j)
                done.append(q.finish(reason, self.version, self._decode_text))
        if self.forks:  # before the compaction: a finished parent's rows are still there
            for j, q in enumerate(rows):
                if q.rollout.sample_id in self.forks.pending:
                    i = sl.start + j
                    done += self._fire(q.rollout, self._length(q), i, i in fin)
        if self.trees:  # likewise: children copy the rows of a parent that just finished
            done += self._branch(logits, sl, tok, ban)
        self._compact(fin)
        self.counts["requests_finished"] += len(done)
        return done

    def _compact(self, gone: list[int]) -> None:
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

    # ---- forks --------------------------------------------------------------------------
    def _live(self) -> set[str]:
        live = {q.rollout.sample_id for q in self.rows} | {q.rollout.sample_id for q in self.waiting}
        live = live | self.forks.waiting_children() if self.forks else live
        return live | self.trees.held() if self.trees else live

    @staticmethod
    def _length(q: Request) -> int:
        """The request's sequence length, sampled tokens not yet flushed included."""
        return len(q.rollout.tokens) + len(q.toks) - q.flushed

    def _decode_text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

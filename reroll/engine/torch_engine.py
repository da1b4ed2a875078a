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

Everything beyond plain sampling is a plug-in (`reroll.engine.plugin`, the hooks and the
surface they may use; `reroll.engine.plugins`): forks and branches (children that take a copy
of a running sequence's cache rows), drafts verified at admission, re-drafting inside decode,
and pruning at a checkpoint with a quality head. The engine keeps their public entry points
(`fork`, `branch`, `load_head`) and hands them on.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from reroll.engine.core import DecodeCore
from reroll.engine.kv_cache import decode_mask, prefill_mask
from reroll.engine.lora_apply import Bases
from reroll.engine.lora_apply import split as split_adapters
from reroll.engine.plugins.branches import Branches
from reroll.engine.plugins.drafts import Drafts
from reroll.engine.plugins.forks import Forks
from reroll.engine.plugins.prune import Pruning
from reroll.engine.plugins.redraft import Redrafts
from reroll.engine.requests import make_request
from reroll.engine.sampling import seed_key
from reroll.rollout import Rollout

# the order their hooks run in: a fork's children before a branch's; a prune rule checked
# before a resume is drafted
PLUGINS = (Drafts, Forks, Branches, Pruning, Redrafts)


class TorchEngine(DecodeCore):
    """The step-wise engine core (`reroll.engine.base.EngineCore`) with its plug-ins."""

    def __init__(self, model, tokenizer, *, max_batch: int = 64, max_seq_len: int | None = None,
                 version: int = 0, max_prefill_tokens: int = 1024,
                 admit_batch: int | None = None):
        super().__init__(model, tokenizer, max_batch=max_batch, max_seq_len=max_seq_len,
                         version=version, max_prefill_tokens=max_prefill_tokens,
                         admit_batch=admit_batch, plugins=PLUGINS)
        self.drafts, self.forks, self.branches, self.prune, self.redrafts = self.plugins
        self.bases = Bases(model)  # LoRA publishes' base weights (none: off)

    # ---- public API (reroll.engine.base.Engine) ----------------------------------------
    def add(self, rollouts: list[Rollout],
            turns: list[tuple[int, int] | None] | None = None) -> None:
        live = self.live()
        added = self._hooks["added"]
        new = []
        for i, r in enumerate(rollouts):
            seed = r.sampling.seed if isinstance(r, Rollout) else None
            seed = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
            q = make_request(r, vocab=self.vocab, max_seq_len=self.max_seq_len,
                             seed=seed_key(seed), turn=turns[i] if turns else None)
            if r.sample_id in live:
                raise ValueError(f"rollout {r.sample_id} is already in the engine")
            for hook in added:
                hook(q)
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
        for hook in self._hooks["stepped"]:
            hook(done)
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
            out.append(self.finish(q, "abort"))
        rows = [i for i, q in enumerate(self.rows) if hit(q)]
        out += [self.finish(self.rows[i], "abort") for i in rows]
        with torch.inference_mode():
            self.release(rows)
        if sample_ids is not None:  # what plug-ins hold (abort(None) keeps it)
            for hook in self._hooks["aborted"]:
                out += hook(wanted)
        self.counts["requests_aborted"] += len(out)
        return out

    def sync(self) -> list[Rollout]:
        """Bring every in-flight record up to date (all tokens sampled so far, with their
        log-probs and versions), without interrupting anything; returns them."""
        for q in self.rows:
            q.flush(self.version)
        return [q.rollout for q in self.rows] + [q.rollout for q in self.waiting]

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Load ``state_dict`` as policy ``version``: every tensor of the model, or some of
        them (the others keep what they hold), and LoRA adapters (``m.lora_A``, ``m.lora_B``,
        ``m.lora_scale``: a LoRA publish after the first sends these alone), which the engine
        merges over the base weights it keeps (`reroll.engine.lora_apply`). A name the model
        lacks, a wrong shape or an adapter without its base is refused before anything is
        loaded."""
        for hook in self._hooks["weights"]:  # e.g. a quality head published with them
            state_dict = hook(state_dict)
        plain, adapters = split_adapters(state_dict)
        own = self.model.state_dict()
        unknown = sorted(k for k in plain if k not in own)
        wrong = sorted(k for k in plain if k in own and plain[k].shape != own[k].shape)
        bad = self.bases.check(plain, adapters)
        if unknown or wrong or bad:
            parts = [f"{what} {keys[:3]}{' ...' if len(keys) > 3 else ''}"
                     for what, keys in (("names the engine's model lacks", unknown),
                                        ("wrong shapes", wrong), ("LoRA adapters", bad)) if keys]
            raise ValueError(f"update_weights(version={version}): the state dict does not "
                             f"match the engine's model ({len(state_dict)} tensors; "
                             + "; ".join(parts) + "); nothing was loaded")
        for q in self.rows:
            q.flush(self.version)  # tokens sampled so far keep the old version
        with torch.no_grad():
            self.model.load_state_dict(plain, strict=len(plain) == len(own))
        self.bases.apply(plain, adapters)
        self.version = int(version)

    def stats(self) -> dict[str, float]:
        s = dict(self.counts)
        steps = max(s["decode_steps"], 1.0)
        s["mean_batch"] = s["decode_rows"] / steps
        s["mean_occupancy"] = s["decode_rows"] / steps / self.max_batch
        s["running"], s["waiting"] = float(len(self.rows)), float(len(self.waiting))
        s["kv_cache_bytes"] = float(self.cache.nbytes())
        s["lora_base_bytes"] = float(self.bases.nbytes())  # kept for adapter publishes
        s["version"] = float(self.version)
        return s

    # ---- scheduling -------------------------------------------------------------------
    def _admit(self) -> list[Rollout]:
        """Prefill as many waiting requests as there are free slots (packed, deduplicated)."""
        done, chosen, uniq, lens, nd = [], [], {}, [], []
        budget = self.max_prefill_tokens
        if self.max_batch - len(self.rows) < min(self.admit_batch, len(self.waiting)):
            return done
        admit = self._hooks["admit"]
        while self.waiting and len(self.rows) + len(chosen) < self.max_batch:
            q = self.waiting[0]
            say = None
            for hook in admit:  # e.g. a pruned group's members are admitted together
                say = hook(q, chosen, len(self.rows) + len(chosen)) or say
            if say == "wait":
                break
            if q.budget <= 0:  # nothing left to sample (max_new_tokens already reached)
                self.waiting.popleft()
                done.append(self.finish(q, "length"))
                done += self.ended(q.rollout)
                continue
            d = q.draft.tokens if q.draft is not None else ()
            key = (tuple(q.rollout.tokens) + d, len(d))  # a draft is prefilled after its prompt
            if key not in uniq:
                if lens and sum(lens) + len(key[0]) > budget and say != "with":
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
        last = last.to(self.device)
        logits = self._forward(ids[None], posn[None], mask, last)  # [R, V]
        self._place(n0, [(q, lens[u]) for q, u in chosen])
        self.counts["prefill_forwards"] += 1
        self.counts["prefill_tokens"] += sum(lens)
        self.counts["prefill_tokens_shared"] += sum(lens[u] for _, u in chosen) - sum(lens)
        got = None
        if any(nd):
            for hook in self._hooks["prefilled"]:
                if (got := hook(logits, chosen, nd, n0)) is not None:
                    break
        if got is None:
            w = which.to(self.device)
            got = self._sample_from(logits[w], n0, last, w)
        done += got
        self.counts["time_prefill_s"] += time.perf_counter() - t0
        return done

    def _decode(self) -> list[Rollout]:
        for hook in self._hooks["decode"]:
            if (done := hook()) is not None:
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
        done = self._sample_from(logits, 0, None, None)
        self.counts["time_decode_s"] += time.perf_counter() - t0
        return done

    # ---- the plug-ins' public entry points -----------------------------------------------
    def fork(self, parent: Rollout, children: list[Rollout], at: int) -> None:
        """See `reroll.engine.plugins.forks.Forks.fork`."""
        self.forks.fork(parent, children, at)

    def branch(self, root: Rollout, spares: list[Rollout]) -> None:
        """See `reroll.engine.plugins.branches.Branches.branch`."""
        self.branches.branch(root, spares)

    def load_head(self, tensors: dict[str, Tensor]) -> None:
        """See `reroll.engine.plugins.prune.Pruning.load_head`."""
        self.prune.load_head(tensors)

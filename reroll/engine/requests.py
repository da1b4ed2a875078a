"""One in-flight generation request: validation, its token buffer, stop checks (including a
control policy's `StopRule`: a marker gate and an abort horizon), flushing into the
`Rollout` record.

Owns the per-request bookkeeping that the engine does in Python (cheap per token: two list
appends and a set lookup). Knows nothing of tensors, caches or the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from reroll.engine.suffix import index_of
from reroll.rollout import FINISHED, Draft, Rollout, Source, StopRule


class DraftSource(Protocol):
    """What a request re-drafts from as it decodes (`Request.suffix`; DAS's
    `reroll.engine.suffix.SuffixIndex` for a `SuffixSource`)."""

    def budget(self, generated: int) -> int:
        """Draft tokens for a row that has generated ``generated`` response tokens."""

    def propose(self, context: list[int], budget: int) -> list[int]:
        """At most ``budget`` tokens to follow ``context`` (the response so far)."""


@dataclass(slots=True)
class Request:
    rollout: Rollout
    budget: int  # tokens this request may still sample (max_new_tokens / context bound)
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    seed: int  # the request's int64 key for the counter-based sampler (sampling.seed_key)
    greedy: bool
    filtered: bool  # top-k or top-p in use (never for greedy requests)
    toks: list[int] = field(default_factory=list)  # sampled, not yet all in the record
    lps: list[float] = field(default_factory=list)
    flushed: int = 0  # toks[:flushed] are already in the record
    window: int = 0  # tokens of response tail decoded for stop-string checks
    resp_prev: list[int] = field(default_factory=list)  # response tokens before this add
    resume: bool = False  # this call already sampled tokens before (re-prefilled prefix)
    turn_start: int = 0  # index in the record where this call's sampled tokens begin
    rule: StopRule | None = None  # a control policy's marker gate / abort horizon
    sampled0: int = 0  # tokens of this call sampled before this request (a resume)
    marker_end: int = -1  # position (tokens of the call) where the marker ended; -1: not yet
    tail: list[int] = field(default_factory=list)  # last len(marker) tokens, while unseen
    draft: Draft | None = None  # to verify at admission (a fresh call only), cut to budget
    suffix: DraftSource | None = None  # what it re-drafts from as it decodes (DAS)

    def flush(self, version: int, source: Source = "sampled") -> None:
        """Move sampled tokens into the record (same result as one `Rollout.append` each)."""
        new_t, new_l = self.toks[self.flushed:], self.lps[self.flushed:]
        if not new_t:
            return
        r = self.rollout
        r.append(new_t[0], new_l[0], version, source)
        k = len(new_t) - 1
        if k:
            r.tokens.extend(new_t[1:])
            r.loss_mask.extend([True] * k)
            r.logprobs.extend(new_l[1:])
            r.versions.extend([version] * k)
            r.spans[-1].end += k
        self.flushed = len(self.toks)

    def stop_reason(self, t: int, decode) -> str | None:
        """Why the request ends after token ``t`` (already in ``toks``), or None: a stop
        token or string, the length budget, the stop rule."""
        if t in self.stop_ids or (self.stop_strings and self.hit_stop_string(decode)):
            return "stop"
        if len(self.toks) >= self.budget:
            return "length"
        if self.rule is not None:
            return self.rule_hit(t)
        return None

    def hit_stop_string(self, decode) -> bool:
        tail = (self.resp_prev[-self.window:] + self.toks[-self.window:])[-self.window:]
        text = decode(tail)
        return any(s in text for s in self.stop_strings)

    def rule_hit(self, t: int) -> str | None:
        """The stop rule after sampling ``t`` (already in ``toks``): "stop" at ``grace``
        tokens after the marker, "pruned" at the horizon with no marker when not kept, else
        None. A few list operations per token, and only for requests that carry a rule."""
        rule, n = self.rule, self.sampled0 + len(self.toks)
        if self.marker_end < 0:
            m = rule.marker
            self.tail.append(t)
            if len(self.tail) > len(m):
                del self.tail[0]
            if t == m[-1] and tuple(self.tail) == m:
                self.marker_end = n
        if self.marker_end >= 0:
            return "stop" if n >= self.marker_end + rule.grace else None
        if not rule.keep and 0 < rule.horizon <= n:
            return "pruned"
        return None

    def finish(self, reason: str, version: int, decode) -> Rollout:
        self.flush(version)
        r = self.rollout
        r.finish = reason
        r.completion = decode(r.response_tokens)
        r.timings["engine_finish"] = time.time()
        return r


def make_request(r: Rollout, *, vocab: int, max_seq_len: int, seed: int,
                 turn: tuple[int, int] | None = None) -> Request:
    """Validate a rollout for generation and wrap it; errors name the sample and the field.

    ``turn = (start, end)``: this call samples the tokens from index ``start`` of the record
    up to (at most) length ``end`` -- one turn of a multi-turn episode, whose earlier turns
    and environment tokens do not count against it. Default: the whole response,
    ``(prompt_len, prompt_len + max_new_tokens)``, counted across resumes."""
    if not isinstance(r, Rollout):
        raise TypeError(f"engine.add expects Rollout records, got {type(r).__name__}")
    where = _Where(r)
    if r.finish in FINISHED:
        raise ValueError(f"{where} is already finished ({r.finish!r}); only running or "
                         "aborted rollouts can be generated")
    r.check()
    if not r.tokens:
        raise ValueError(f"{where} has no tokens: it needs at least one prompt token")
    if min(r.tokens) < 0 or max(r.tokens) >= vocab:  # the common case checked at C speed
        bad = [t for t in r.tokens if not 0 <= t < vocab]
        raise ValueError(f"{where}: token ids {bad[:5]} outside the model vocabulary [0, {vocab})")
    s = r.sampling
    if s.temperature < 0:
        raise ValueError(f"{where}: sampling.temperature must be >= 0, got {s.temperature}")
    if not 0.0 < s.top_p <= 1.0:
        raise ValueError(f"{where}: sampling.top_p must be in (0, 1], got {s.top_p}")
    if s.top_k < 0:
        raise ValueError(f"{where}: sampling.top_k must be >= 0, got {s.top_k}")
    if s.max_new_tokens < 0:
        raise ValueError(f"{where}: sampling.max_new_tokens must be >= 0, got {s.max_new_tokens}")
    room = max_seq_len - len(r.tokens)
    if room <= 0:
        raise ValueError(f"{where}: {len(r.tokens)} tokens leave no room in the engine's "
                         f"max_seq_len={max_seq_len}")
    start, end = turn if turn is not None else (r.prompt_len, r.prompt_len + s.max_new_tokens)
    if not r.prompt_len <= start <= len(r.tokens):
        raise ValueError(f"{where}: turn start {start} outside [prompt_len, {len(r.tokens)}]")
    stops = tuple(x for x in s.stop_strings if x)
    window = 2 * max((len(x) for x in stops), default=0) + 8
    greedy = s.temperature == 0.0
    q = Request(rollout=r, budget=min(end - len(r.tokens), room), turn_start=start,
                stop_ids=frozenset(s.stop_token_ids), stop_strings=stops, seed=seed,
                greedy=greedy, filtered=not greedy and (s.top_k > 0 or s.top_p < 1.0),
                window=window, resp_prev=list(r.tokens[start:]) if stops else [],
                resume=len(r.tokens) > start)
    if s.stop_rule is not None:
        _restore_rule(q, s.stop_rule, r.tokens[start:])
    if s.draft is not None and s.draft.tokens and not q.resume and q.budget > 0:
        d = s.draft
        if min(d.tokens) < 0 or max(d.tokens) >= vocab:
            bad = [t for t in d.tokens if not 0 <= t < vocab]
            raise ValueError(f"{where}: draft token ids {bad[:5]} outside the model "
                             f"vocabulary [0, {vocab})")
        cut = min(len(d.tokens), q.budget)
        q.draft = d if cut == len(d.tokens) else replace(
            d, tokens=d.tokens[:cut], logprobs=d.logprobs[:cut])
    if s.redraft is not None:
        q.suffix = _suffix(s, where, vocab)
    return q


def _suffix(s, where: _Where, vocab: int) -> DraftSource:
    """The index a request re-drafts from; refused beside the rules whose decisions are taken
    per sampled token (a LATR branch, an ARRoL checkpoint)."""
    for name in ("branch_rule", "prune"):
        if getattr(s, name) is not None:
            raise ValueError(f"{where}: re-drafting (sampling.redraft) and sampling.{name} "
                             f"together are not supported")
    toks = [t for r in s.redraft.responses for t in r]
    if toks and (min(toks) < 0 or max(toks) >= vocab):
        raise ValueError(f"{where}: redraft token ids outside the model vocabulary [0, {vocab})")
    return index_of(s.redraft)


def _restore_rule(q: Request, rule: StopRule, before: list[int]) -> None:
    """Attach ``rule`` to ``q``, with the marker state of the tokens this call sampled
    before (a resumed request): where the marker first ended, else the tail to match."""
    m = rule.marker
    q.rule, q.sampled0 = rule, len(before)
    for i in range(len(before) - len(m) + 1):
        if tuple(before[i:i + len(m)]) == m:
            q.marker_end = i + len(m)
            return
    q.tail = list(before[-(len(m) - 1):]) if len(m) > 1 else []


class _Where:
    """Names a rollout in error messages; formatted only when an error is raised."""

    __slots__ = ("r",)

    def __init__(self, r: Rollout):
        self.r = r

    def __str__(self) -> str:
        return f"rollout {self.r.sample_id} (prompt {self.r.prompt_id})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

"""DAS's suffix drafting (after "Beat the long tail"): an index over a prompt's recent
responses that, given the tokens a response has so far, proposes what followed the same
tokens there. Pure Python, deterministic.

Owns the index (`SuffixIndex`), the proposal rule and the length-aware draft budget; it is
the draft source (`reroll.engine.plugins.redraft.DraftSource`) of a request that carries a
`reroll.sampling_params.SuffixSource`. Knows nothing of tensors, slots or stores: the
re-drafting plug-in asks it for a proposal at every decode step and verifies the proposal
exactly (`reroll.engine.speculative`), so a proposal only changes how many tokens one forward
yields, never which tokens come out. Which responses a source holds is the replay side's
choice (`reroll.replay.drafts`).

Proposal for a context ``c`` (the response so far): the longest suffix ``c[-m:]``, ``m`` from
``min(max_match, len(c))`` down to ``min_match``, that occurs in a response with at least one
token after it; of the continuations after all its occurrences, the majority path (at each
depth the next token most of the continuations still on the path share, the smallest id on
a tie, while at least ``min_count`` share it), at most ``budget`` tokens. A suffix whose
continuations agree on nothing (fewer than ``min_count``) gives way to the next shorter one.

Budget (DAS spends more speculation on the long sequences that set a step's length): a row
that has generated ``g`` response tokens, with ``mean`` the mean length of the source's
responses, gets ``min(max_draft, draft_len * (1 + g // mean))`` tokens: ``draft_len`` while
it is shorter than the typical response, twice that past it, three times past twice it, ...
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reroll.sampling_params import SuffixSource


def majority_path(responses: list[list[int]] | list[tuple[int, ...]], min_count: int,
                  limit: int | None = None) -> list[int]:
    """Walk the prefix trie of ``responses``: at each depth take the next token most of the
    responses still on the path share (the smallest id on a tie), while at least
    ``min_count`` share it; at most ``limit`` tokens (None: no limit)."""
    alive, path = list(responses), []
    while limit is None or len(path) < limit:
        counts: dict[int, int] = {}
        for x in alive:
            if len(x) > len(path):
                counts[x[len(path)]] = counts.get(x[len(path)], 0) + 1
        if not counts:
            return path
        tok, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n < min_count:
            return path
        path.append(tok)
        alive = [x for x in alive if len(x) >= len(path) and x[len(path) - 1] == tok]
    return path


class SuffixIndex:
    """Every substring of up to ``max_match`` tokens of the responses that has a token after
    it, mapped to where it ends (response, index of the next token)."""

    def __init__(self, responses: tuple[tuple[int, ...], ...], *, max_match: int = 8,
                 min_match: int = 1, min_count: int = 1, draft_len: int = 4,
                 max_draft: int = 16):
        if not 1 <= min_match <= max_match or min_count < 1 or not 1 <= draft_len <= max_draft:
            raise ValueError(f"SuffixIndex needs 1 <= min_match <= max_match, min_count >= 1 "
                             f"and 1 <= draft_len <= max_draft, got min_match={min_match}, "
                             f"max_match={max_match}, min_count={min_count}, "
                             f"draft_len={draft_len}, max_draft={max_draft}")
        self.responses = [tuple(r) for r in responses]
        self.max_match, self.min_match, self.min_count = max_match, min_match, min_count
        self.draft_len, self.max_draft = draft_len, max_draft
        lens = [len(r) for r in self.responses if r]
        self.mean_len = max(1, round(sum(lens) / len(lens))) if lens else 1
        self.ends: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i, r in enumerate(self.responses):
            for e in range(1, len(r)):  # r[e] follows the substrings ending at e
                for m in range(1, min(max_match, e) + 1):
                    self.ends.setdefault(r[e - m:e], []).append((i, e))

    def budget(self, generated: int) -> int:
        """Draft tokens for a row that has generated ``generated`` response tokens."""
        return min(self.max_draft, self.draft_len * (1 + generated // self.mean_len))

    def propose(self, context: list[int], budget: int) -> list[int]:
        """The continuation of the longest matching suffix of ``context`` (module docstring),
        at most ``budget`` tokens; [] when nothing matches."""
        if budget <= 0:
            return []
        for m in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            occ = self.ends.get(tuple(context[len(context) - m:]))
            if not occ:
                continue
            conts = [self.responses[i][e:e + budget] for i, e in occ]
            path = majority_path(conts, self.min_count, budget)
            if path:
                return path
        return []


@lru_cache(maxsize=64)
def index_of(source: SuffixSource) -> SuffixIndex:
    """The index of a source (the samples of one prompt share one source: built once). An
    index holds up to ``max_match`` keys per response token, so only the last 64 are kept
    here (a running request keeps its own)."""
    return SuffixIndex(source.responses, max_match=source.max_match,
                       min_match=source.min_match, min_count=source.min_count,
                       draft_len=source.draft_len, max_draft=source.max_draft)

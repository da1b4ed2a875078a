"""DAS (after "Beat the long tail"): speculative rollouts drafted from the prompt's own
history. The responses a prompt got in recent steps predict much of what the policy will
write again, so they serve as a draft model with no weights: a sample starts from a
deterministic draft, the most frequent path through a prefix trie of those responses (as
long as at least ``min_count`` of them agree), and, with ``redraft`` (the default), keeps
re-drafting at every decode step from the longest suffix of its response so far that occurs
in them (up to ``max_match`` tokens matched, ``draft_len`` tokens proposed, more on rows past
the mean response length, at most ``max_draft``): the long sequences that set a step's
length get the most speculation.

Where reroll differs: the history is the responses of the prompt's last ``history``
consumed groups, updated only at step boundaries (drafts repeat exactly and resume from
checkpoints); drafts carry ``q = 1`` and lenience 1, so the engine's acceptance is exact
(the policy's distribution, whatever the draft). The responses travel in the sample's
record (``sampling.redraft``); the suffix index and the budget rule are
`reroll.engine.suffix`, the verification is the engine's.

Owns the ``das`` drafter.
"""

from __future__ import annotations

from reroll.engine.suffix import majority_path
from reroll.replay.drafts import DRAFTERS, DraftStore
from reroll.rollout import Draft, Rollout, SuffixSource


@DRAFTERS.register("das", ranges={"history": "[1, inf)", "min_count": "[1, inf)",
                                  "max_match": "[1, inf)", "draft_len": "[1, inf)",
                                  "max_draft": "[1, inf)"})
class SuffixDrafter:
    """The majority path through the prompt's recent responses, exact acceptance, and those
    responses to re-draft from as the sample decodes (DAS)."""

    def __init__(self, *, history: int = 2, min_count: int = 2, redraft: bool = True,
                 max_match: int = 8, draft_len: int = 4, max_draft: int = 16):
        if not isinstance(redraft, bool):
            raise ValueError(f"das: redraft must be true or false, got {redraft!r}")
        self.min_count, self.redraft = min_count, redraft
        self.knobs = dict(max_match=max_match, min_count=min_count, draft_len=draft_len,
                          max_draft=max_draft)
        SuffixSource((), **self.knobs)  # the knobs' checks, when the config loads
        self.store = DraftStore(history=history)

    def draft(self, r: Rollout) -> Draft | None:
        tokens = majority_path([t for t, _, _ in self.store.recent(r.prompt_id)],
                               self.min_count)
        return Draft(tuple(tokens), source="das") if tokens else None

    def source(self, r: Rollout) -> SuffixSource | None:
        """What the sample re-drafts from while it decodes (None: redraft off, or no
        responses stored for its prompt yet)."""
        got = [tuple(t) for t, _, _ in self.store.recent(r.prompt_id)]
        return SuffixSource(tuple(got), **self.knobs) if self.redraft and got else None

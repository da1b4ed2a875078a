"""Drafters: where the draft a fresh sample starts from comes from (``replay.draft``,
registry `DRAFTERS`), and the small in-memory store of earlier responses they draft from.

The engine verifies whatever draft a sample carries (`reroll.rollout.Draft`,
`reroll.engine.speculative`); a drafter only proposes it:

* ``spec_rl`` (SPEC-RL): sample ``i`` of a prompt gets response ``i``
  (cyclically) of the prompt's group consumed last time, with its recorded behaviour
  log-probs as ``q``: a token is kept with probability ``min(1, lenience * p / q)``. The
  residual at the first rejection sees only ``q`` of the drafted token, so this keeps the
  policy's distribution only approximately (SPEC-RL itself re-samples from ``p``); lenience
  > 1 reuses more at a larger bias.
* ``das`` (after DAS, "Beat the long tail"): a deterministic draft, the most frequent path
  through a prefix trie of the prompt's recent responses (the responses of its last
  ``history`` consumed groups), as long as at least ``min_count`` of them agree; with
  ``q = 1`` and lenience 1 acceptance is exact (the policy's distribution, whatever the
  draft). With ``redraft`` (the default) the sample also carries those responses as a
  `SuffixSource`, and the engine re-drafts at every decode step from the longest suffix of
  the response so far that occurs in them (`reroll.engine.suffix`: up to ``max_match``
  tokens matched, ``draft_len`` tokens proposed, more on rows past the mean response
  length, at most ``max_draft``), verified exactly as well. The responses travel in the
  sample's record (``sampling.redraft``).

The store changes only at step boundaries, from the fresh (not replayed or reused), finished
samples of the groups a step consumed, so drafts repeat exactly and resume from checkpoints
(`state` / `load_state`, plain JSON). Knows nothing of engines, schedulers or the trainer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from reroll.engine.suffix import majority_path
from reroll.errors import ConfigError
from reroll.registry import Registry
from reroll.rollout import Draft, Group, Rollout, SuffixSource

if TYPE_CHECKING:
    from reroll.config import RunConfig

DRAFTERS = Registry("drafter")

Response = tuple[list[int], list[float], str]  # response tokens, behaviour log-probs, sample id


class DraftStore:
    """The responses of each prompt's last ``history`` consumed groups (oldest first), for at
    most ``max_prompts`` prompts (the least recently updated go first)."""

    def __init__(self, history: int = 1, max_prompts: int = 100_000):
        if history < 1 or max_prompts < 1:
            raise ValueError(f"DraftStore: history and max_prompts must be >= 1, got "
                             f"{history}, {max_prompts}")
        self.history, self.max_prompts = history, max_prompts
        self.groups: OrderedDict[str, list[list[Response]]] = OrderedDict()

    def add(self, groups: list[Group]) -> None:
        """Keep the fresh finished samples of a step's consumed groups, in order."""
        for g in groups:
            got = [_response(r) for r in g.rollouts
                   if not r.reused and r.finish in ("stop", "length") and r.response_len]
            if not got:
                continue
            kept = self.groups.pop(g.prompt_id, []) + [got]
            self.groups[g.prompt_id] = kept[-self.history:]
            while len(self.groups) > self.max_prompts:
                self.groups.popitem(last=False)

    def latest(self, prompt_id: str) -> list[Response]:
        return self.groups[prompt_id][-1] if prompt_id in self.groups else []

    def recent(self, prompt_id: str) -> list[Response]:
        return [x for grp in self.groups.get(prompt_id, []) for x in grp]

    def state(self) -> dict:
        return {"groups": [[p, [[list(x) for x in grp] for grp in gs]]
                           for p, gs in self.groups.items()]}

    def load_state(self, d: dict | None) -> None:
        self.groups = OrderedDict(
            (p, [[(list(t), list(lp), sid) for t, lp, sid in grp] for grp in gs])
            for p, gs in (d or {}).get("groups", []))


def _response(r: Rollout) -> Response:
    return list(r.response_tokens), list(r.logprobs[r.prompt_len:]), r.sample_id


@DRAFTERS.register("spec_rl", ranges={"lenience": "[1, inf)"})
class SpecRL:
    """Last time's response to the same prompt, with its recorded log-probs (SPEC-RL)."""

    def __init__(self, *, lenience: float = 1.0):
        self.lenience = lenience
        self.store = DraftStore(history=1)

    def draft(self, r: Rollout) -> Draft | None:
        prev = self.store.latest(r.prompt_id)
        if not prev:
            return None
        tokens, logprobs, sid = prev[r.index_in_group % len(prev)]
        return Draft(tuple(tokens), tuple(logprobs), self.lenience, source=sid)


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


class Drafting:
    """A drafter as the pipeline calls it: ``prepare`` gives fresh samples their drafts (at
    group start and growth), ``add`` updates the store at a step boundary."""

    def __init__(self, drafter: SpecRL | SuffixDrafter):
        self.drafter = drafter
        self.proposed = 0
        self.drafted = 0
        self.accepted = 0  # tokens of consumed fresh samples that came from an accepted draft
        self.sampled = 0  # ... and that the engine sampled

    def prepare(self, rollouts: list[Rollout]) -> None:
        source = getattr(self.drafter, "source", None)
        for r in rollouts:
            d = self.drafter.draft(r)
            if d is not None:
                r.sampling.draft = d
                self.drafted += 1
                self.proposed += len(d.tokens)
            if source is not None:
                r.sampling.redraft = source(r)

    def add(self, groups: list[Group]) -> None:
        for r in (r for g in groups for r in g.rollouts if not r.reused):
            for s in r.spans:
                if s.source == "draft":
                    self.accepted += s.end - s.start
                elif s.source == "sampled":
                    self.sampled += s.end - s.start
        self.drafter.store.add(groups)

    def state(self) -> dict:
        return {"store": self.drafter.store.state(),
                "counts": [self.drafted, self.proposed, self.accepted, self.sampled]}

    def load_state(self, d: dict | None) -> None:
        d = d or {}
        self.drafter.store.load_state(d.get("store"))
        self.drafted, self.proposed, self.accepted, self.sampled = d.get("counts", [0] * 4)

    def metrics(self) -> dict[str, float]:
        return {"draft/samples_drafted": float(self.drafted),
                "draft/tokens_proposed": float(self.proposed),
                "draft/tokens_accepted": float(self.accepted),
                "draft/tokens_sampled": float(self.sampled),
                "draft/prompts_stored": float(len(self.drafter.store.groups))}


def build_drafting(cfg: RunConfig, state: dict | None) -> Drafting | None:
    """The run's drafter (None for ``replay.draft = "none"``), restored from a checkpoint's
    ``state`` (the Replay stage's ``"drafts"``)."""
    if cfg.replay.draft == "none":
        return None
    out = Drafting(DRAFTERS.get(cfg.replay.draft)(**cfg.replay.draft_args))
    out.load_state(state)
    return out


def check_drafts(cfg: RunConfig) -> None:
    """``replay.draft`` and its arguments; drafts need an engine that verifies them (the
    in-process torch engine) and one response per sample (single_turn)."""
    rp = cfg.replay
    if not DRAFTERS.check_choice("replay.draft", rp.draft, rp.draft_args, off="none"):
        return
    try:
        DRAFTERS.get(rp.draft)(**rp.draft_args)
    except ValueError as e:
        raise ConfigError(f"replay.draft_args: {e}") from e
    if cfg.engine.name != "torch" or cfg.rollout.workflow != "single_turn":
        raise ConfigError(f"replay.draft = {rp.draft!r} needs engine.name = \"torch\" (the "
                          f"engine that verifies drafts) and rollout.workflow = "
                          f"\"single_turn\"; got {cfg.engine.name!r} and "
                          f"{cfg.rollout.workflow!r}")

"""Drafts: where the draft a fresh sample starts from comes from (``replay.draft``, registry
`DRAFTERS`), the small in-memory store of earlier responses the drafters draft from
(`DraftStore`), and `DraftPlanner`, the drafter as the Replay stage calls it.

The engine verifies whatever draft a sample carries (`reroll.rollout.Draft`); a drafter only
proposes it. The drafters are methods (`reroll.methods`): ``spec_rl`` (SPEC-RL: last time's
response to the prompt with its recorded log-probs, `reroll.methods.specrl`) and ``das`` (DAS:
the majority path through the prompt's recent responses, and those responses to re-draft from
while decoding, `reroll.methods.das`); docs/algorithms.md. A drafter is built as ``cls(*,
hyperparameters)`` and has a ``store`` (a `DraftStore`), ``draft(rollout) -> Draft | None``
and optionally ``source(rollout) -> SuffixSource | None``, which the sample carries to
re-draft from as it decodes.

The store changes only at step boundaries, from the fresh (not replayed or reused), finished
samples of the groups a step consumed, so drafts repeat exactly and resume from checkpoints
(`state` / `load_state`, plain JSON). Knows nothing of engines, schedulers, the trainer or
any method.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from reroll.errors import ConfigError
from reroll.registry import METHODS, Registry
from reroll.rollout import Draft, Group, Rollout

if TYPE_CHECKING:
    from reroll.config import EngineConfig, ReplayConfig, RolloutConfig

DRAFTERS = Registry("drafter", plugins=METHODS)

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


class Drafter(Protocol):
    store: DraftStore

    def draft(self, r: Rollout) -> Draft | None: ...


class DraftPlanner:
    """A drafter as the Replay stage calls it: ``prepare`` gives fresh samples their drafts
    (and, where the drafter has a ``source``, what to re-draft from) at group start and
    growth; ``add`` counts the consumed samples' accepted and sampled tokens and updates the
    store at a step boundary; ``state`` / ``metrics`` for checkpoints and logs."""

    def __init__(self, drafter: Drafter):
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


def build_draft_planner(replay: ReplayConfig, state: dict | None) -> DraftPlanner | None:
    """The run's drafter (None for ``replay.draft = "none"``), restored from a checkpoint's
    ``state`` (the Replay stage's ``"drafts"``)."""
    if replay.draft == "none":
        return None
    out = DraftPlanner(DRAFTERS.get(replay.draft)(**replay.draft_args))
    out.load_state(state)
    return out


def check_drafts(rp: ReplayConfig, engine: EngineConfig, rollout: RolloutConfig) -> None:
    """``replay.draft`` and its arguments; drafts need an engine that verifies them (the
    in-process torch engine) and one response per sample (single_turn)."""
    if not DRAFTERS.check_choice("replay.draft", rp.draft, rp.draft_args, off="none"):
        return
    try:
        DRAFTERS.get(rp.draft)(**rp.draft_args)
    except ValueError as e:
        raise ConfigError(f"replay.draft_args: {e}") from e
    if engine.name != "torch" or rollout.workflow != "single_turn":
        raise ConfigError(f"replay.draft = {rp.draft!r} needs engine.name = \"torch\" (the "
                          f"engine that verifies drafts) and rollout.workflow = "
                          f"\"single_turn\"; got {engine.name!r} and "
                          f"{rollout.workflow!r}")

"""What a rollout workflow is, and the context it runs in.

A workflow is one ``async`` function per group: ``await workflow(ctx, group)`` turns the
group's rollouts (fresh, or partly generated when resuming from a checkpoint) into finished,
scored records, awaiting the engine, environments and verifiers through ``ctx``. It returns
nothing: the records are filled in place, so a checkpoint taken mid-episode sees them. A
sample whose scoring or environment failed carries an error score (errors are data); an
exception escaping a workflow stops the run with its message.

Workflows are registered in `WORKFLOWS` (``rollout.workflow``). They know nothing of the
scheduler, staleness, the trainer or where the engine runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reroll.engine.base import Engine
from reroll.registry import Registry
from reroll.rollout import Example, Group, Rollout, Score

if TYPE_CHECKING:
    from reroll.workflows.tree_options import TreeOptions

WORKFLOWS = Registry("workflow")
Workflow = Callable[["EpisodeContext", Group], Awaitable[None]]


@dataclass
class EpisodeContext:
    """The awaitables and limits a workflow uses."""

    engine: Engine
    scorer: Any
    """``submit(rollout, example) -> concurrent Future[list[Score]]``, ``combine(scores)``."""
    decode: Callable[[list[int]], str]
    """Token ids -> text (special tokens skipped): what an environment reads."""
    encode_observation: Callable[[str], list[int]]
    """Environment text -> token ids appended as-is (rendered with the chat template when
    ``task.chat``); the stored ids are exactly what the model sees next."""
    shape_reward: Callable[[Rollout], float] | None = None
    make_env: Callable[[], Any] | None = None
    """A fresh `reroll.envs.Environment` per episode (multi_turn)."""
    max_turns: int = 1
    max_new_tokens: int = 32
    """Per turn (single_turn: the whole response)."""
    max_episode_tokens: int = 0
    """Policy-sampled tokens per episode over all turns (0: max_turns * max_new_tokens)."""
    tree: TreeOptions | None = None
    """The tree workflow's options (`reroll.workflows.tree.TreeOptions`; None: its defaults)."""
    grow: Callable[[Group], int] | None = None
    """Adaptive allocation: after a round of a group is scored, adds the samples the
    allocator asks for and returns how many (0: the group is complete). None: groups keep
    their size."""

    async def score(self, r: Rollout, example: Example) -> None:
        """Run the verifiers on ``r``; sets its scores and reward (None when one failed)."""
        r.timings["score_submit"] = _now()
        if getattr(self.scorer, "inline", False):  # cheap verifiers: no Future, no hand-off
            scores = self.scorer.score(r, example)
        else:
            scores = await asyncio.wrap_future(self.scorer.submit(r, example))
        r.timings["score_done"] = _now()
        self.set_scores(r, scores)

    def set_scores(self, r: Rollout, scores: list[Score]) -> None:
        r.scores = scores
        if r.failed:
            r.reward = None
            return
        r.reward = self.scorer.combine(scores)
        if self.shape_reward is not None:
            r.reward += self.shape_reward(r)


async def in_rounds(ctx: EpisodeContext, group: Group,
                    one: Callable[[Rollout], Awaitable[None]]) -> None:
    """Run ``one`` on every member of ``group`` (members already done return at once), then
    let the allocator grow the group and run the new members, until it adds none. A group
    restored mid-round continues the round it was in."""
    while True:
        await asyncio.gather(*(one(r) for r in group.rollouts))
        if ctx.grow is None or not ctx.grow(group):
            return


class EnvReward:
    """The scorer of workflows whose environment gives the reward: the reward is the sum of
    the "env" score values (None if one is an error). Nothing is submitted to it."""

    def combine(self, scores: list[Score]) -> float | None:
        if any(not s.ok for s in scores):
            return None
        return sum(float(s.value) for s in scores)

    def submit(self, rollout: Rollout, example: Example):
        raise RuntimeError("this workflow is scored by its environment, not by verifiers")

    def close(self) -> None:
        pass


def _now() -> float:
    import time

    return time.time()

"""The single-turn group (GRPO and family): n samples of one prompt, each scored by the
verifiers as soon as it finishes. The default workflow."""

from __future__ import annotations

from reroll.rollout import Group, Rollout
from reroll.workflows.base import WORKFLOWS, EpisodeContext, in_rounds


@WORKFLOWS.register("single_turn")
async def single_turn(ctx: EpisodeContext, group: Group) -> None:
    """Generate every unfinished sample (a partly generated one, restored from a checkpoint,
    continues from its prefix: a resume), then score every unscored one; in rounds when the
    allocator grows groups."""

    async def one(r: Rollout) -> None:
        if not r.finished:
            await ctx.engine.generate(r)
        if r.reward is None and not r.failed:
            await ctx.score(r, group.example)

    await in_rounds(ctx, group, one)

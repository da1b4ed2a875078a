"""Multi-turn and tool-using episodes: policy turns interleaved with an environment.

Per sample: ``env.reset(example)``; then, up to ``max_turns`` times, the policy samples one
turn (ending at EOS, at one of ``env.stop_strings``, or at the per-turn limit), the
environment answers ``env.step(turn_text)``, and its observation is appended to the record as
environment tokens (``loss_mask`` False, version -1, span source "env"), never re-tokenised:
the stored ids are exactly what the model conditions on next. The episode ends when the
environment says ``done``, when the policy ends a turn with EOS (the environment still
answers that turn, and its reward counts), or when the turn or policy-token budget
(``max_episode_tokens``, environment tokens not counted) runs out.

The episode's reward is the sum of step rewards, recorded as one score named "env" whose
``info`` keeps every step's diagnostics; an environment that raises gives an error score.
A weight update in the middle of an episode interrupts only the turn being sampled; it
resumes from its prefix under the new weights. An episode restored from a checkpoint
mid-way restarts from its prompt (an environment's state is not checkpointed), counted as
a resume in ``resume_count``.
"""

from __future__ import annotations

from reroll.rollout import Example, Group, Rollout, Score
from reroll.workflows.base import WORKFLOWS, EpisodeContext, in_rounds


@WORKFLOWS.register("multi_turn")
async def multi_turn(ctx: EpisodeContext, group: Group) -> None:
    async def one(r: Rollout) -> None:
        if not (r.finished and (r.reward is not None or r.failed)):
            await episode(ctx, group.example, r)

    await in_rounds(ctx, group, one)


multi_turn.uses_verifiers = False  # the environment rewards (ctx.scorer is an EnvReward)


def _restart(r: Rollout) -> None:
    """Back to the prompt (an episode cut by a checkpoint restarts: env state is not saved)."""
    if len(r.tokens) > r.prompt_len:
        n = r.prompt_len
        del r.tokens[n:], r.loss_mask[n:], r.logprobs[n:], r.versions[n:]
        r.spans = [s for s in r.spans if s.end <= n]
        r.resume_count += 1
    r.finish, r.scores, r.reward = "running", [], None


def _append_env(r: Rollout, ids: list[int]) -> None:
    for t in ids:
        r.append(t, 0.0, -1, source="env")


async def episode(ctx: EpisodeContext, example: Example, r: Rollout) -> None:
    _restart(r)
    steps: list[dict] = []
    total = 0.0
    try:
        env = ctx.make_env()
        obs = env.reset(example)
    except Exception as e:  # noqa: BLE001 - an environment's failure is this sample's error
        r.finish = "error"
        ctx.set_scores(r, [Score("env", error=f"reset: {type(e).__name__}: {e}")])
        return
    if obs:
        _append_env(r, ctx.encode_observation(obs))
    r.sampling.stop_strings = list(env.stop_strings)
    stop_ids = set(r.sampling.stop_token_ids)
    budget = ctx.max_episode_tokens or ctx.max_turns * ctx.max_new_tokens
    used, finish = 0, "length"
    for _ in range(ctx.max_turns):
        if used >= budget:
            break
        start = len(r.tokens)
        r.finish = "running"
        await ctx.engine.generate(r, turn=(start, start + min(ctx.max_new_tokens, budget - used)))
        finish = r.finish
        turn = r.tokens[start:]
        used += len(turn)
        eos = finish == "stop" and bool(turn) and turn[-1] in stop_ids
        try:
            res = env.step(ctx.decode(turn))
        except Exception as e:  # noqa: BLE001
            r.finish = "error"
            ctx.set_scores(r, [Score("env", error=f"step {len(steps)}: {type(e).__name__}: {e}",
                                     info={"steps": steps})])
            return
        total += float(res.reward)
        steps.append({"reward": float(res.reward), "done": bool(res.done), **res.info})
        if res.done or eos:
            break  # the episode's finish is its last turn's (stop, or length if cut)
        finish = "length"  # if no turn follows: out of turns or budget
        if res.observation:
            _append_env(r, ctx.encode_observation(res.observation))
    r.finish = finish
    r.completion = ctx.decode(r.response_tokens)
    ctx.set_scores(r, [Score("env", value=total, info={"turns": len(steps), "steps": steps})])

"""One tree group through the tree workflow on a tiny model's engine (no stop token, so every
member is ``max_new_tokens`` long; member i sampled with seed 10 + i)."""

import asyncio

from reroll import build
from reroll.engine import EngineService, TorchEngine
from reroll.rollout import Example, SamplingParams, grow_group, new_group
from reroll.workflows import WORKFLOWS, EpisodeContext


def run_tree_group(model, tok, scorer, n, max_new_tokens, rounds=(), **tree):
    """(group, engine stats) of a group of ``n`` grown by the tree workflow with the
    ``EpisodeContext`` fields ``tree``; ``rounds``: members added after each round."""
    sp = SamplingParams(max_new_tokens=max_new_tokens)
    prompt = build.encode_prompt(tok)("3+4=")

    async def main():
        core = TorchEngine(model, tok, max_batch=16)
        engine = EngineService(core)
        more = iter(rounds)

        def grow(g):
            k = next(more, 0)
            for r in grow_group(g, k, prompt, sp, 0, group_round=1 + g.rollouts[-1].group_round):
                r.sampling.seed = 10 + r.index_in_group
            return k

        ctx = EpisodeContext(engine=engine, scorer=scorer, decode=build.decoder(tok),
                             encode_observation=build.encode_observation(tok),
                             max_new_tokens=max_new_tokens, grow=grow if rounds else None,
                             **tree)
        g = new_group(Example("p0", "3+4=", "7"), n, prompt, sp, 0)
        for r in g.rollouts:
            r.sampling.seed = 10 + r.index_in_group
        await WORKFLOWS.get("tree")(ctx, g)
        await engine.close()
        return g, core.stats()

    return asyncio.run(main())

"""Shared helpers of the tree workflow tests (imported by name: tests/workflows is on
sys.path): a constant scorer, a seeded group of one prompt, a run of the workflow, and a
group grown by it in rounds (no stop token, so every member is ``max_new_tokens`` long;
member i sampled with seed 10 + i)."""

import asyncio

from reroll import build_rollout
from reroll.engine import EngineService, TorchEngine
from reroll.rollout import Example, Group, SamplingParams, Score, grow_group, new_group
from reroll.workflows import WORKFLOWS, EpisodeContext
from reroll.workflows.tree_options import TreeOptions

PROMPT = "3+4="


def tree_options(kw: dict) -> dict:
    """``kw`` with its ``tree_*`` keywords (the ``rollout.tree_*`` names) gathered into the
    context's ``tree`` options."""
    tree = {k.removeprefix("tree_"): kw.pop(k) for k in list(kw) if k.startswith("tree_")}
    if "branch_at" in tree:
        tree["branch_at"] = tuple(tree["branch_at"])
    return {**kw, "tree": TreeOptions(**tree)}


class Constant:
    """An inline scorer that gives every sample reward 1."""

    inline = True

    def combine(self, scores):
        return 1.0

    def submit(self, rollout, example):
        raise AssertionError("inline scorer")

    def score(self, rollout, example):
        return [Score("one", 1.0)]


def tree_group(tok, n: int = 8) -> Group:
    """``n`` members of PROMPT, 6 tokens each (no stop token), seeds 10, 11, ..."""
    sp = SamplingParams(max_new_tokens=6)
    g = new_group(Example("p0", PROMPT, "7"), n, build_rollout.encode_prompt(tok)(PROMPT), sp, 0)
    for r in g.rollouts:
        r.sampling.seed = 10 + r.index_in_group
    return g


def run_tree(model, tok, g: Group, **ctx_kw) -> dict[str, float]:
    """Run the tree workflow on ``g`` (EpisodeContext keywords ``ctx_kw``) through an
    EngineService over a fresh TorchEngine; returns the engine's counters."""

    async def main():
        core = TorchEngine(model, tok, max_batch=16)
        engine = EngineService(core)
        ctx = EpisodeContext(engine=engine, scorer=Constant(), decode=build_rollout.decoder(tok),
                             encode_observation=build_rollout.encode_observation(tok),
                             max_new_tokens=6, **tree_options(ctx_kw))
        await WORKFLOWS.get("tree")(ctx, g)
        await engine.close()
        return core.stats()

    return asyncio.run(main())


def run_tree_group(model, tok, scorer, n, max_new_tokens, rounds=(), **tree):
    """(group, engine stats) of a group of ``n`` grown by the tree workflow with the
    ``EpisodeContext`` fields ``tree``; ``rounds``: members added after each round."""
    sp = SamplingParams(max_new_tokens=max_new_tokens)
    prompt = build_rollout.encode_prompt(tok)("3+4=")

    async def main():
        core = TorchEngine(model, tok, max_batch=16)
        engine = EngineService(core)
        more = iter(rounds)

        def grow(g):
            k = next(more, 0)
            for r in grow_group(g, k, prompt, sp, 0, group_round=1 + g.rollouts[-1].group_round):
                r.sampling.seed = 10 + r.index_in_group
            return k

        ctx = EpisodeContext(engine=engine, scorer=scorer, decode=build_rollout.decoder(tok),
                             encode_observation=build_rollout.encode_observation(tok),
                             max_new_tokens=max_new_tokens, grow=grow if rounds else None,
                             **tree_options(tree))
        g = new_group(Example("p0", "3+4=", "7"), n, prompt, sp, 0)
        for r in g.rollouts:
            r.sampling.seed = 10 + r.index_in_group
        await WORKFLOWS.get("tree")(ctx, g)
        await engine.close()
        return g, core.stats()

    return asyncio.run(main())

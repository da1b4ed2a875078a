"""Held-out evaluation: greedy accuracy and unbiased pass@k on a task's test split.

Generation goes through the same path as training: an engine core from the `ENGINES`
registry (on a copy of the weights, so the caller's model is untouched) behind the async
`EngineService`, driven by the configured rollout workflow (so a multi-turn task is evaluated
as episodes against its environment), and scoring through the same scorer. An example whose
scoring failed counts as an error, reported separately, never as a wrong answer. When
examples carry a level in ``fields["difficulty"]`` (a string, as ``arith_mixed`` sets it),
greedy accuracy and sampled pass@1 are also reported per level (``eval/greedy_accuracy_easy``,
``eval/pass@1_sampled_easy``, ...), over the examples of that level.

`HeldOutEval` is how every command assembles it (`reroll eval`, the in-loop evaluation of
`reroll train` and of `reroll replay`): the test split's first ``eval.n_examples`` examples,
the run's prompt encoding and scorer, and the device its engine generates on. The config
enters here only through it and `plan` (an `EvalPlan`: the lengths, samples and workflow,
and how to build the engine and the episode context); `evaluate` takes the plan. This
module knows no runtime and no loop: callers hand it a model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass
from math import comb
from typing import TYPE_CHECKING, Any

from reroll.rollout import Example, Group, Rollout, SamplingParams, new_group
from reroll.trainer.metrics import env_metrics

if TYPE_CHECKING:
    from reroll.config import RunConfig


@dataclass(frozen=True)
class EvalPlan:
    """How an evaluation generates: responses of up to ``max_new_tokens``, greedy and, with
    ``k`` > 1, ``k`` samples at ``temperature``, each group driven by the rollout workflow
    named ``workflow``; ``engine(model, device)`` builds an engine core on a copy of
    ``model`` and ``context(engine, scorer)`` the episode context the workflow runs in."""

    max_new_tokens: int
    k: int
    temperature: float
    workflow: str
    engine: Callable[[Any, str | None], Any]
    context: Callable[[Any, Any], Any]
    threads: int = 0  # the decode thread's torch threads (0: the caller's)


def plan(cfg: RunConfig, tok) -> EvalPlan:
    """The run's evaluation plan: ``rollout.max_new_tokens``, ``eval.k``,
    ``eval.temperature``, ``rollout.workflow``, and the run's own engine (``eval.max_batch``
    rows) and episode context."""
    from reroll import build, build_rollout

    return EvalPlan(
        max_new_tokens=cfg.rollout.max_new_tokens, k=cfg.eval.k,
        temperature=cfg.eval.temperature, workflow=cfg.rollout.workflow,
        engine=lambda model, device: build.build_engine(
            model, tok, cfg, max_batch=cfg.eval.max_batch, device=device),
        context=lambda engine, scorer: build_rollout.episode_context(cfg, tok, engine,
                                                                     scorer),
        threads=build.engine_threads(cfg))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _correct(r: Rollout) -> bool | None:
    if not r.scores or not r.scores[0].ok:
        return None
    return r.scores[0].value >= 1.0 - 1e-9


async def _run(model, plan: EvalPlan, examples: list[Example], scorer, encode,
               params: SamplingParams, n: int, device: str | None) -> list[Group]:
    from reroll.engine import EngineService
    from reroll.workflows import WORKFLOWS

    engine = EngineService(plan.engine(model, device), threads=plan.threads)
    ctx = plan.context(engine, scorer)
    groups = []
    for i, ex in enumerate(examples):
        g = new_group(ex, n, encode(ex.prompt), params, 0)
        g.group_id = f"eval{i}"
        for r in g.rollouts:
            r.sampling.seed = (i * 7919 + r.index_in_group) if n > 1 else 0
        groups.append(g)
    try:
        workflow = WORKFLOWS.get(plan.workflow)
        await asyncio.gather(*(workflow(ctx, g) for g in groups))
    finally:
        await engine.close()
    return groups


def evaluate(model, tok, examples: list[Example], scorer, encode, plan: EvalPlan,
             k: int | None = None, device: str | None = None) -> dict[str, float]:
    """Held-out metrics of ``model``: greedy accuracy, and with ``k`` > 1 sampled pass@1 and
    pass@k (None: ``plan.k``). Generation runs on a copy of ``model`` on ``device`` (None:
    ``model``'s own)."""
    k = plan.k if k is None else k
    base = SamplingParams(temperature=0.0, max_new_tokens=plan.max_new_tokens,
                          stop_token_ids=[tok.eos_token_id])
    metrics: dict[str, float] = {}
    runs = [("greedy", base, 1)]
    if k > 1:
        runs.append(("sampled", SamplingParams(**{**asdict(base),
                                                  "temperature": plan.temperature}), k))
    for label, params, n in runs:
        groups = asyncio.run(_run(model, plan, examples, scorer, encode, params, n, device))
        verdicts, errors = [], 0
        by_level: dict[str, list[int]] = {}
        for ex, g in zip(examples, groups, strict=True):
            v = [x for x in (_correct(r) for r in g.rollouts) if x is not None]  # not 0s
            errors += n - len(v)
            if len(v) == n:  # an example with a failed score is left out, and counted
                verdicts.append(sum(v))
                level = ex.fields.get("difficulty")
                if isinstance(level, str):
                    by_level.setdefault(level, []).append(sum(v))
        d = max(1, len(verdicts))
        if label == "greedy":
            metrics["eval/greedy_accuracy"] = sum(verdicts) / d
            for level, cs in by_level.items():
                metrics[f"eval/greedy_accuracy_{level}"] = sum(cs) / len(cs)
        else:
            metrics[f"eval/pass@{n}"] = sum(pass_at_k(n, c, n) for c in verdicts) / d
            metrics["eval/pass@1_sampled"] = sum(pass_at_k(n, c, 1) for c in verdicts) / d
            for level, cs in by_level.items():
                metrics[f"eval/pass@1_sampled_{level}"] = (
                    sum(pass_at_k(n, c, 1) for c in cs) / len(cs))
        metrics[f"eval/{label}_score_errors"] = float(errors)
        if label == "greedy":
            metrics.update(env_metrics([r for g in groups for r in g.rollouts], "eval/env/"))
    metrics["eval/n_examples"] = float(len(examples))
    return metrics


class HeldOutEval:
    """Held-out evaluation of a run's task: ``__call__(model)`` returns `evaluate`'s metrics
    on the first ``eval.n_examples`` test examples. ``scorer`` is the run's own (its owner
    closes it); without one, a scorer is built from ``cfg`` and ``task`` and `close` closes
    it. ``k``: samples per example (None: ``eval.k``); ``device``: where the evaluation's
    engine generates (None: the model's own device). It takes the whole config: it is what
    each command calls to assemble the evaluation (task split, scorer, encoding, `plan`)."""

    def __init__(self, cfg: RunConfig, tok, task, scorer=None, device: str | None = None,
                 k: int | None = None):
        from reroll import build_rollout

        self.plan, self.tok, self.device, self.k = plan(cfg, tok), tok, device, k
        self.owns_scorer = scorer is None
        self.scorer = build_rollout.build_scorer(cfg, task) if scorer is None else scorer
        self.encode = build_rollout.encode_prompt(tok, cfg.task.chat)
        self.examples = task.test[: cfg.eval.n_examples]

    def __call__(self, model) -> dict[str, float]:
        return evaluate(model, self.tok, self.examples, self.scorer, self.encode, self.plan,
                        k=self.k, device=self.device)

    def close(self) -> None:
        if self.owns_scorer:
            self.scorer.close()

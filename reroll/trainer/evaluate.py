"""Held-out evaluation: greedy accuracy and unbiased pass@k on a task's test split.

Generation goes through the same engine as training (on a copy of the weights, so the
caller's model is untouched) and scoring through the same scorer; an example whose scoring
failed counts as an error, reported separately, never as a wrong answer.
"""

from __future__ import annotations

import copy
from math import comb

from reroll.config import RunConfig
from reroll.rollout import Example, Rollout, SamplingParams


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


def _generate(model, tok, examples: list[Example], encode, params: SamplingParams, n: int,
              max_batch: int) -> list[list[Rollout]]:
    from reroll.engine import TorchEngine

    engine = TorchEngine(copy.deepcopy(model).eval(), tok, max_batch=max_batch)
    out = []
    for i, ex in enumerate(examples):
        ids = encode(ex.prompt)
        rs = []
        for j in range(n):
            sp = SamplingParams(**{**params.__dict__, "seed": (i * 7919 + j) if n > 1 else None})
            rs.append(Rollout(prompt_id=ex.prompt_id, group_id=f"eval{i}", tokens=list(ids),
                              prompt_len=len(ids), index_in_group=j, sampling=sp))
        out.append(rs)
    engine.generate([r for rs in out for r in rs])
    return out


def evaluate(model, tok, examples: list[Example], scorer, encode, cfg: RunConfig,
             k: int | None = None) -> dict[str, float]:
    k = cfg.eval.k if k is None else k
    base = SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens,
                          stop_token_ids=[tok.eos_token_id])
    metrics: dict[str, float] = {}
    runs = [("greedy", base, 1)]
    if k > 1:
        runs.append(("sampled", SamplingParams(**{**base.__dict__,
                                                  "temperature": cfg.eval.temperature}), k))
    for label, params, n in runs:
        groups = _generate(model, tok, examples, encode, params, n, max_batch=64)
        futs = [[scorer.submit(r, ex) for r in rs] for rs, ex in zip(groups, examples)]
        verdicts, errors = [], 0
        for rs, fs in zip(groups, futs):
            for r, f in zip(rs, fs):
                r.scores = f.result()
            v = [x for x in (_correct(r) for r in rs) if x is not None]  # errors are not 0s
            errors += len(rs) - len(v)
            if len(v) == n:  # an example with a failed score is left out, and counted
                verdicts.append(sum(v))
        d = max(1, len(verdicts))
        if label == "greedy":
            metrics["eval/greedy_accuracy"] = sum(verdicts) / d
        else:
            metrics[f"eval/pass@{n}"] = sum(pass_at_k(n, c, n) for c in verdicts) / d
            metrics["eval/pass@1_sampled"] = sum(pass_at_k(n, c, 1) for c in verdicts) / d
        metrics[f"eval/{label}_score_errors"] = float(errors)
    metrics["eval/n_examples"] = float(len(examples))
    return metrics

"""What benchmarks/vs_trl.py's baselines (TRL's GRPOTrainer, the hand-written loop) share
with reroll: the evaluator (greedy held-out accuracy through reroll's engine), the reward (the
task's own verifier on the whole example) and TRL's prompt texts (reroll's prompt ids).

Owns turning a reroll config's task into those inputs; must not know TRL's or the hand
loop's training (benchmarks/vs_trl.py).
"""

from __future__ import annotations

import time
from pathlib import Path


class Evaluator:
    """Greedy held-out accuracy of a model through reroll's engine; keeps its own time."""

    def __init__(self, cfg, tok, task):
        from reroll import build_rollout

        self.cfg, self.tok = cfg, tok
        self.test = task.test[: cfg.eval.n_examples]
        self.scorer = build_rollout.build_scorer(cfg, task)
        self.encode = build_rollout.encode_prompt(tok)
        self.spent = 0.0

    def __call__(self, model) -> float:
        from reroll.trainer.evaluate import evaluate, plan

        t0 = time.perf_counter()
        was = model.training
        acc = evaluate(model.eval(), self.tok, self.test, self.scorer, self.encode,
                       plan(self.cfg, self.tok),
                       k=1)["eval/greedy_accuracy"]
        model.train(was)
        self.spent += time.perf_counter() - t0
        return acc


class RewardError(RuntimeError):
    """A verifier failed on a baseline's sample (reroll drops such a group; a baseline stops)."""


def reward_fn(tok, task, config: Path):
    """Correctness with the task's own verifier (the same numbers for every contestant): the
    whole Example (answer and ``fields``, e.g. countdown_search's numbers and target), looked
    up by prompt text. A verifier error raises RewardError naming the prompt and the error
    (never a silent 0)."""
    from reroll import build_rollout
    from reroll.config_checks import load_checked

    examples = {ex.prompt: ex for ex in task.train}
    pool = build_rollout.build_scorer(load_checked(str(config), []), task)

    def score(prompt: str, completion: str) -> float:
        from reroll.rollout import Rollout

        if prompt not in examples:
            raise RewardError(f"reward_fn: prompt {prompt!r} is not one of the task's "
                              f"{len(examples)} training prompts")
        r = Rollout("p", "g", [0], 1, completion=completion)
        scores = pool.submit(r, examples[prompt]).result()
        value = pool.combine(scores)
        if value is None:
            raise RewardError(f"reward_fn: verifier failed on prompt {prompt!r}: "
                              + "; ".join(s.error for s in scores if not s.ok))
        return float(value)

    return score


def trl_prompts(tok, task) -> list[str]:
    """The training prompts as text that TRL's GRPOTrainer tokenizes (``tok(text=...)``, the
    tokenizer's own special tokens on) into exactly reroll's prompt ids
    (``build_rollout.encode_prompt``: the tokenizer's BOS, then the prompt). Checked here for
    every prompt: a mismatch is a ValueError naming the prompt and both id lists."""
    from reroll import build_rollout

    encode = build_rollout.encode_prompt(tok)
    adds_bos = tok("x").input_ids[:1] == [tok.bos_token_id]  # a tokenizer that adds it itself
    bos = "" if adds_bos else (tok.bos_token or "")
    texts = [bos + ex.prompt for ex in task.train]
    for ex, ids in zip(task.train, tok(text=texts).input_ids):
        if list(ids) != encode(ex.prompt):
            raise ValueError(f"TRL would see prompt {ex.prompt!r} as {list(ids)}, reroll as "
                             f"{encode(ex.prompt)}")
    return texts

"""The ``guess`` task: games of guess-the-number (played with the ``guess`` environment).

An example is one game: a secret drawn uniformly from [1, n]. The prompt says the range
only (``guess 1-16:``), so what is learned is a strategy, not the secrets: train and test
draw their secrets from separately seeded streams (the same secret can occur in both, as a
new game). Must not know the environment's feedback format.
"""

from __future__ import annotations

import random

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, require


@TASKS.register("guess", ranges={"n": "[2, inf)", "n_train": "[1, inf)", "n_test": "[0, inf)"})
def guess(seed: int, *, n: int = 16, n_train: int = 2000, n_test: int = 200) -> Task:
    """Seeded games with secrets in [1, n]."""
    require(n >= 2, "guess", f"n must be >= 2, got {n}")
    require(n_train >= 1 and n_test >= 0, "guess", "n_train must be >= 1 and n_test >= 0")

    def games(split: str, k: int, rng: random.Random) -> list[Example]:
        out = []
        for i in range(k):
            s = rng.randint(1, n)
            out.append(Example(prompt_id=f"guess:{split}:{i}", prompt=f"guess 1-{n}:",
                               answer=str(s), fields={"secret": s, "n": n}))
        return out

    return Task(name="guess", train=games("train", n_train, random.Random(seed * 2 + 1)),
                test=games("test", n_test, random.Random(seed * 2 + 2)),
                verifier={"name": "exact", "args": {}})

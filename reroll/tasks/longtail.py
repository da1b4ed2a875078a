"""The ``longtail`` task: repeat a letter a given number of times, ``x*5=`` -> ``xxxxx``.

A verifiable workload whose correct responses have a long-tailed length distribution, like
reasoning traces: most answers are a few tokens, a few reach the response limit. The count is
``min(max_count, floor(min_count * u ** (-1 / alpha)))`` with ``u`` uniform in (0, 1] (a
Pareto law with scale ``min_count`` and shape ``alpha``, capped), so
``P(count >= c) = (min_count / c) ** alpha`` for ``min_count <= c <= max_count`` and the cap
holds the remaining mass.

Owns problem generation. Train and test are disjoint by prompt: for each count, the letters
are shuffled with the seed and the first ``test_letters`` of them are test-only. Each split
is an i.i.d. sample of the length law (a prompt may repeat inside a split, so the empirical
length distribution is the law itself); every example has its own ``prompt_id``. Must not
know tokenizers or verifiers (the default reward is ``exact``, case-sensitive: ``a`` and
``A`` are different letters here).
"""

from __future__ import annotations

import math
import random
import string

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, require

LETTERS = string.ascii_letters  # 52 single-character tokens of the tiny tokenizer


def pareto_count(u: float, *, min_count: int, max_count: int, alpha: float) -> int:
    """The count for a uniform ``u`` in (0, 1]: ``floor(min_count * u ** (-1/alpha))``, capped."""
    if not 0.0 < u <= 1.0:
        raise ValueError(f"pareto_count: u must be in (0, 1], got {u}")
    return min(max_count, math.floor(min_count * u ** (-1.0 / alpha)))


def make_example(letter: str, count: int, prompt_id: str) -> Example:
    """One problem: prompt ``{letter}*{count}=``; answer and demo are the letter ``count``
    times."""
    answer = letter * count
    return Example(prompt_id=prompt_id, prompt=f"{letter}*{count}=", answer=answer, demo=answer)


def held_out_letters(seed: int, max_count: int, test_letters: int) -> dict[int, set[str]]:
    """For each count, the letters whose prompts belong to the test split only."""
    out = {}
    for c in range(1, max_count + 1):
        letters = list(LETTERS)
        random.Random(f"{seed}:{c}").shuffle(letters)
        out[c] = set(letters[:test_letters])
    return out


def _sample(rng: random.Random, n: int, split: str, held: dict[int, set[str]], *,
            min_count: int, max_count: int, alpha: float) -> list[Example]:
    out = []
    for i in range(n):
        c = pareto_count(1.0 - rng.random(), min_count=min_count, max_count=max_count,
                         alpha=alpha)
        pool = sorted(held[c]) if split == "test" else sorted(set(LETTERS) - held[c])
        out.append(make_example(rng.choice(pool), c, f"longtail:{split}{i}"))
    return out


@TASKS.register("longtail", ranges={"n_train": "[1, inf)", "n_test": "[0, inf)",
                                    "min_count": "[1, inf)", "max_count": "[1, inf)",
                                    "alpha": "(0, inf)", "test_letters": "[1, 51]"})
def longtail(seed: int, *, n_train: int = 4000, n_test: int = 200, min_count: int = 2,
             max_count: int = 31, alpha: float = 1.0, test_letters: int = 10) -> Task:
    """Seeded letter repetition with Pareto(``min_count``, ``alpha``) counts capped at
    ``max_count`` (keep ``max_count`` below ``rollout.max_new_tokens``: EOS is one more
    token). With the defaults, P(count >= 8) = 2/8 = 25% and 2/31 = 6.5% of answers sit at
    the cap. ``test_letters`` of the 52 letters are held out per count."""
    require(min_count >= 1, "longtail", f"min_count must be >= 1, got {min_count}")
    require(max_count >= min_count, "longtail",
            f"max_count must be >= min_count={min_count}, got {max_count}")
    require(alpha > 0, "longtail", f"alpha must be > 0, got {alpha}")
    require(1 <= test_letters < len(LETTERS), "longtail",
            f"test_letters must be in [1, {len(LETTERS) - 1}], got {test_letters}")
    require(n_train >= 1, "longtail", f"n_train must be >= 1, got {n_train}")
    require(n_test >= 0, "longtail", f"n_test must be >= 0, got {n_test}")
    held = held_out_letters(seed, max_count, test_letters)
    law = dict(min_count=min_count, max_count=max_count, alpha=alpha)
    train = _sample(random.Random(f"{seed}:train"), n_train, "train", held, **law)
    test = _sample(random.Random(f"{seed}:test"), n_test, "test", held, **law)
    return Task(name="longtail", train=train, test=test, verifier={"name": "exact",
                                                       "args": {"case_sensitive": True}})

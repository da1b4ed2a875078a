"""Scoring (the Filter stage): verifiers, reward composition, the sandbox and the pool.

``VERIFIERS`` maps a name to a factory with keyword-only hyperparameters that returns a
``Verifier``. Registered: math, numeric, exact, format, countdown, countdown_search, code,
python.
``build_reward(specs, default)`` combines weighted verifiers; ``ScoringPool`` runs them off
the main thread with timeouts. Nothing here imports torch.
"""

from reroll.verifiers import answers, code, rules, search_trace, user  # noqa: F401  (they register)
from reroll.verifiers.base import VERIFIERS, Verifier, failed, judged
from reroll.verifiers.combine import Component, Reward, build_reward
from reroll.verifiers.pool import ScoringPool

__all__ = ["VERIFIERS", "Component", "Reward", "ScoringPool", "Verifier", "build_reward",
           "failed", "judged"]

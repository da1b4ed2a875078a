"""Pure algorithm math: advantages, surrogates, aggregation, KL, behaviour corrections.

Each concern is one small module with a registry; ``build_objective`` composes the pieces an
``AlgoConfig`` names into the ``Objective`` the trainer calls. Importing this package
registers every component. Nothing here knows about models, engines or the loop.
"""

from reroll.algo.advantages import ADVANTAGES
from reroll.algo.aggregation import AGGREGATIONS
from reroll.algo.corrections import CORRECTIONS
from reroll.algo.kl import KL_ESTIMATORS, kl_reward_penalty
from reroll.algo.objective import LossInputs, Objective, build_objective
from reroll.algo.shaping import overlong_penalty
from reroll.algo.surrogates import SURROGATES

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "SURROGATES",
    "LossInputs",
    "Objective",
    "build_objective",
    "kl_reward_penalty",
    "overlong_penalty",
]

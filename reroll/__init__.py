"""reroll: rollout-centric RL post-training for language models.

``reroll.train(config, reward=..., dataset=...)`` is the Python API (`reroll.api`), imported
on first use so that ``import reroll`` stays light."""

__version__ = "0.1.0"


def train(config=None, *, reward=None, dataset=None, overrides=(), **kw):
    """RL training from Python: `reroll.api.train` (a config path or object, a reward
    callable or verifier name, rows or a dataset path); returns the run directory and its
    last metrics."""
    import importlib  # by name: the package root stays a facade none of its modules import

    return importlib.import_module("reroll.api").train(config, reward=reward, dataset=dataset, overrides=overrides, **kw)

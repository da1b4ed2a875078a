"""reroll: rollout-centric RL post-training for language models.

``reroll.train(config, reward=..., dataset=...)``, ``reroll.sft(...)`` and
``reroll.evaluate(..., checkpoint=...)`` are the Python API (`reroll.api`), imported on first
use so that ``import reroll`` stays light."""

__version__ = "0.1.0"


def _api():
    import importlib  # by name: the package root stays a facade none of its modules import

    return importlib.import_module("reroll.api")


def train(config=None, *, reward=None, dataset=None, overrides=(), **kw):
    """RL training from Python: `reroll.api.train` (a config path or object, a reward
    callable or verifier name, rows or a dataset path); returns the run directory and its
    last metrics."""
    return _api().train(config, reward=reward, dataset=dataset, overrides=overrides, **kw)


def sft(config=None, *, dataset=None, overrides=(), **kw):
    """Supervised warm start from Python: `reroll.api.sft` (as `reroll sft`); returns the run
    directory, the saved model folder and the losses."""
    return _api().sft(config, dataset=dataset, overrides=overrides, **kw)


def evaluate(config=None, *, checkpoint, reward=None, dataset=None, overrides=(), **kw):
    """Held-out evaluation from Python: `reroll.api.evaluate` (as `reroll eval`); returns the
    checkpoint and its accuracy and pass@k."""
    return _api().evaluate(config, checkpoint=checkpoint, reward=reward, dataset=dataset,
                           overrides=overrides, **kw)

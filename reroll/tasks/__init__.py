"""Built-in verifiable tasks and dataset loaders, looked up by name in ``TASKS``.

Each entry is a builder ``fn(seed, *, **hyperparameters) -> Task``: deterministic from the
seed, with disjoint train and test splits. Importing this package registers them all.
"""

from reroll.tasks import (  # noqa: F401
    arithmetic,
    countdown,
    countdown_search,
    files,
    guess,
    longtail,
    mixed,
)
from reroll.tasks.base import TASKS, Task, TaskError

__all__ = ["TASKS", "Task", "TaskError"]

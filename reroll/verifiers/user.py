"""The ``python`` verifier: a user's own reward function, named by import path "pkg.mod:fn".

Owns calling a TRL-style reward function for one rollout. The contract (as in TRL)::

    fn(prompts: list[str], completions: list[str], **example_fields) -> list[float | None]

called here with one-element lists: ``prompts=[example.prompt]``,
``completions=[rollout.completion]``, ``answer=[example.answer]``,
``prompt_id=[example.prompt_id]`` and one list per key of ``example.fields``. A tuple or
a 1-D array (numpy, torch: anything with ``ndim == 1`` and ``tolist``) stands for the list;
its values may be any real numbers (numpy scalars, bools).

``None`` means "not applicable to this sample". It is stored as value 0.0 with
``info["applicable"] = False``, so it adds nothing to the weighted sum (what TRL's nansum
does) and is not an error. An exception, a wrong-length result or a non-number is an error
Score naming the function. Must not know where scoring runs.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.base import VERIFIERS, Verifier, failed, judged


def resolve(path: str) -> Callable:
    """The callable at "pkg.mod:fn" (attribute paths like "mod:Class.method" allowed). A
    module in the current working directory is importable (as with ``python -m``), also
    when reroll runs as the ``reroll`` console script or in a scoring worker."""
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"verifier 'python': fn={path!r} must look like 'pkg.module:function'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"verifier 'python': cannot import module {mod_name!r} of fn={path!r}: "
                         f"{e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"verifier 'python': module {mod_name!r} has no {attr!r} "
                             f"(fn={path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"verifier 'python': {path!r} is not callable")
    return obj


@dataclass
class PythonVerifier:
    fn: str
    name: str = "python"
    func: Callable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.func = resolve(self.fn)

    @property
    def caller_only(self) -> str | None:
        """Why this function can run only in the process that loaded it (None: anywhere).
        A function defined in the script being run (``__main__``) cannot be imported by a
        scoring worker, whose ``__main__`` is the worker itself."""
        mod, _, attr = self.fn.partition(":")
        if mod != "__main__":
            return None
        return (f"reward function {self.fn!r} is defined in the script being run, which "
                f"separate scoring processes cannot import. Move it into a module beside the "
                f"script (e.g. my_rewards.py) and name it 'my_rewards:{attr}', or set "
                f"reward.workers=0 to score in a thread of this process")

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        kwargs = {k: [v] for k, v in example.fields.items()}
        kwargs.update(answer=[example.answer], prompt_id=[example.prompt_id])
        try:
            out = self.func(prompts=[example.prompt], completions=[rollout.completion], **kwargs)
        except (Exception, SystemExit) as e:  # sys.exit() in a reward is its failure too
            tb = traceback.format_exc(limit=-3)
            return failed(self.name, f"reward function {self.fn} raised {type(e).__name__}: {e}",
                          traceback=tb)
        if getattr(out, "ndim", None) == 1 and hasattr(out, "tolist"):
            out = out.tolist()  # a 1-D numpy array or tensor: one value per completion
        if not isinstance(out, list | tuple) or len(out) != 1:
            return failed(self.name, f"reward function {self.fn} must return a list with one "
                          f"value per completion (1 here), got {out!r:.80}")
        v = out[0]
        if v is None:
            return judged(self.name, 0.0, f"{self.fn} returned None (not applicable)",
                          applicable=False)
        if not isinstance(v, numbers.Real) or not math.isfinite(v):
            return failed(self.name, f"reward function {self.fn} returned {v!r}, "
                          "expected a finite float or None")
        return judged(self.name, float(v), f"{self.fn} returned {v!r}", applicable=True)


@VERIFIERS.register("python")
def python(*, fn: str) -> Verifier:
    """A user reward function by import path ``"pkg.mod:fn"`` (TRL contract, see module)."""
    return PythonVerifier(fn=fn)

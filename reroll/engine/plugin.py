"""The engine's plug-in interface: the hooks `TorchEngine` calls on its plug-ins (forks,
branches, drafts, re-drafts, pruning: `reroll.engine.plugins`), and the part of the engine a
plug-in may use.

Owns the hook contract only. Knows nothing of any one plug-in, nor of tensors' layout.

A plug-in owns its state (its tables, gates, head, flags) and talks to the engine only
through the hooks below and the engine's plug-in surface: the attributes ``rows`` (the
running `Request` of slot i is ``rows[i]``), ``waiting`` (the queue), ``version``,
``device``, ``max_batch``, ``model`` and the per-slot tensors ``pos`` (tokens cached),
``next_tok`` (the token each slot feeds next),
``temp``, ``top_k``, ``top_p``; the methods ``count``, ``add_counters``, ``live``, ``add``,
``emit``, ``request``, ``seat``, ``sample``, ``release``, ``finish``, ``ended``, ``length``,
``decode_text``, ``extend``, ``logit_rows`` and the property ``one_token``
(`reroll.engine.core.DecodeCore`). It never reads
the engine's private attributes nor another plug-in's state.

Hooks are called per step (or per request added), never per token; the engine calls a hook
only on the plug-ins whose class overrides it (`overrides`), and every plug-in returns at
once when it has nothing to do (an empty table, no head), so an engine whose plug-ins are idle
pays a few Python calls a step. Every hook has a no-op default here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from reroll.engine.requests import Request
    from reroll.rollout import Rollout

HOOKS = ("added", "held", "admit", "prefilled", "decode", "sample", "sampled", "ended",
         "stepped", "aborted", "weights")


class EnginePlugin:
    """Base of the engine's plug-ins: every hook a no-op. ``counters``: the stats counters the
    plug-in keeps in the engine's `stats` (created with the engine, all 0)."""

    counters: tuple[str, ...] = ()
    one_token = False  # True while the plug-in needs one-token decode steps (hidden states)

    def __init__(self, core) -> None:
        self.core = core

    def added(self, q: Request) -> None:
        """``q`` is being added (`TorchEngine.add`): check it (raise to refuse), prepare it."""

    def held(self) -> set[str]:
        """Sample ids the plug-in holds outside the queue and the slots (not to add twice)."""
        return set()

    def admit(self, q: Request, chosen: list, used: int) -> str | None:
        """``q`` is first in the queue while a prefill is packed (``chosen``: the requests
        taken so far, ``used`` slots busy with them): "wait" stops the admission here,
        "with" takes ``q`` with the previous one whatever the token budget, None: no say."""
        return None

    def prefilled(self, logits: Tensor, chosen: list, nd: list[int], n0: int
                  ) -> list[Rollout] | None:
        """Take over the sampling after a prefill that holds drafts (``nd``: the draft length
        of each unique sequence, one logits row per draft token + 1); None: not this one's."""
        return None

    def decode(self) -> list[Rollout] | None:
        """Run this decode step in its own way (a multi-token step); None: the plain step."""
        return None

    def sample(self, logits: Tensor, start: int, rows: Tensor | None,
               pick: Tensor | None) -> list[Rollout] | None:
        """Take over the sampling of slots ``start ..`` after a forward (logits [n, V], the
        forward's ``rows`` and the ``pick`` of them each slot samples from, for
        `logit_rows`); None: the engine's plain `sample`."""
        return None

    def sampled(self, sl: slice, logits: Tensor, tok: Tensor, ban: Tensor | None,
                fin: list[int]) -> list[Rollout]:
        """Slots ``sl`` just sampled ``tok`` from ``logits``; ``fin``: the slots that finished
        (still in place: their cache rows can be copied). Returns records that finished."""
        return []

    def ended(self, r: Rollout) -> list[Rollout]:
        """``r`` finished with no cache row to share (at admission, inside a draft);
        returns records that finished because of it."""
        return []

    def stepped(self, done: list[Rollout]) -> None:
        """A step ended with ``done`` finished."""

    def aborted(self, wanted: set[str]) -> list[Rollout]:
        """The named sample ids stop for good; returns the records it held that stop."""
        return []

    def weights(self, state_dict: dict) -> dict:
        """Published weights on their way to the model: returns what is left for it."""
        return state_dict


def overrides(plugins, hook: str) -> tuple:
    """The bound ``hook`` of each plug-in whose class overrides the no-op default."""
    base = getattr(EnginePlugin, hook)
    return tuple(getattr(p, hook) for p in plugins if getattr(type(p), hook) is not base)

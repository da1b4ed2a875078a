"""XRPO's in-context seeding of hard prompts (the third part of XRPO, `reroll.methods.xrpo`
holds the other two; docs/algorithms.md, XRPO rows). Rule in one line: a group whose samples
are all wrong when the allocator closes it gets one more round of ``samples`` samples whose
prompt carries ``exemplars`` solved problems in front of it.

- Where the exemplars come from: `ExemplarStore`, the run's own solved problems (a prompt
  with a verified correct response in a consumed group: its latest correct completion),
  at most ``capacity`` prompts, the oldest solved forgotten first. It changes only at step
  boundaries, in consumption order, and is checkpointed, so a resumed run seeds exactly
  what an uninterrupted one did. The exemplars of a seeded prompt are the ``exemplars``
  most recently solved other prompts (a prompt's own past solution is never shown to it).
- The seeded prompt text is `seeded_prompt`: each exemplar's problem and solution, then the
  problem itself.
- Under which prompt the seeded samples train (``train``): "seeded" (the default) trains
  them as sampled, exemplars in the prompt: on-policy, no correction involved.
  "unseeded" puts the plain prompt back before training (`unseed`): the response keeps the
  behaviour log-probs mu of the seeded context, while the trainer computes pi_prox on the
  plain prompt, so the sample is off-policy and ``algo.correction``'s weight of
  pi_prox / mu applies to it (the config check refuses ``correction = "none"`` then).
- A seeded sample says so in ``Rollout.control["seed"]`` (the exemplars' prompt ids, the
  seeded prompt's length, where it trains); it is not evidence about the plain prompt, so
  per-prompt statistics leave it out (`reroll.control.controller`).

Knows nothing of engines, tokenizers, the scheduler or the trainer: the group starter
encodes the text this module writes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from reroll.rollout import Group, Rollout, Span

SEED = "seed"  # the key of a seeded sample's entry in Rollout.control


def seeded_prompt(exemplars: list[tuple[str, str]], prompt: str) -> str:
    """The seeded prompt: each exemplar ``(problem, solution)`` as ``problem`` and
    ``solution`` on their own lines, a blank line after each, then ``prompt``."""
    return "".join(f"{p}\n{s}\n\n" for p, s in exemplars) + prompt


def should_seed(values: list[float], successes: int, seeded: bool, available: int) -> bool:
    """Whether a group the allocator just closed gets a seeded round: none of its
    ``values`` counted a success, it was not seeded already, and the store has exemplars."""
    return bool(values) and successes == 0 and not seeded and available > 0


def unseed(r: Rollout, prompt_tokens: list[int]) -> None:
    """Put ``prompt_tokens`` (the plain prompt) in place of ``r``'s seeded prompt: the
    response tokens, their loss mask, behaviour log-probs and versions are kept as they are,
    the spans move with them."""
    cut, k = r.prompt_len, len(prompt_tokens)
    r.tokens = list(prompt_tokens) + r.tokens[cut:]
    r.loss_mask = [False] * k + r.loss_mask[cut:]
    r.logprobs = [0.0] * k + r.logprobs[cut:]
    r.versions = [-1] * k + r.versions[cut:]
    if r.old_logprobs is not None:
        r.old_logprobs = [None] * k + r.old_logprobs[cut:]
    shift = k - cut
    r.spans = [Span(0, k, "prompt")] + [Span(s.start + shift, s.end + shift, s.source,
                                             s.version) for s in r.spans if s.start >= cut]
    r.prompt_len = k
    r.control[SEED].update(trained_under="unseeded", seeded_prompt_len=cut)
    r.check()


class ExemplarStore:
    """Solved problems of the run: prompt id -> (problem, solution), at most ``capacity``,
    ordered by when each was last solved (the most recent last)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"xrpo seeding: the exemplar store needs capacity >= 1, got "
                             f"{capacity}")
        self.capacity = capacity
        self.items: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, prompt_id: str, problem: str, solution: str) -> None:
        self.items.pop(prompt_id, None)
        self.items[prompt_id] = (problem, solution)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def pick(self, k: int, exclude: str) -> list[tuple[str, tuple[str, str]]]:
        """The ``k`` most recently solved prompts other than ``exclude``, oldest first, as
        ``(prompt_id, (problem, solution))``."""
        out = [(pid, it) for pid, it in reversed(self.items.items()) if pid != exclude][:k]
        return out[::-1]

    def available(self, exclude: str) -> int:
        return len(self.items) - (exclude in self.items)

    def state(self) -> dict:
        return {"items": [[pid, p, s] for pid, (p, s) in self.items.items()]}

    def load_state(self, d: dict | None) -> None:
        self.items = OrderedDict((pid, (p, s)) for pid, p, s in (d or {}).get("items", []))


class ICLSeeder:
    """The controller's seeding rule: when a group closes all wrong, ``samples`` more with
    ``exemplars`` solved problems in the prompt (see the module docstring)."""

    def __init__(self, *, samples: int, exemplars: int, capacity: int, train: str = "seeded"):
        if samples < 1 or exemplars < 1:
            raise ValueError(f"xrpo seeding: need samples >= 1 and exemplars >= 1, got "
                             f"{samples} and {exemplars}")
        if train not in ("seeded", "unseeded"):
            raise ValueError(f"xrpo seeding: train must be 'seeded' or 'unseeded', got "
                             f"{train!r}")
        self.samples, self.exemplars, self.train = samples, exemplars, train
        self.store = ExemplarStore(capacity)

    def seed(self, g: Group, values: list[float], successes: int) -> tuple[int, str, dict]:
        """``(samples, seeded prompt text, the new samples' control entry)`` for a group the
        allocator closed, or ``(0, "", {})`` when it gets no seeded round."""
        pid = g.prompt_id
        if not should_seed(values, successes, is_seeded(g), self.store.available(pid)):
            return 0, "", {}
        picked = self.store.pick(self.exemplars, exclude=pid)
        text = seeded_prompt([it for _, it in picked], g.example.prompt)
        return self.samples, text, {"exemplars": [p for p, _ in picked],
                                    "trained_under": "seeded"}

    def settle(self, g: Group) -> None:
        """A complete group: with ``train = "unseeded"``, its seeded samples get the plain
        prompt back (that of its first member, which is never seeded)."""
        if self.train != "unseeded":
            return
        plain = g.rollouts[0].prompt_tokens
        for r in g.rollouts:
            if SEED in r.control and r.control[SEED]["trained_under"] == "seeded":
                unseed(r, plain)

    def end_step(self, consumed: list[Group], success: Callable[[Rollout], bool]) -> None:
        """Consumed groups, in consumption order: each prompt with a correct unseeded
        sample is stored with its last correct completion."""
        for g in consumed:
            right = [r for r in g.generated() if SEED not in r.control and success(r)]
            if right:
                self.store.add(g.prompt_id, g.example.prompt, right[-1].completion)

    def metrics(self, consumed: list[Group], success: Callable[[Rollout], bool]
                ) -> dict[str, float]:
        """Seeded groups among the step's consumed ones and how many of them found a correct
        answer with the seed; the store's size."""
        seeded = [g for g in consumed if is_seeded(g)]
        solved = sum(any(SEED in r.control and success(r) for r in g.rollouts) for g in seeded)
        return {"xrpo/seeded_groups": float(len(seeded)), "xrpo/seeded_solved": float(solved),
                "xrpo/exemplars_stored": float(len(self.store))}

    def state(self) -> dict:
        return {"store": self.store.state()}

    def load_state(self, d: dict | None) -> None:
        self.store.load_state((d or {}).get("store"))


def is_seeded(g: Group) -> bool:
    return any(SEED in r.control for r in g.rollouts)

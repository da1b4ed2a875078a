"""The Control stage in one object: per-prompt statistics, the allocator (samples per prompt),
the prompt selector, the length schedule and the group shapers, with the state that goes into
checkpoints.

The scheduler asks it, for a new group, how many samples to start and to reserve and what
response limit is in force (and the group starter lets it ``prepare`` each new sample: DUET's
stop rule, `reroll.methods.duet`; a pruner's rule, `reroll.control.pruners`); a workflow asks
it, after each round of a group, whether to add samples (through `Scheduler.grow`). When a
group completes (`finish`), the group shapers (`reroll.control.shapers`: DOT's outlier
truncation) adjust its rewards. Outcomes reach the statistics only at step boundaries
(`end_step`): the groups a step consumed in consumption order, after the groups dropped by
filters since the last boundary in admission order. Decisions therefore read state that is
fixed for the whole step, and a resumed run makes the decisions an uninterrupted one made.

A sample is a success when its verifier value (the reward components' combination, before
any length shaping: what DAPO's filter looks at) is at least ``success_at``. Knows nothing of
engines, threads, the event loop or any method.
"""

from __future__ import annotations

from collections.abc import Callable

from reroll.control.allocators import Allocator
from reroll.control.shapers import Shaper
from reroll.control.stats import PromptStats
from reroll.rollout import Group, Rollout

ValueOf = Callable[[Rollout], "float | None"]  # the verifier value of a scored sample


class Controller:
    def __init__(self, allocator: Allocator | None = None, stats: PromptStats | None = None,
                 *, value_of: ValueOf | None = None, success_at: float = 1.0,
                 length=None, step: int = 0, shapers: list[Shaper] = (),
                 gate=None, pruner=None, seeder=None):
        self.allocator = allocator
        self.stats = stats or PromptStats()
        self.value_of = value_of or (lambda r: r.reward)
        self.success_at, self.length, self.step = success_at, length, step
        self.shapers = list(shapers)  # `reroll.control.shapers.SHAPERS` entries (DOT)
        self.gate = gate  # DUET's `MarkerGate`, or None
        self.pruner = pruner  # a `reroll.control.pruners.PRUNERS` component, or None
        self.seeder = seeder  # XRPO's in-context seeding (`reroll.methods.xrpo_seeding`)
        self.step_metrics: dict[str, float] = {}  # about the last step's groups
        # (seq, prompt, successes, n, policy tokens) of dropped groups, until the boundary
        self.pending: list[tuple] = []
        self.selector = None  # set by whoever builds the prompt stream (see build)

    @property
    def adaptive(self) -> bool:
        """Whether groups may grow after their first round (an adaptive allocator, or
        in-context seeding)."""
        return self.seeder is not None or (self.allocator is not None
                                           and type(self.allocator) is not Allocator)

    # ---- a new group -------------------------------------------------------------------
    def plan(self, prompt_id: str, version: int, default_size: int) -> dict:
        """Sizes and limits of a new group: ``size`` (first round), ``max_size`` (reserved)
        and ``max_new_tokens`` (None: the configured one)."""
        a = self.allocator
        rec = self.stats.get(prompt_id)
        size = a.initial(rec) if a is not None else default_size
        max_size = max(size, a.max_size()) if a is not None else size
        if self.seeder is not None:  # room for a seeded round after the last one
            max_size += self.seeder.samples
        limit = self.length(version) if self.length is not None else None
        return {"size": size, "max_size": max_size, "max_new_tokens": limit}

    def prepare(self, rollouts: list[Rollout]) -> None:
        """Per-sample decisions on fresh samples, after their seeds are set (DUET's stop
        rule and keep draw, the pruner's rule)."""
        if self.gate is not None:
            for r in rollouts:
                self.gate.prepare(r)
        if self.pruner is not None:
            self.pruner.prepare(rollouts)

    def resume(self, groups: list[Group]) -> None:
        """Groups restored from a checkpoint whose workflows run again (the pruner's
        rules learn which members finished before the engine that decides now started)."""
        if self.pruner is not None:
            for g in groups:
                self.pruner.resume(g)

    # ---- a round of a group finished ---------------------------------------------------
    def values(self, g: Group, fresh: bool = False) -> list[float] | None:
        """The members' verifier values, or None when one failed (no decision on errors);
        ``fresh``: the samples the current policy generated for the plain prompt
        (`Group.generated`: a reused answer counts as the sample it displaced; a sample
        generated under a seeded prompt, ``control["seed"]``, is left out), which is what
        the statistics learn from."""
        rs = [r for r in g.generated() if "seed" not in r.control] if fresh else g.rollouts
        vals = [self.value_of(r) for r in rs]
        return None if any(v is None for v in vals) else [float(v) for v in vals]

    def success(self, r: Rollout) -> bool:
        """Whether one scored sample counts as a success (`success_at`)."""
        v = self.value_of(r)
        return v is not None and float(v) >= self.success_at

    def successes(self, values: list[float]) -> int:
        return sum(v >= self.success_at for v in values)

    def more(self, g: Group) -> int:
        """Samples to add to ``g`` now (0: the group is complete), never past its
        reservation."""
        return self.next_round(g)[0]

    def next_round(self, g: Group) -> tuple[int, str | None, dict]:
        """``(samples, prompt, control)`` of the round to add to ``g`` now (0 samples: the
        group is complete): the allocator's samples of the group's prompt (``None``,
        ``{}``), or, when the allocator adds none to a group with no correct sample, the
        seeder's samples of a seeded prompt text with their ``Rollout.control["seed"]``
        entry. Never past the group's reservation; a seeded group grows no further."""
        vals = self.values(g)
        if vals is None or (self.allocator is None and self.seeder is None):
            return 0, None, {}
        room = g.reserved - len(g.rollouts)
        seeded = any("seed" in r.control for r in g.rollouts)
        if self.allocator is not None and not seeded:
            rounds = 1 + max(r.group_round for r in g.rollouts)
            n = self.allocator.more(self.stats.get(g.prompt_id), vals, self.successes(vals),
                                    rounds)
            n = max(0, min(int(n), room - (self.seeder.samples if self.seeder else 0)))
            if n > 0:
                return n, None, {}
        if self.seeder is None:
            return 0, None, {}
        n, text, entry = self.seeder.seed(g, vals, self.successes(vals))
        n = max(0, min(n, room))
        return (n, text, {"seed": entry}) if n > 0 else (0, None, {})

    # ---- a group is complete -----------------------------------------------------------
    def finish(self, g: Group) -> None:
        """A complete group: DUET's gate weighs each sample (`MarkerGate.settle`), the pruner
        settles the group (labels, pruned members out of the loss), then each group shaper
        adjusts the rewards (`reroll.control.shapers`; DOT: among all-correct answers, the
        outlying long ones lose reward), given which members succeeded."""
        if self.gate is not None:
            for r in g.rollouts:
                self.gate.settle(r)
        if self.pruner is not None:
            self.pruner.settle(g, self.success)
        if self.seeder is not None:
            self.seeder.settle(g)
        if not self.shapers:
            return
        vals = self.values(g)
        ok = None if vals is None else [v >= self.success_at for v in vals]
        for shape in self.shapers:
            shape(g, ok)

    def abandon(self, prompt_id: str) -> None:
        """A prompt given up on after scoring failures: the selector never picks it again."""
        if self.selector is not None:
            self.selector.exclude(prompt_id)

    # ---- step boundaries ---------------------------------------------------------------
    def dropped(self, g: Group, seq: int) -> None:
        """A complete group a filter rejected: its outcome still says how hard the prompt
        is (an all-correct group is easy); folded in at the next boundary."""
        vals = self.values(g, fresh=True)
        if vals:
            self.pending.append((seq, g.prompt_id, self.successes(vals), len(vals),
                                 _fresh_tokens(g)))

    def end_step(self, consumed: list[Group]) -> None:
        """Fold in the groups dropped since the last boundary (by admission order), then
        the consumed ones (in consumption order); let the allocator update its prices."""
        for _, pid, s, n, *tokens in sorted(self.pending):  # no tokens: an older checkpoint
            self.stats.observe(pid, s, n, self.step, tokens[0] if tokens else None)
        self.pending.clear()
        outcomes = []
        for g in consumed:
            vals = self.values(g, fresh=True) or []
            s = self.successes(vals)
            self.stats.observe(g.prompt_id, s, len(vals), self.step,
                               _fresh_tokens(g) if vals else None)
            outcomes.append((g.prompt_id, len(g.rollouts), s))
        self.step_metrics = {**(self.gate.metrics(consumed) if self.gate is not None else {}),
                             **(self.pruner.metrics(consumed) if self.pruner else {}),
                             **(self.seeder.metrics(consumed, self.success)
                                if self.seeder is not None else {})}
        if self.seeder is not None:  # after the metrics: they count this step's seeds
            self.seeder.end_step(consumed, self.success)
        if self.allocator is not None:
            self.allocator.end_step(outcomes, self.stats)
        if self.selector is not None:
            self.selector.end_step(outcomes, self.stats)
        self.step += 1

    def metrics(self) -> dict[str, float]:
        """What to log: the allocator's state and the last step's DUET and pruner counts."""
        a = self.allocator.metrics() if self.allocator is not None else {}
        return {**a, **self.step_metrics}

    # ---- checkpoints -------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "stats": self.stats.state(),
                "pending": [list(p) for p in self.pending],
                "allocator": self.allocator.state() if self.allocator is not None else {},
                "selector": self.selector.state() if self.selector is not None else {},
                "seeder": self.seeder.state() if self.seeder is not None else {}}

    def load_state(self, d: dict | None) -> None:
        if not d:
            return
        self.step = int(d.get("step", 0))
        self.stats = PromptStats.from_state(d.get("stats"), keep=self.stats.keep)
        self.pending = [tuple(p) for p in d.get("pending", [])]
        if self.allocator is not None:
            self.allocator.load_state(d.get("allocator", {}))
        if self.selector is not None:
            self.selector.load_state(d.get("selector", {}))
        if self.seeder is not None:
            self.seeder.load_state(d.get("seeder", {}))


def _fresh_tokens(g: Group) -> int:
    """Policy tokens of the group's generated samples (the ones the statistics count)."""
    return sum(r.n_sampled for r in g.generated())

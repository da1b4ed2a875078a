"""The micro-batch planner: which samples go through the model together (pure).

`plan_micro_batches` takes the samples' sequence lengths and the limits (samples per pass,
a token budget) and returns the plan, lists of positions into the lengths; how a run of
samples is measured against the budget is a cost object (`PaddedCost`: samples x the
longest; `reroll.trainer.shared_prompt.PackedCost` for packed rows). `micro_slices` cuts a
batch into consecutive mini-batches. Must not know tensors, models or losses.
"""

from __future__ import annotations

from collections.abc import Sequence


def micro_slices(n: int, size: int) -> list[slice]:
    size = max(1, size)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class PaddedCost:
    """Positions a run of samples forwards padded to its longest (samples x longest), kept
    as samples join it: `plan_micro_batches`' default measure of a run against its budget."""

    def __init__(self, lengths: Sequence[int]):
        self.lengths = lengths
        self.reset()

    def reset(self) -> None:
        self.n, self.widest = 0, 0

    def with_(self, i: int) -> int:
        """The run's positions if sample ``i`` joined it."""
        return (self.n + 1) * max(self.widest, self.lengths[i])

    def add(self, i: int) -> None:
        self.n += 1
        self.widest = max(self.widest, self.lengths[i])


def plan_micro_batches(lengths: Sequence[int], rows: int, tokens: int = 0,
                       units: Sequence | None = None,
                       cost: PaddedCost | None = None) -> list[list[int]]:
    """Positions into ``lengths`` (sequence lengths), grouped into micro-batches.

    ``tokens == 0``: consecutive runs of at most ``rows`` samples, in order. ``tokens > 0``
    (a token budget, verl's dynamic batch size): the samples longest first (ties in order),
    cut into consecutive runs of at most ``rows`` samples whose size, measured by ``cost``
    (default `PaddedCost`: samples x the run's longest), is at most ``tokens``; a sample
    longer than the budget gets a run of its own. Each micro-batch is then padded to its own
    longest sequence only (`Batch.trim`), so sorting leaves little padding where lengths vary
    (long-tail responses).

    ``units`` (with a budget; one key per sample, e.g. its prompt id under
    ``train.share_prompt``): the samples of a unit stay next to each other, so that they
    land in one micro-batch unless it fills up. Units go longest member first (ties in
    order of first appearance), their members longest first; ``cost`` then is usually the
    positions of the packed layout (`reroll.trainer.shared_prompt.PackedCost`)."""
    rows = max(1, rows)
    if tokens <= 0:
        return [list(range(i, min(i + rows, len(lengths)))) for i in range(0, len(lengths), rows)]
    if units is None:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    else:
        longest: dict = {}
        first: dict = {}
        for i, u in enumerate(units):
            longest[u] = max(longest.get(u, 0), lengths[i])
            first.setdefault(u, i)
        order = sorted(range(len(lengths)),
                       key=lambda i: (-longest[units[i]], first[units[i]], -lengths[i], i))
    cost = cost if cost is not None else PaddedCost(lengths)
    cost.reset()
    plan: list[list[int]] = []
    for i in order:
        if plan and len(plan[-1]) < rows and cost.with_(i) <= tokens:
            plan[-1].append(i)
        else:
            plan.append([i])
            cost.reset()
        cost.add(i)
    return plan

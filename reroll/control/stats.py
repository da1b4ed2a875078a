"""Per-prompt statistics that persist across steps: what every adaptive
control policy (allocators, selectors) reads about a prompt's difficulty.

Owns one `PromptRecord` per prompt seen: cumulative trials and successes, the step it was
last observed, and its most recent observations ``(step, successes, trials)``, newest last,
so that decays (VADE) and recent pass rates (GDRO bins, DOTS) can be computed from them; and
the policy tokens of its samples, for expected response lengths (DUET).
Observations are folded in at step boundaries, in a deterministic order, so a resumed run
reads exactly what an uninterrupted one read. JSON state for checkpoints. Pure bookkeeping:
no engine, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class PromptRecord:
    trials: int = 0
    successes: int = 0
    last_step: int = -1
    history: list[tuple[int, int, int]] = field(default_factory=list)
    """The most recent observations ``(step, successes, trials)``, oldest first."""
    tokens: int = 0
    """Policy tokens of the ``sized`` samples whose lengths were observed."""
    sized: int = 0

    @property
    def mean_len(self) -> float | None:
        """Mean policy tokens per sample (None before a length was observed)."""
        return self.tokens / self.sized if self.sized else None

    @property
    def rate(self) -> float | None:
        """Success rate over all observations (None before the first)."""
        return self.successes / self.trials if self.trials else None

    def recent_rate(self, k: int) -> float | None:
        """Success rate over the last ``k`` observations (None before the first)."""
        obs = self.history[-k:]
        n = sum(t for _, _, t in obs)
        return sum(s for _, s, _ in obs) / n if n else None


class PromptStats:
    def __init__(self, keep: int = 8):
        if keep < 1:
            raise ValueError(f"PromptStats: keep must be >= 1, got {keep}")
        self.keep = keep
        self.records: dict[str, PromptRecord] = {}

    def get(self, prompt_id: str) -> PromptRecord | None:
        return self.records.get(prompt_id)

    def observe(self, prompt_id: str, successes: int, trials: int, step: int,
                tokens: int | None = None) -> None:
        """One group's outcome for ``prompt_id`` at ``step``; ``tokens``: the policy tokens
        of its ``trials`` samples, when known."""
        if not 0 <= successes <= trials:
            raise ValueError(f"prompt {prompt_id!r}: successes {successes} not in [0, "
                             f"trials={trials}]")
        if trials == 0:
            return
        r = self.records.setdefault(prompt_id, PromptRecord())
        r.trials += trials
        r.successes += successes
        r.last_step = max(r.last_step, step)
        r.history.append((step, successes, trials))
        del r.history[: -self.keep]
        if tokens is not None:
            r.tokens += int(tokens)
            r.sized += trials

    def mean_len(self) -> float | None:
        """Mean policy tokens per sample over every prompt seen (a prior for unseen ones)."""
        n = sum(r.sized for r in self.records.values())
        return sum(r.tokens for r in self.records.values()) / n if n else None

    def mean_rate(self) -> float | None:
        """Pooled success rate over every prompt seen (a prior for unseen prompts)."""
        n = sum(r.trials for r in self.records.values())
        return sum(r.successes for r in self.records.values()) / n if n else None

    def items(self) -> Iterable[tuple[str, PromptRecord]]:
        return self.records.items()

    def __len__(self) -> int:
        return len(self.records)

    # ---- checkpoints -------------------------------------------------------------------
    def state(self) -> dict:
        return {"keep": self.keep,
                "records": {pid: [r.trials, r.successes, r.last_step,
                                  [list(h) for h in r.history], r.tokens, r.sized]
                            for pid, r in self.records.items()}}

    @classmethod
    def from_state(cls, d: dict | None, keep: int = 8) -> PromptStats:
        s = cls(keep)
        for pid, (trials, succ, last, hist, *size) in (d or {}).get("records", {}).items():
            s.records[pid] = PromptRecord(trials, succ, last, [tuple(h) for h in hist][-keep:],
                                          *size)  # size: [tokens, sized], absent before DUET
        return s

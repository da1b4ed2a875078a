"""Process checks shared by the tests that kill workers and their children. Must not know
about reroll."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False

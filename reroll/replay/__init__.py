"""Replay: keep and reuse trajectories (DESIGN.md 1, 5): the append-only rollout store, the
replay buffer of informative groups, the bank of past correct answers, and the Replay stage
that the rollout pipeline calls."""

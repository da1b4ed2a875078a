"""Replay: keep and reuse trajectories (docs/architecture.md, docs/algorithms.md): the append-only rollout store, the
replay buffer of informative groups, the bank of past correct answers, and the Replay stage
that the rollout pipeline calls."""

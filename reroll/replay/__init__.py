"""Replay: keep and reuse trajectories inside a run (docs/architecture.md,
docs/algorithms.md): the replay buffer of informative groups, the bank of past correct
answers, the drafts a fresh sample starts from, and the Replay stage that the rollout
pipeline calls. The run's recording (the rollout store) and the ``reroll replay`` command
that trains on it are `reroll.recording`."""

"""Recording: a run's record of what it trained on, and training again from it.

`store` is the rollout store (every consumed rollout of a run, append-only, in Parquet under
``RUN/rollouts/``); `retrain` is the ``reroll replay`` command, which trains again on a
recorded run's batches under another estimator, loss or learning rate. Not the Replay stage
(`reroll.replay`), which reuses past groups, answers and drafts inside a run.
"""

"""The engine's plug-ins (`reroll.engine.plugin`): forks, branches, drafts verified at
admission, re-drafting inside decode, pruning at a checkpoint. Each owns its state and talks
to the engine only through the hooks and the engine's plug-in surface."""

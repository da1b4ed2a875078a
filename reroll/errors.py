"""Error types for bad input, shared by the config, its checks and the CLI (which exits 2 on
them). Imports nothing, so any module can raise them without an import cycle."""


class ConfigError(ValueError):
    """Bad input in the configuration (the CLI exits with status 2)."""


class CheckpointError(ConfigError):
    """A checkpoint that does not match the model or optimiser the config builds; the
    checkpoint is left untouched."""


class RewardError(ConfigError):
    """The reward (a verifier or a user's reward function) keeps failing, or cannot run
    where scoring runs: the run stops with this message (the CLI exits with status 2)."""

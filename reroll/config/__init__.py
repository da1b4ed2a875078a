"""Run configuration: dataclasses with a docstring per field, TOML load, ``a.b=c`` overrides
(the generic table <-> dataclass machinery is `reroll.tables`).

Owns the shape of a run's settings, split by side: `generation` (model, task, rollout,
engine, reward), `training` (algo, control, replay, train, sft, lora), `run` (eval, runtime, log
and the root `RunConfig`), `ranges` (each numeric field's interval, declared in its field's
metadata, and the walk that checks them) and `load` (read, override, dump). Everything is
re-exported here: ``from reroll.config import RunConfig``.

Loading checks keys and types only. The checks that need the registries or look across
fields (`reroll.config_checks.validate`) run where a run is assembled (the CLI commands,
`reroll.runtime.train`, `reroll replay`), so a bad config still fails before any work
starts. This package knows nothing of torch or of the registries.
"""

from reroll.config.generation import (
    EngineConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    SandboxConfig,
    TaskConfig,
)
from reroll.config.load import REPO_ROOT, dump_toml, load_config, preset_path
from reroll.config.ranges import check_ranges, field_ranges, ranged
from reroll.config.run import EvalConfig, LogConfig, RunConfig, RuntimeConfig
from reroll.config.training import (
    AlgoConfig,
    ControlConfig,
    LoraConfig,
    ReplayConfig,
    SFTConfig,
    TrainConfig,
)
from reroll.errors import CheckpointError, ConfigError
from reroll.tables import (
    apply_override,
    build,
    drop_none,
    merge,
    parse_value,
    read_toml,
    to_dict,
)

__all__ = [
    "REPO_ROOT", "AlgoConfig", "CheckpointError", "ConfigError", "ControlConfig", "EngineConfig",
    "EvalConfig", "LogConfig", "LoraConfig", "ModelConfig", "ReplayConfig", "RewardConfig", "RolloutConfig",
    "RunConfig", "RuntimeConfig", "SFTConfig", "SandboxConfig", "TaskConfig", "TrainConfig",
    "apply_override", "build", "check_ranges", "dump_toml", "drop_none", "field_ranges",
    "load_config", "merge", "parse_value", "preset_path", "ranged", "read_toml", "to_dict",
]

"""Typed run configuration: dataclass schema + loader (defaults <- YAML <- dotted overrides)."""

from .load import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    dump_config,
    find_config,
    load_config,
    run_config_dict,
    save_config,
)
from .schema import Config

__all__ = [
    "Config", "ConfigError", "config_from_dict", "config_to_dict", "dump_config", "find_config", "load_config",
    "run_config_dict", "save_config",
]  # fmt: skip

"""Typed run configuration: dataclass schema + loader (defaults <- YAML <- dotted overrides)."""

from .load import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    dump_config,
    eval_entries,
    find_config,
    flatten,
    load_config,
    replace_fields,
    save_config,
)
from .schema import Config, config_class, config_classes

__all__ = [
    "Config", "ConfigError", "config_class", "config_classes", "config_from_dict", "config_to_dict", "dump_config", "eval_entries", "find_config", "flatten",
    "load_config", "replace_fields", "save_config",
]  # fmt: skip

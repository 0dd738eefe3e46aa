"""The generic dataclass <-> YAML code now lives in :mod:`ce_retrieval.utils.dataclass_yaml`, below the data and
model configs that use it; this module keeps ``from ce_retrieval.configs.base import ...`` working."""

from ce_retrieval.utils.dataclass_yaml import (
    ConfigError,
    from_dict,
    load_yaml,
    merge,
    parse_override,
    save_yaml,
    to_dict,
)

__all__ = ["ConfigError", "from_dict", "load_yaml", "merge", "parse_override", "save_yaml", "to_dict"]

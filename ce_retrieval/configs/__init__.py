"""Typed experiment configs (dataclasses) with YAML files and ``--params_override``; the generic dataclass <-> YAML
code is :mod:`ce_retrieval.utils.dataclass_yaml` (re-exported here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ce_retrieval.utils.dataclass_yaml import (
    ConfigError,
    from_dict,
    load_yaml,
    merge,
    parse_override,
    save_yaml,
    to_dict,
)

if TYPE_CHECKING:
    from ce_retrieval.configs.experiment import ExperimentConfig

__all__ = [
    "ConfigError",
    "from_dict",
    "load_experiment",
    "load_yaml",
    "merge",
    "parse_override",
    "save_yaml",
    "to_dict",
]


def load_experiment(path: str, overrides: list[str] | None = None) -> ExperimentConfig:
    """An :class:`~ce_retrieval.configs.experiment.ExperimentConfig` from a YAML file plus override strings."""
    from ce_retrieval.configs.experiment import ExperimentConfig

    return load_yaml(ExperimentConfig, path, overrides)

"""What differs between the config a model directory was trained with and the config of a run about to use it.

A run resumed from a backup, or a finished model reused, under another config would mix two experiments in one
model (or one record) without a word; the trainer and the main job refuse that and name the keys that differ.
"""

from __future__ import annotations

import os

import yaml

from ce_retrieval.utils.dataclass_yaml import to_dict

ABSENT = "(absent)"


def config_changes(cfg, saved_path: str, limit: int = 5) -> list[str]:
    """``key: saved -> now`` for each leaf where the config saved at ``saved_path`` differs from ``cfg`` (at most
    ``limit``, then how many more); one line saying so when none was saved."""
    if not os.path.exists(saved_path):
        return [f"no config.yaml in {os.path.dirname(saved_path)}"]
    with open(saved_path) as f:
        saved = _leaves(yaml.safe_load(f) or {})
    now = _leaves(yaml.safe_load(yaml.safe_dump(to_dict(cfg))))  # as it would be saved (tuples as lists)
    keys = [k for k in sorted(set(saved) | set(now)) if saved.get(k, ABSENT) != now.get(k, ABSENT)]
    changed = [f"{k}: {saved.get(k, ABSENT)!r} -> {now.get(k, ABSENT)!r}" for k in keys]
    return changed[:limit] + ([f"{len(changed) - limit} more"] if len(changed) > limit else [])


def _leaves(tree, prefix: str = "") -> dict:
    """``{"a.b": value}`` of a nested dict (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


__all__ = ["config_changes"]

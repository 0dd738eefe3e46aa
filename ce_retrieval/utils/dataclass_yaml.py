"""Dataclasses <-> YAML: strict loading, Model Garden-style overrides, atomic saving (generic, config-agnostic).

Experiments are data, not code (TF Model Garden): a YAML file fills a tree of dataclasses, and
``--params_override 'train.batch_size=64,loss.name=SampledSoftmax'`` (or a YAML/JSON mapping string) changes
any field. Unknown keys are errors that name the full key path, values are coerced to the field's declared type
(``int``, ``float``, ``bool``, ``str``, ``Optional[...]``, ``list``/``tuple``, ``dict`` and nested dataclasses),
and a wrong type is an error naming the key.

Why here, below ``configs``, ``data`` and ``modeling``: the data and model configs need ``from_dict`` and
``configs/experiment.py`` imports both of them, so the generic code must not live in the ``configs`` package
(which re-exports it: ``from ce_retrieval.configs import from_dict`` keeps working).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

import yaml

from ce_retrieval.utils.atomic import atomic_write_text

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid (unknown key, wrong type, bad value)."""


def to_dict(cfg) -> dict:
    """A plain nested dict of a dataclass config (YAML/JSON-serialisable)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=_jsonable))


def from_dict(cls: type[T], data: dict | None, path: str = "") -> T:
    """Builds ``cls`` from a nested mapping, strictly: unknown keys and wrong types raise :class:`ConfigError`."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f" in {path}" if path else ""
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(_join(path, k) for k in unknown)}{where}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or cls.__name__}: {exc}") from exc


def merge(cfg: T, updates: dict, path: str = "") -> T:
    """A copy of ``cfg`` with a nested mapping of updates applied (strict, like :func:`from_dict`).

    Nested dataclass fields are merged key by key; ``dict`` fields (free-form, e.g. ``loss.kwargs``) take any key.
    """
    if not isinstance(updates, dict):
        raise ConfigError(f"{path or type(cfg).__name__}: expected a mapping of updates, got {updates!r}")
    hints = typing.get_type_hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg) if f.init}
    changes = {}
    for key, value in updates.items():
        if key not in names:
            raise ConfigError(f"unknown config key {_join(path, key)}; valid keys: {', '.join(sorted(names))}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[key] = merge(current, value, _join(path, key))
        elif isinstance(current, dict) and isinstance(value, dict):
            changes[key] = {**current, **value}
        else:
            changes[key] = _coerce(hints[key], value, _join(path, key))
    try:
        return dataclasses.replace(cfg, **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or type(cfg).__name__}: {exc}") from exc


def parse_override(text: str) -> dict:
    """``'a.b=1,c=x'`` or a YAML/JSON mapping string → nested dict of updates."""
    text = (text or "").strip()
    if not text:
        return {}
    if text.startswith("{") or "\n" in text or (":" in text and "=" not in text):
        loaded = yaml.safe_load(text)
        if not isinstance(loaded, dict):
            raise ConfigError(f"--params_override: expected a mapping, got {text!r}")
        return loaded
    updates: dict = {}
    for item in _split_top_level(text):
        if "=" not in item:
            raise ConfigError(f"--params_override: {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        keys = key.strip().split(".")
        node = updates
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return updates


def load_yaml(cls: type[T], path: str, overrides: list[str] | None = None) -> T:
    """Loads a YAML file into ``cls`` and applies each override string in order."""
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    try:
        cfg = from_dict(cls, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    for text in overrides or []:
        cfg = merge(cfg, parse_override(text))
    return cfg


def save_yaml(cfg, path: str) -> None:
    """Writes the config atomically (:func:`ce_retrieval.utils.atomic.atomic_write_text`)."""
    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ----------------------------------------------------------------------------------------------- internals
def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _jsonable(value):
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not serialisable: {value!r}")


def _split_top_level(text: str) -> list[str]:
    """Splits on commas that are not inside brackets or quotes (so ``ks=[1,5,10]`` stays whole)."""
    items, depth, quote, current = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        items.append("".join(current).strip())
    return items


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: cannot be {value!r}")
    if typing.get_origin(tp) is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    return value

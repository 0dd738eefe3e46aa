"""Registry of loss classes by name, so configs and the CLI select any loss as a string.

``register`` is a class decorator that also registers the class with Keras serialisation
(``package='ce_retrieval'``), so a compiled model reloads with its loss.
"""
from __future__ import annotations

import re

import tensorflow as tf

_LOSSES: dict[str, type] = {}


def _aliases(cls_name: str) -> set[str]:
    # CrossExampleSoftmax -> cross_example_softmax, NCALoss -> nca_loss, LMNNLoss -> lmnn_loss
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", cls_name).lower()
    return {cls_name, cls_name.lower(), snake}


def register(cls):
    """Class decorator: Keras-serialisable under ``ce_retrieval>ClassName`` and selectable by name."""
    cls = tf.keras.utils.register_keras_serializable(package="ce_retrieval")(cls)
    for alias in _aliases(cls.__name__):
        _LOSSES[alias] = cls
    return cls


def get(identifier, **kwargs):
    """A loss instance from a class name (``'CrossExampleSoftmax'``, ``'cross_example_softmax'``), a config
    dict ``{'class_name': ..., 'config': {...}}``, or an instance (returned as is)."""
    if isinstance(identifier, tf.keras.losses.Loss):
        return identifier
    if isinstance(identifier, dict):
        cls = _lookup(identifier["class_name"])
        return cls.from_config({**identifier.get("config", {}), **kwargs})
    return _lookup(identifier)(**kwargs)


def available() -> list[str]:
    return sorted({cls.__name__ for cls in _LOSSES.values()})


def _lookup(name: str):
    import ce_retrieval.losses  # noqa: F401  (imports every family so they register)

    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(available())}")
    return _LOSSES[name]

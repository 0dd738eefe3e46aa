"""Registry of loss classes by name, so configs and the command line select any loss as a string.

``register`` is a class decorator that also registers the class with Keras serialisation
(``package='ce_retrieval'``), so a compiled model reloads with its loss.
"""

from __future__ import annotations

import re
from typing import TypeVar

import tf_keras

T = TypeVar("T")

_LOSSES: dict[str, type] = {}


def snake_case(name: str) -> str:
    """The one snake-case rule of the package: ``CrossExampleSoftmax -> cross_example_softmax``,
    ``NCALoss -> nca_loss``, ``LMNNLoss -> lmnn_loss``, ``InfoNCE -> info_nce``, ``NPairLoss -> n_pair_loss``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def default_name(cls: type) -> str:
    """The Keras ``name`` of an instance built without one: the class's ``default_name`` if it declares one
    (``RetrievalLoss.default_name``), else ``snake_case`` of the class name."""
    return getattr(cls, "default_name", None) or snake_case(cls.__name__)


def aliases(cls: type) -> set[str]:
    """Every name that selects ``cls``: its class name, lower-cased, snake-cased, and its default Keras name (so
    ``get(loss.name)`` finds the class of a loss built with its default name)."""
    return {cls.__name__, cls.__name__.lower(), snake_case(cls.__name__), default_name(cls)}


def register(cls: type[T]) -> type[T]:
    """Class decorator: Keras-serialisable under ``ce_retrieval>ClassName`` and selectable by every name of
    :func:`aliases`. A name already taken by another class raises ``ValueError``."""
    names = aliases(cls)
    for alias in names:
        taken = _LOSSES.get(alias)
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"register: the loss name {alias!r} is already taken by {taken.__module__}.{taken.__qualname__}"
            )
    cls = tf_keras.utils.register_keras_serializable(package="ce_retrieval")(cls)
    for alias in names:
        _LOSSES[alias] = cls
    return cls


def unregister(cls) -> None:
    """Undoes :func:`register` (names and Keras serialisation), e.g. for a test's toy loss."""
    for alias in [name for name, registered in _LOSSES.items() if registered is cls]:
        del _LOSSES[alias]
    key = f"ce_retrieval>{cls.__name__}"
    if tf_keras.utils.get_custom_objects().get(key) is cls:
        del tf_keras.utils.get_custom_objects()[key]


def get(identifier: str | dict | tf_keras.losses.Loss, **kwargs) -> tf_keras.losses.Loss:
    """A loss instance from a class name (``'CrossExampleSoftmax'``, ``'cross_example_softmax'``), a config
    dict ``{'class_name': ..., 'config': {...}}``, or an instance (returned as is)."""
    if isinstance(identifier, tf_keras.losses.Loss):
        return identifier
    if isinstance(identifier, dict):
        cls = _lookup(identifier["class_name"])
        return cls.from_config({**identifier.get("config", {}), **kwargs})
    return _lookup(identifier)(**kwargs)


def available() -> list[str]:
    """The class names of every registered loss, sorted."""
    return sorted({cls.__name__ for cls in _LOSSES.values()})


def lookup(name: str) -> type:
    """The registered loss class for ``name`` (class name or alias); ``ValueError`` listing the names if unknown."""
    return _lookup(name)


def _lookup(name: str):
    import ce_retrieval.losses  # noqa: F401  (imports every family so they register)

    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(available())}")
    return _LOSSES[name]


__all__ = ["aliases", "available", "default_name", "get", "lookup", "register", "snake_case", "unregister"]

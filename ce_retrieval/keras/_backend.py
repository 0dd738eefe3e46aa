"""The one backend check of :mod:`ce_retrieval.keras`: the losses run TensorFlow code, so Keras 3 must run on it."""

from __future__ import annotations

import keras


def require_tensorflow_backend(owner: str) -> None:
    """Raises ``RuntimeError`` naming ``owner`` and the active backend unless Keras 3 runs on TensorFlow."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"{owner}: ce_retrieval's Keras 3 losses compute with TensorFlow ops and need the 'tensorflow' Keras "
            f"backend, but Keras runs on {backend!r}; set KERAS_BACKEND=tensorflow before importing keras"
        )

"""Helpers for the objective tests that compare an objective with the float64 references: the ids of the batch
(rows with two positives), unit embeddings, the value and gradients of one objective, and a float64 comparison.

A uniquely named module (imported as ``objective_fixtures``, as tests/modeling's ``modeling_fixtures``).
"""

import numpy as np
import tensorflow as tf

IDS = tf.constant([0, 0, 1, 2, 3, 4, 5, 5], tf.int64)  # two captions of images 0 and 5


def embeddings(seed=0, n=8, d=6):
    """``(text, image)``: float32 ``[n, d]`` unit rows."""
    rng = np.random.default_rng(seed)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    return tf.constant(unit(rng.normal(size=(n, d)))), tf.constant(unit(rng.normal(size=(n, d))))


def value_and_grads(objective, text, image, variables=()):
    """The objective's share on ``IDS`` and its gradients in ``text``, ``image`` and ``variables``."""
    with tf.GradientTape() as tape:
        tape.watch([text, image])
        value = objective(text, image, IDS).share
    return value, tape.gradient(value, [text, image, *variables])


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)

"""ce_retrieval.utils.seeding, the one seeding point: after ``seed_everything(s)`` an unseeded tf_keras layer, Python's
``random``, NumPy, TensorFlow's ops and its global Generator draw the same numbers whatever ran before."""

import random
import sys
import types

import numpy as np
import tensorflow as tf
import tf_keras
from tensorflow.python.framework import config as tf_config

from ce_retrieval.utils.seeding import seed_everything


def _draws(seed: int, deterministic: bool = True) -> list[np.ndarray]:
    random.seed()  # whatever state an earlier run left (the OS seeds Python's random)
    np.random.seed(None)
    seed_everything(seed, deterministic=deterministic)
    layer = tf_keras.layers.Dense(3)  # no seed: tf_keras draws one from the generator seed_everything set
    layer.build((None, 4))
    return [
        layer.kernel.numpy(),
        np.asarray([random.random() for _ in range(3)]),
        np.random.rand(3),
        tf.random.uniform([3]).numpy(),
        tf.random.get_global_generator().normal([3]).numpy(),
    ]


def test_the_same_seed_draws_the_same_weights_and_numbers():
    first, second = _draws(7), _draws(7)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    other = _draws(8)
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_op_determinism_only_where_asked():
    seed_everything(0, deterministic=False)
    assert not tf_config.is_op_determinism_enabled()
    seed_everything(0)
    assert tf_config.is_op_determinism_enabled()  # switched off again after the test (conftest)


def test_keras_3_is_seeded_when_imported_and_not_imported_otherwise(monkeypatch):
    seeds = []
    fake = types.SimpleNamespace(utils=types.SimpleNamespace(set_random_seed=seeds.append))
    monkeypatch.setitem(sys.modules, "keras", fake)
    seed_everything(5, deterministic=False)
    assert seeds == [5]
    monkeypatch.delitem(sys.modules, "keras")
    seed_everything(5, deterministic=False)
    assert "keras" not in sys.modules

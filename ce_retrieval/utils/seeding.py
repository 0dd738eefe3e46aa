"""One seeding point for every entry (commands, training, benchmarks): same seed, same weights, same figures.

Call :func:`seed_everything` before any layer is built. tf_keras draws the seed of an unseeded initializer from
its own seed generator when one was set (``tf_keras.utils.set_random_seed``), else from Python's ``random``, which
the OS seeds: towers built before the seed is set start from different weights in every process (issue #30: the
frozen features differed between two runs of the suite while every from-scratch figure was bit-identical).
"""

from __future__ import annotations

import sys

import tensorflow as tf
import tf_keras

__all__ = ["seed_everything"]


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seeds Python's ``random``, NumPy's global RNG, TensorFlow's global seed and tf_keras's seed generator, Keras
    3's when ``keras`` is already imported (it is not imported here), and TensorFlow's global ``tf.random.Generator``
    (keras-cv's augmentation draws from it). With ``deterministic``, also switches op determinism on (process-wide:
    ops pick deterministic kernels and tf.data keeps its order), for entries that promise bit-identical results.

    The global Generator is a variable, so TensorFlow's runtime starts here: a strategy that splits the CPU into
    logical devices (``training.prepare_process``) must be made first."""
    seed = int(seed)
    tf_keras.utils.set_random_seed(seed)  # Python, NumPy, tf.random.set_seed and tf_keras's seed generator
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "utils"):
        keras.utils.set_random_seed(seed)
    tf.random.set_global_generator(tf.random.Generator.from_seed(seed))
    if deterministic:
        tf.config.experimental.enable_op_determinism()

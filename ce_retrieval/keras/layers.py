"""A Keras 3 layer that turns two embedding sets into the similarity matrix ``S`` the losses read."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="ce_retrieval")
class SimilarityMatrix(keras.layers.Layer):
    """``S = normalize(a) · normalize(b)ᵀ``: the ``[N, M]`` cosine matrix of embeddings ``a [N, d]``, ``b [M, d]``.

    Called on ``[a, b]``; ``[e, e]`` gives the Gram matrix of one embedding set. ``normalize=False`` keeps raw dot
    products. The layer computes in float32 by default (``dtype="float32"``), so under a mixed-precision policy
    the towers may run in half precision while ``S`` does not (docs/losses.md, "Precision"). Any Keras backend.

    Args:
      normalize: L2-normalise both inputs along the last axis first (default True: cosine similarities).
      epsilon: lower bound of the norm in the normalisation (a zero vector maps to zero, not NaN).
    """

    def __init__(self, normalize: bool = True, epsilon: float = 1e-12, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.normalize = bool(normalize)
        self.epsilon = float(epsilon)

    def call(self, inputs: tuple) -> object:
        queries, documents = inputs
        if self.normalize:
            queries = ops.normalize(queries, axis=-1, epsilon=self.epsilon)
            documents = ops.normalize(documents, axis=-1, epsilon=self.epsilon)
        return ops.matmul(queries, ops.transpose(documents))

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        queries, documents = input_shape
        return (queries[0], documents[0])

    def get_config(self) -> dict:
        return {**super().get_config(), "normalize": self.normalize, "epsilon": self.epsilon}

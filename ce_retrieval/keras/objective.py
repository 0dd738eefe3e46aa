"""The retrieval objective (:class:`ce_retrieval.objective.RetrievalObjective`) as a Keras 3 layer.

``RetrievalObjectiveLayer(loss="CrossExampleSoftmax")([queries, documents, ids])`` takes this replica's two
embedding sets and their ids (``[queries, documents, query_ids, doc_ids]`` for unpaired rows), normalises them
(``normalize=True``), and adds the loss to the model with ``add_loss`` — the same object, paths and λ as the
two-tower model's step: gather across replicas, dense / tiled (``tile_size``) / sharded (``partition``), learned
λ (``learn_logit_scale``: a Keras 3 weight ``log_logit_scale`` of this layer, capped at ``max_logit_scale``) and
SigLIP's b (``logit_bias``, ``learn_logit_bias``: the weight ``logit_bias``). It
returns the logged loss (``L``; sharded: ``R·share_r``) and adds this replica's share (``L / R`` or ``share_r``),
which Keras sums over replicas. So a Keras 3 two-tower model is ``towers -> this layer``, compiled without a
``loss``. The loss is any registered ce_retrieval loss by name, with ``loss_kwargs`` (its hyper-parameters except
λ and b, which are ``logit_scale`` and ``logit_bias``). Needs the TensorFlow backend.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from ce_retrieval import losses as _losses
from ce_retrieval.keras._backend import require_tensorflow_backend
from ce_retrieval.objective import LogitBias, LogitScale, RetrievalObjective
from ce_retrieval.objective.logit_scale import DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE


@keras.saving.register_keras_serializable(package="ce_retrieval")
class RetrievalObjectiveLayer(keras.layers.Layer):
    """Embeddings and ids -> the retrieval loss, added with ``add_loss`` (module docstring).

    Args:
      loss: a registered loss name (``ce_retrieval.losses.available()``).
      loss_kwargs: its hyper-parameters except λ.
      logit_scale, learn_logit_scale, max_logit_scale: λ (fixed, or learned as log λ, capped).
      logit_bias, learn_logit_bias: b of ``λ·S + b`` for a loss with a bias (SigLIP: -10; None: no bias).
      partition: ``"replicated"`` or ``"sharded"``; tile_size: ``0`` (dense), T or ``"auto"``.
      normalize: L2-normalise both embedding sets first (cosine similarities).
    """

    def __init__(
        self,
        loss: str = "CrossExampleSoftmax",
        loss_kwargs: dict | None = None,
        logit_scale: float = DEFAULT_LOGIT_SCALE,
        learn_logit_scale: bool = False,
        max_logit_scale: float = DEFAULT_MAX_LOGIT_SCALE,
        partition: str = "replicated",
        tile_size: int | str = 0,
        normalize: bool = True,
        logit_bias: float | None = None,
        learn_logit_bias: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        require_tensorflow_backend(type(self).__name__)
        self.loss_name, self.loss_kwargs = loss, dict(loss_kwargs or {})
        self.learn_logit_scale, self.normalize = bool(learn_logit_scale), bool(normalize)
        self.logit_scale_initial, self.max_logit_scale = float(logit_scale), float(max_logit_scale)
        self.partition, self.tile_size = partition, tile_size
        self.logit_bias_initial, self.learn_logit_bias = logit_bias, bool(learn_logit_bias)
        cls = _losses.lookup(loss)
        loss_kwargs = {**self.loss_kwargs, **cls.logit_scale_kwargs(logit_scale)}  # λ₀ and b₀: the objective
        if logit_bias is not None:  # gives the loss their current values at every call
            loss_kwargs.update(cls.logit_bias_kwargs(logit_bias))
        variable = None
        if self.learn_logit_scale:
            variable = self.add_weight(
                name="log_logit_scale",
                shape=(),
                initializer=keras.initializers.Constant(math.log(logit_scale)),
                trainable=True,
            )
        scale = LogitScale(logit_scale, self.learn_logit_scale, max_logit_scale, variable)
        bias = None
        if logit_bias is not None:
            bias_variable = None
            if self.learn_logit_bias:
                bias_variable = self.add_weight(
                    name="logit_bias", shape=(), initializer=keras.initializers.Constant(logit_bias), trainable=True
                )
            bias = LogitBias(logit_bias, self.learn_logit_bias, bias_variable)
        self.objective = RetrievalObjective(
            cls(**loss_kwargs),
            scale,
            partition=partition,
            tile_size=tile_size,
            logit_bias=bias,
            learn_logit_bias=self.learn_logit_bias,
        )

    def call(self, inputs: list) -> tf.Tensor:
        if len(inputs) not in (3, 4):
            raise ValueError(
                "RetrievalObjectiveLayer is called on [queries, documents, ids] or [queries, documents, query_ids, "
                f"doc_ids], got {len(inputs)} inputs"
            )
        queries, documents, query_ids = inputs[:3]
        doc_ids = inputs[3] if len(inputs) == 4 else None
        if self.normalize:
            queries, documents = tf.math.l2_normalize(queries, -1), tf.math.l2_normalize(documents, -1)
        query_ids = tf.reshape(tf.cast(query_ids, tf.int64), [-1])
        doc_ids = None if doc_ids is None else tf.reshape(tf.cast(doc_ids, tf.int64), [-1])
        result = self.objective(queries, documents, query_ids, doc_ids)
        self.add_loss(result.share)
        return result.loss

    @property
    def logit_scale(self) -> tf.Tensor:
        """λ (the learned value, capped, if ``learn_logit_scale``)."""
        return self.objective.logit_scale()

    @property
    def logit_bias(self) -> tf.Tensor | None:
        """b (the learned value if ``learn_logit_bias``), or None without a bias."""
        return None if self.objective.logit_bias is None else self.objective.logit_bias()

    def compute_output_shape(self, input_shape) -> tuple:
        return ()

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "loss": self.loss_name,
            "loss_kwargs": self.loss_kwargs,
            "logit_scale": self.logit_scale_initial,
            "learn_logit_scale": self.learn_logit_scale,
            "max_logit_scale": self.max_logit_scale,
            "partition": self.partition,
            "tile_size": self.tile_size,
            "normalize": self.normalize,
            "logit_bias": self.logit_bias_initial,
            "learn_logit_bias": self.learn_logit_bias,
        }


__all__ = ["RetrievalObjectiveLayer"]

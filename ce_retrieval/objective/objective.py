"""The retrieval objective: this replica's query and document embeddings (with ids) -> the scalar the step
differentiates. One object owns every step between the towers and the optimizer (TF Recommenders' ``Retrieval``):

    Q_r, D_r, ids_r   (this replica's rows, [n, d])
      -> gather          D = concat_r D_r, ids = concat_r ids_r   (and Q likewise unless sharded)
      -> similarity      S = Q Dᵀ (cosine of unit vectors); the joint Gram [Q; D][Q; D]ᵀ for a ``needs_gram`` loss
      -> relevance       R_ij = 1[id_i == id_j]                   (from ids; on the tiled paths never materialised)
      -> λ, b            the loss is given S (cosines) and the current λ and b (:class:`LogitScale`,
                         :class:`LogitBias`): ``logit_scale=``, ``logit_bias=`` of every loss path, a number when
                         fixed and a tensor when learned; the loss applies them (``losses/base.py``, "λ and b at
                         call"); regularisers w·reg(R, S) on the text × image cosines
      -> path            dense | tiled | sharded | sharded + tiled (``paths.py``; chosen by the config)
      -> loss L, and the replica's share: L / R (replicated) or share_r with Σ_r share_r = L (sharded)

Each replica differentiates its ``share``; Keras sums the replicas' gradients and the gathers' gradients sum the
replicas' upstreams, so one step under R replicas is exactly one step of ``dL/dθ`` on the global batch, on every
path (tests/objective). ``loss`` is what a step logs: L (replicated) or R·share_r (sharded; its mean over replicas
is L). The model's train and test steps, the gradient cache (``modeling/grad_cache.py``) and a user's own loop
all call it; the Keras 3 layer (``ce_retrieval.keras.RetrievalObjectiveLayer``) wraps it.

Paths and their memory (B global rows, R replicas, T tile width, d embedding width):

* dense replicated: ``[B, B]`` on every replica (every registered loss);
* tiled (``loss_tile_size``): O(B·T + B·d) per replica, the exact column-tiled softmax family (``kernels/tiled.py``);
* sharded (``loss_partition: sharded``): ``[B/R, B]`` per replica (``kernels/sharded.py``), the softmax family
  including the margin softmaxes; ``bidirectional`` is both directions' shares averaged (each replica's text rows
  against the gathered images, and its image rows against the gathered texts);
* sharded + tiled: O(B/R·T + B·d) per replica; the cross-example partition function and the mining histograms
  are combined across replicas as in the sharded path.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf
import tf_keras

from ce_retrieval.losses.relevance import relevance_from_ids
from ce_retrieval.objective import batch_metrics, paths
from ce_retrieval.objective.logit_bias import LogitBias
from ce_retrieval.objective.logit_scale import DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE, LogitScale
from ce_retrieval.utils.replicas import gather_from_replicas, num_replicas, replica_offset


class ObjectiveResult(NamedTuple):
    """One evaluation of the objective on a replica (module docstring)."""

    loss: tf.Tensor  # the logged loss: L (replicated) or R·share_r (sharded)
    share: tf.Tensor  # what this replica differentiates: L / R, or share_r
    recall_at_1: tf.Tensor  # in-batch recall@1 of the rows this replica computed
    has_positive: tf.Tensor  # bool: the rows have a positive pair


class RetrievalObjective:
    """From this replica's embeddings and ids to the loss and the replica's share of it (module docstring).

    Args:
      loss: a Keras loss on ``(relevance, S)``, normally a :class:`ce_retrieval.losses.RetrievalLoss`; a loss with
        a logit scale (bias) is given the current λ (b) at every call, which replaces its own; a fixed λ (b) must
        equal the loss's (``tasks.build_loss`` builds it with λ₀ and b₀, learned or not).
      logit_scale: λ₀, or a :class:`LogitScale` (e.g. one whose variable a model tracks).
      learn_logit_scale, max_logit_scale: learn ``log λ``, capped at λ_max (with a number ``logit_scale``).
      partition: ``"replicated"`` or ``"sharded"`` (``paths.LOSS_PARTITIONS``).
      tile_size: ``0`` (dense), a positive tile width, or ``"auto"``.
      logit_bias, learn_logit_bias: b of ``l = λ·S + b`` for a loss that declares one (SigLIP; ``None``: no
        bias), or a :class:`LogitBias`.
      regularizers: ``[(weight, loss)]`` added as ``Σ w·reg(R, S)`` on the text × image cosine matrix, before λ
        and b (Threshold-Consistent Margin's margins are cosines); on the paths each regulariser declares.
    """

    def __init__(
        self,
        loss,
        logit_scale: float | LogitScale = DEFAULT_LOGIT_SCALE,
        learn_logit_scale: bool = False,
        max_logit_scale: float = DEFAULT_MAX_LOGIT_SCALE,
        partition: str = "replicated",
        tile_size: int | str = 0,
        logit_bias: float | LogitBias | None = None,
        learn_logit_bias: bool = False,
        regularizers=(),
    ):
        if not isinstance(logit_scale, LogitScale):
            logit_scale = LogitScale(logit_scale, learn_logit_scale, max_logit_scale)
        if logit_bias is None and learn_logit_bias:
            raise ValueError("learn_logit_bias=True needs logit_bias, the initial value of b (SigLIP: -10)")
        if logit_bias is not None and not isinstance(logit_bias, LogitBias):
            logit_bias = LogitBias(logit_bias, learn_logit_bias)
        self.logit_scale, self.logit_bias = logit_scale, logit_bias
        self.loss = _check_loss(loss, logit_scale, logit_bias)
        self.regularizers = _check_regularizers(regularizers)
        self.partition = paths.check_partition(partition)
        self.tile_size = paths.check_tile_size(tile_size)
        paths.check_combination(loss, self.partition, self.tile_size, self.regularizers)
        self.needs_gram = paths.capability(loss, "needs_gram")
        #: the :class:`~ce_retrieval.objective.paths.LossPath` of the last call (set when a step is traced), so a
        #: caller can check which path a compiled step took; None before any call.
        self.last_path: paths.LossPath | None = None

    def loss_scalars(self) -> dict:
        """λ and b as the loss is given them at every call (``logit_scale=``, ``logit_bias=``; a number when fixed,
        the float32 tensor when learned), for a loss that has them; {} for one that has neither."""
        scalars = {}
        if getattr(self.loss, "logit_scale", None) is not None:
            scalars["logit_scale"] = self.logit_scale.given()
        if self.logit_bias is not None:
            scalars["logit_bias"] = self.logit_bias.given()
        return scalars

    @property
    def trainable_variables(self) -> list:
        """The objective's own learned scalars (λ, b if learned); the towers' variables are the model's."""
        bias = self.logit_bias.trainable_variables if self.logit_bias is not None else []
        return list(self.logit_scale.trainable_variables) + bias

    def tile_for(self, num_rows: int | None) -> int:
        """The tile width used for a global batch of ``num_rows`` (0: dense; ``auto`` stays dense when a
        regulariser has no tiled path)."""
        untiled = [t for _, t in self.regularizers if not paths.capability(t, "supports_tiled")]
        if self.tile_size == paths.AUTO and untiled:
            return 0
        return paths.resolve_tile_size(self.tile_size, self.loss, num_rows)

    def path(self, num_rows: int | None) -> paths.LossPath:
        """The path a call takes for a global batch of ``num_rows`` (partition and tile width)."""
        return paths.LossPath(self.partition, self.tile_for(num_rows), num_rows)

    def regularization(self, relevance, cosine) -> tf.Tensor:
        """``Σ w · reg(R, cos)`` of the regularisers on the text × image cosines, before λ and b (0 without any)."""
        terms = []
        for weight, term in self.regularizers:
            with tf.name_scope(term.name):
                terms.append(weight * tf.cast(term.call(relevance, cosine), tf.float32))
        return tf.add_n(terms) if terms else tf.constant(0.0, tf.float32)

    def __call__(self, query_emb, doc_emb, query_ids, doc_ids=None) -> ObjectiveResult:
        """This replica's ``query_emb [n, d]``, ``doc_emb [m, d]`` and ids (``doc_ids`` None: the rows are pairs,
        ``query_ids`` for both) -> :class:`ObjectiveResult`."""
        paired = doc_ids is None
        doc_ids = query_ids if paired else doc_ids
        if self.needs_gram and not paired:
            raise ValueError(f"{type(self.loss).__name__} needs the joint Gram matrix of paired rows: pass no doc_ids")
        replicas = num_replicas()
        rows = query_emb.shape[0]
        self.last_path = self.path(None if rows is None else rows * replicas)
        tile = self.last_path.tile
        with tf.name_scope(getattr(self.loss, "name", None) or "objective"):
            if self.partition == "sharded":
                value, recall, positive = self._sharded(query_emb, doc_emb, query_ids, doc_ids, tile)
                return ObjectiveResult(value * float(replicas), value, recall, positive)
            value, recall, positive = self._replicated(query_emb, doc_emb, query_ids, doc_ids, tile, paired)
            return ObjectiveResult(value, value / float(replicas), recall, positive)

    # ---- replicated: every replica computes L of the global batch ------------------------------------------------

    def _replicated(self, query_emb, doc_emb, query_ids, doc_ids, tile, paired):
        offset = replica_offset(query_emb)  # this replica's first row: the same for paired documents
        queries = gather_from_replicas(query_emb, offset)
        docs = gather_from_replicas(doc_emb, offset if paired else None)
        q_ids, d_ids = gather_from_replicas(query_ids), gather_from_replicas(doc_ids)
        positive = batch_metrics.has_positive(q_ids, d_ids)
        if tile:
            value = self._both_ways(
                lambda q, d, qi, di: self._tiled(q, d, qi, di, tile, False), queries, docs, q_ids, d_ids
            )
            return value, batch_metrics.recall_at_1_tiled(queries, docs, q_ids, d_ids, tile), positive
        cosine = _cosine(queries, docs)
        relevance = relevance_from_ids(q_ids, d_ids)
        if self.needs_gram:  # one embedding set [Q; D]: S = E Eᵀ, self-pairs ignored
            joint, joint_ids = tf.concat([queries, docs], 0), tf.concat([q_ids, d_ids], 0)
            loss_relevance = relevance_from_ids(joint_ids, joint_ids, exclude_self=True)
            loss_scores = _cosine(joint, joint)
        else:
            loss_relevance, loss_scores = relevance, cosine
        # unreduced: the share is ours
        value = self.loss.call(loss_relevance, loss_scores, **self.loss_scalars())
        if self.regularizers:  # dense replicated only (paths.check_combination)
            value += self.regularization(relevance, cosine)
        return value, batch_metrics.recall_at_1_dense(cosine, relevance), positive

    # ---- sharded: replica r computes its rows' share -------------------------------------------------------------

    def _sharded(self, query_emb, doc_emb, query_ids, doc_ids, tile):
        docs, d_ids = gather_from_replicas(doc_emb), gather_from_replicas(doc_ids)
        positive = batch_metrics.has_positive(query_ids, d_ids)
        if tile:
            value = self._tiled(query_emb, docs, query_ids, d_ids, tile, True)
            recall = batch_metrics.recall_at_1_tiled(query_emb, docs, query_ids, d_ids, tile)
        else:
            cosine = _cosine(query_emb, docs)
            relevance = relevance_from_ids(query_ids, d_ids)
            value = self.loss.sharded_share(relevance, cosine, **self.loss_scalars())
            recall = batch_metrics.recall_at_1_dense(cosine, relevance)
        if getattr(self.loss, "bidirectional", False):  # this replica's document rows against every query
            queries, q_ids = gather_from_replicas(query_emb), gather_from_replicas(query_ids)
            if tile:
                backward = self._tiled(doc_emb, queries, doc_ids, q_ids, tile, True)
            else:
                scores = _cosine(doc_emb, queries)
                backward = self.loss.sharded_share(relevance_from_ids(doc_ids, q_ids), scores, **self.loss_scalars())
            value = 0.5 * (value + backward)
        return value, recall, positive

    # ---- pieces --------------------------------------------------------------------------------------------------

    def _both_ways(self, one_way, queries, docs, q_ids, d_ids):
        value = one_way(queries, docs, q_ids, d_ids)
        if getattr(self.loss, "bidirectional", False):
            value = 0.5 * (value + one_way(docs, queries, d_ids, q_ids))
        return value

    def _tiled(self, queries, docs, q_ids, d_ids, tile, across_replicas):
        """One direction by the tiled path (the loss folds a learned λ and b into the embeddings)."""
        return self.loss.tiled_loss(
            queries, docs, q_ids, d_ids, tile, across_replicas=across_replicas, **self.loss_scalars()
        )


def _cosine(a, b):
    """float32 ``a bᵀ`` (cosine similarities of unit rows)."""
    return tf.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32), transpose_b=True)


def _check_loss(loss, logit_scale: LogitScale, logit_bias: LogitBias | None):
    """The loss, if it is a Keras loss whose λ and b (``logit_scale``, ``logit_bias`` of a ce_retrieval loss) fit
    ``logit_scale`` and ``logit_bias``."""
    if isinstance(loss, (str, dict)):
        raise TypeError(
            f"RetrievalObjective: pass a loss instance (got {loss!r}); ce_retrieval.tasks.build_loss or "
            "RetrievalTask builds one from a config with the model's λ"
        )
    if not isinstance(loss, tf_keras.losses.Loss):
        raise TypeError(f"RetrievalObjective: loss must be a Keras Loss, got {loss!r}")
    scale = getattr(loss, "logit_scale", None)  # None: a loss without a logit scale (or a plain Keras loss)
    name = type(loss).__name__
    if logit_scale.learn and scale is None:
        raise ValueError(
            f"learn_logit_scale=True gives the loss a learned λ, which only a loss with a logit scale uses; "
            f"{name} has none"
        )
    # a learned λ replaces the loss's own at every call; a fixed one must be the loss's (no silent replacement)
    mismatch = scale is not None and abs(float(scale) - logit_scale.initial) > 1e-6 * max(1.0, logit_scale.initial)
    if mismatch and not logit_scale.learn:
        raise ValueError(
            f"logit scale mismatch: the model's logit_scale is {logit_scale.initial:g} but the loss "
            f"{name} has λ = {scale:g}; set both to the same λ₀ (RetrievalTask does)"
        )
    _check_logit_bias(loss, logit_bias)
    return loss


def _check_logit_bias(loss, logit_bias: LogitBias | None) -> None:
    """The loss's b (``logit_bias`` of ce_retrieval losses; None: no bias) must fit the objective's."""
    bias = getattr(loss, "logit_bias", None)
    name = type(loss).__name__
    if logit_bias is None:
        if bias is not None:
            raise ValueError(
                f"{name} adds a logit bias b = {bias:g}, but the model has none: give the model logit_bias "
                "(config model.logit_bias), the one home of b, so that it is exported with λ"
            )
        return
    if bias is None:
        raise ValueError(
            f"the model has a logit bias (logit_bias={logit_bias.initial:g}) but {name} has none; "
            "a logit bias is only for a loss that declares one (has_logit_bias, e.g. SigmoidLoss)"
        )
    want = logit_bias.initial
    if not logit_bias.learn and abs(float(bias) - want) > 1e-6:
        raise ValueError(
            f"logit bias mismatch: {name} has b = {bias:g} but the model's logit_bias (b₀) is {want:g}; "
            "set both to the same b₀ (RetrievalTask does)"
        )


def _check_regularizers(regularizers) -> tuple:
    """``regularizers`` as a tuple of ``(weight >= 0, Keras loss)``."""
    regularizers = tuple((float(weight), term) for weight, term in (regularizers or ()))
    for weight, term in regularizers:
        if not isinstance(term, tf_keras.losses.Loss) or not weight >= 0:
            raise TypeError(f"regularizers must be (weight >= 0, Keras loss) pairs, got ({weight!r}, {term!r})")
    return regularizers


__all__ = ["ObjectiveResult", "RetrievalObjective"]

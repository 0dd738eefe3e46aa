"""The retrieval objective: this replica's query and document embeddings (with ids) -> the scalar the step
differentiates. One object owns every step between the towers and the optimizer (TF Recommenders' ``Retrieval``):

    Q_r, D_r, ids_r   (this replica's rows, [n, d])
      -> gather          D = concat_r D_r, ids = concat_r ids_r   (and Q likewise unless sharded)
      -> similarity      S = Q Dᵀ (cosine of unit vectors); the joint Gram [Q; D][Q; D]ᵀ for a ``needs_gram`` loss
      -> relevance       R_ij = 1[id_i == id_j]                   (from ids; on the tiled paths never materialised)
      -> λ, b            S·λ (+ b) when λ or b is learned (:class:`LogitScale`, :class:`LogitBias`); a fixed
                         λ (and b) is the loss's own; a loss that ``needs_cosine`` (the margin softmaxes' λ·ψ(S),
                         NCA) is given S and the learned λ as a tensor instead; regularisers w·reg(R, S) on the
                         text × image cosines
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
from ce_retrieval.utils.replicas import gather_from_replicas, num_replicas


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
        a logit scale carries λ₀ when λ is fixed, or λ = 1 when it is learned (``tasks.build_loss`` does both).
      logit_scale: λ₀, or a :class:`LogitScale` (e.g. one whose variable a model tracks).
      learn_logit_scale, max_logit_scale: learn ``log λ``, capped at λ_max (with a number ``logit_scale``).
      partition: ``"replicated"`` or ``"sharded"`` (``paths.LOSS_PARTITIONS``).
      tile_size: ``0`` (dense), a positive tile width, or ``"auto"``.
      logit_bias, learn_logit_bias: b of ``l = λ·S + b`` for a loss that declares one (SigLIP; ``None``: no
        bias), or a :class:`LogitBias`; learned, the objective applies λ and b itself and the loss has λ = 1, b = 0.
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

    @property
    def learns_bias(self) -> bool:
        return self.logit_bias is not None and self.logit_bias.learn

    @property
    def applies_scale(self) -> bool:
        """Whether the objective turns S into logits itself (λ learned, or b learned: b is added after λ)."""
        return self.logit_scale.learn or self.learns_bias

    @property
    def passes_scale(self) -> bool:
        """Whether the loss is given S and λ apart (a learned λ, to a loss that ``needs_cosine``: its margin, or
        NCA's clamped distance, acts on cosines, and it applies λ after that)."""
        return self.applies_scale and paths.capability(self.loss, "needs_cosine")

    def loss_kwargs(self) -> dict:
        """``{"logit_scale": λ}`` where the loss is given λ apart (:attr:`passes_scale`), else ``{}``."""
        return {"logit_scale": self.logit_scale()} if self.passes_scale else {}

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

    def loss_scores(self, scores: tf.Tensor) -> tf.Tensor:
        """What the loss is given: ``λ·S`` (+ ``b`` when b is learned) where the objective applies λ to S, else ``S``
        (λ fixed, or given apart: :attr:`passes_scale`)."""
        if self.applies_scale and not self.passes_scale:
            scores = scores * self.logit_scale()
        if self.learns_bias:
            scores = scores + self.logit_bias()
        return scores

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
            value, recall, positive = self._replicated(query_emb, doc_emb, query_ids, doc_ids, tile)
            return ObjectiveResult(value, value / float(replicas), recall, positive)

    # ---- replicated: every replica computes L of the global batch ------------------------------------------------

    def _replicated(self, query_emb, doc_emb, query_ids, doc_ids, tile):
        queries, docs = gather_from_replicas(query_emb), gather_from_replicas(doc_emb)
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
        value = self.loss.call(loss_relevance, self.loss_scores(loss_scores), **self.loss_kwargs())
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
            value = self.loss.sharded_share(relevance, self.loss_scores(cosine), **self.loss_kwargs())
            recall = batch_metrics.recall_at_1_dense(cosine, relevance)
        if getattr(self.loss, "bidirectional", False):  # this replica's document rows against every query
            queries, q_ids = gather_from_replicas(query_emb), gather_from_replicas(query_ids)
            if tile:
                backward = self._tiled(doc_emb, queries, doc_ids, q_ids, tile, True)
            else:
                scores = self.loss_scores(_cosine(doc_emb, queries))
                backward = self.loss.sharded_share(relevance_from_ids(doc_ids, q_ids), scores, **self.loss_kwargs())
            value = 0.5 * (value + backward)
        return value, recall, positive

    # ---- pieces --------------------------------------------------------------------------------------------------

    def _both_ways(self, one_way, queries, docs, q_ids, d_ids):
        value = one_way(queries, docs, q_ids, d_ids)
        if getattr(self.loss, "bidirectional", False):
            value = 0.5 * (value + one_way(docs, queries, d_ids, q_ids))
        return value

    def _tiled(self, queries, docs, q_ids, d_ids, tile, across_replicas):
        """One direction by the tiled path; a learned λ is folded into the queries (logits λ·q·d) or given to a loss
        that ``needs_cosine``, a learned b into one more column (``[λq, b]·[d, 1] = λ q·d + b``)."""
        queries = tf.cast(queries, tf.float32)
        if self.applies_scale and not self.passes_scale:
            queries = queries * self.logit_scale()
        if self.learns_bias:
            docs = tf.cast(docs, tf.float32)
            queries = tf.concat([queries, tf.fill([tf.shape(queries)[0], 1], self.logit_bias())], 1)
            docs = tf.concat([docs, tf.ones([tf.shape(docs)[0], 1], tf.float32)], 1)
        return self.loss.tiled_loss(
            queries, docs, q_ids, d_ids, tile, across_replicas=across_replicas, **self.loss_kwargs()
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
    learns_bias = logit_bias is not None and logit_bias.learn
    if logit_scale.learn or learns_bias:
        flag = "learn_logit_scale" if logit_scale.learn else "learn_logit_bias"
        if scale is None:
            raise ValueError(
                f"{flag}=True multiplies the cosine matrix by the model's λ, which only a loss with a "
                f"logit scale expects; {name} has none"
            )
        if abs(float(scale) - 1.0) > 1e-6:
            raise ValueError(
                f"{flag}=True: the model applies λ itself, so the loss must have "
                f"λ = 1, e.g. scale=1.0 (got {name} with λ = {scale:g})"
            )
    elif scale is not None and abs(float(scale) - logit_scale.initial) > 1e-6:
        raise ValueError(
            f"logit scale mismatch: the model's logit_scale is {logit_scale.initial:g} but the loss "
            f"{name} has λ = {scale:g}; set both to the same λ (RetrievalTask does)"
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
    want = 0.0 if logit_bias.learn else logit_bias.initial
    if abs(float(bias) - want) > 1e-6:
        raise ValueError(
            f"logit bias mismatch: {name} has b = {bias:g} but needs b = {want:g} "
            + ("(the model adds its learned b itself)" if logit_bias.learn else "(the model's logit_bias)")
        )


def _check_regularizers(regularizers) -> tuple:
    """``regularizers`` as a tuple of ``(weight >= 0, Keras loss)``."""
    regularizers = tuple((float(weight), term) for weight, term in (regularizers or ()))
    for weight, term in regularizers:
        if not isinstance(term, tf_keras.losses.Loss) or not weight >= 0:
            raise TypeError(f"regularizers must be (weight >= 0, Keras loss) pairs, got ({weight!r}, {term!r})")
    return regularizers


__all__ = ["ObjectiveResult", "RetrievalObjective"]

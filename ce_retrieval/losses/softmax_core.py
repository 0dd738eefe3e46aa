"""The softmax family of Veit & Wilber (2020, §3) as one pipeline of small named steps.

Every loss of ``softmax.py`` and ``margin_softmax.py`` is, for each positive pair (i, j) with logit l_ij,

    loss_ij = -log( e^{p_ij} / (e^{p_ij} + Z) ) = softplus(log Z - p_ij),   value = mean over positive pairs

and the classes differ only in the steps that produce ``p`` and ``Z``:

1. ``positive logit``: p_ij = scale * s_ij, or a margin transform of s_ij (L-Softmax, A-Softmax, CosFace,
   ArcFace); margins touch positives only.
2. ``negative set``: ``Neg_i`` = row i's negatives (y_true == 0), "sampled" (eq. 2), or ``Neg`` = all
   negatives of the batch, "cross-example" (eq. 5). Ignored pairs (-1) are in no set and no positive.
3. ``mining`` (optional): keep the top k of the set, k = ceil(f * n) (``negative_fraction=f``) or
   k = min(top_k, n), n = size of the set (per row, or the whole batch). Eqs. (3) and (6).
4. ``log partition``: log Z = log sum_{s in set} e^{scale * s}, by log-sum-exp with max subtraction.
   With mining, sum_{topk} e^s = sum_{s > t} e^s + (k - #{s > t}) e^t with t the k-th largest (found by
   radix selection, ``fast_paths.py``, no sort); the tied entries at t share the weight
   (k - #{s > t}) / #{s == t}, which is the same value and splits the gradient evenly among the ties.
   The threshold itself carries no gradient.
5. ``softmax cross-entropy`` per positive pair and the mean over positive pairs.

A row (or batch) without negatives has Z = 0: its positive pairs contribute 0 (log 1).

:func:`softmax_loss` is the whole pipeline as a function (the functional core of every class of the family);
``positive_cosine`` is the margin of step 1 (``None``: no margin). :meth:`SoftmaxFamilyLoss.from_embeddings` runs
the same loss from embeddings and ids, tiled (``tiled.py``) at large ``N·M``, margins included.
"""

from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses._masked import mean_over_positives
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.fast_paths import top_k_weights
from ce_retrieval.losses.relevance import IRRELEVANT, relevance_from_ids

_NEG_INF = float("-inf")

#: ``from_embeddings`` takes the tiled path by itself above this many logits ``N·M`` (2^26: a 256 MiB matrix).
TILED_THRESHOLD = 2**26


def check_scale(scale, owner: str) -> float | tf.Tensor:
    """``scale`` as a float if it is a positive finite number, a scalar tensor (a learned λ, positive by
    construction) as float32, else a ``ValueError`` naming ``owner``."""
    if tf.is_tensor(scale):
        if scale.shape.rank not in (None, 0):
            raise ValueError(f"{owner}: a scale tensor must be a scalar, got shape {scale.shape}")
        return tf.cast(scale, tf.float32)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{owner}: scale must be a positive finite number, got {scale!r}")
    return float(scale)


def resolve_mining(negative_fraction, top_k, default_fraction: float | None, owner: str):
    """Validated ``(negative_fraction, top_k)``: at most one is set; the default applies when neither is."""
    if negative_fraction is not None and top_k is not None:
        raise ValueError(f"{owner}: give either negative_fraction or top_k, not both")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"{owner}: top_k must be a positive integer, got {top_k!r}")
        return None, int(top_k)
    if negative_fraction is None:
        negative_fraction = default_fraction
    if negative_fraction is not None:
        if isinstance(negative_fraction, bool) or not isinstance(negative_fraction, (int, float)):
            raise ValueError(f"{owner}: negative_fraction must be a number in (0, 1], got {negative_fraction!r}")
        if not (0.0 < float(negative_fraction) <= 1.0):
            raise ValueError(f"{owner}: negative_fraction must be in (0, 1], got {negative_fraction!r}")
        negative_fraction = float(negative_fraction)
    return negative_fraction, None


def mining_k(num_negatives: tf.Tensor, negative_fraction: float | None, top_k: int | None) -> tf.Tensor:
    """Step 3: how many negatives to keep, ``ceil(f * n)`` or ``min(top_k, n)`` (int32, shape of ``n``)."""
    n = tf.cast(num_negatives, tf.int32)
    if top_k is not None:
        return tf.minimum(n, top_k)
    # float64 so that f * n is exact for batch-wide sets of up to 2^31 negatives.
    return tf.cast(tf.math.ceil(tf.cast(n, tf.float64) * negative_fraction), tf.int32)


def negative_log_partition(logits, negatives, cross_example: bool, negative_fraction=None, top_k=None):
    """Steps 2-4: ``log Z`` over the row's (shape ``[N, 1]``) or the batch's (shape ``[1, 1]``) negatives.

    ``logits`` float32 ``[N, M]``; ``negatives`` bool ``[N, M]``. Without mining (both ``None``) every
    negative counts. Sets without negatives give ``-inf`` (Z = 0).
    """
    axis = None if cross_example else -1
    masked = tf.where(negatives, logits, _NEG_INF)
    peak = _reduce(tf.reduce_max, masked, cross_example)
    nonempty = peak > _NEG_INF
    peak = tf.stop_gradient(tf.where(nonempty, peak, 0.0))
    exp = tf.exp(masked - peak)  # 0 outside the negative set, <= 1 inside
    if negative_fraction is not None or top_k is not None:
        exp = exp * _top_k_weights(masked, negatives, axis, negative_fraction, top_k)
    total = _reduce(tf.reduce_sum, exp, cross_example)
    return tf.where(nonempty, peak + tf.math.log(tf.where(nonempty, total, 1.0)), _NEG_INF)


def _reduce(reduce_fn, x, whole_batch: bool):
    """Row reduction ``[N, 1]``, or for the whole batch ``[1, 1]`` as rows then column: XLA on CPU runs a
    reduction to a scalar on one thread but parallelises the per-row one."""
    rows = reduce_fn(x, axis=-1, keepdims=True)
    return reduce_fn(rows, axis=0, keepdims=True) if whole_batch else rows


def _top_k_weights(masked, negatives, axis, negative_fraction, top_k):
    """Weights of the top-k negatives (``fast_paths.top_k_weights``), k = ``mining_k`` of the set's size.

    ``masked`` holds the logits of the negatives and -inf elsewhere; since k <= n, the k-th largest of
    ``masked`` is the k-th largest negative and the -inf fillers never reach the top k.
    """
    count = _reduce(tf.reduce_sum, tf.cast(negatives, tf.int32), axis is None)  # [N, 1] or [1, 1]
    k = tf.minimum(mining_k(count, negative_fraction, top_k), count)
    return top_k_weights(masked, k, axis=axis)


def softmax_pair_loss(positive_logits, log_partition, relevance):
    """Step 5: mean over positive pairs of ``-log(e^p / (e^p + Z)) = softplus(log Z - p)``."""
    return mean_over_positives(tf.math.softplus(log_partition - positive_logits), relevance)


def softmax_loss(
    relevance,
    scores,
    scale: float = 20.0,
    cross_example: bool = False,
    negative_fraction: float | None = None,
    top_k: int | None = None,
    positive_cosine=None,
    owner: str = "softmax_loss",
) -> tf.Tensor:
    """The family's pipeline (module docstring), mean over positive pairs of ``softplus(log Z - p_ij)``.

    Args:
      relevance, scores: float32 ``[N, M]``.
      scale: logit scale λ (logits ``λ·S``): a number, or a scalar tensor (a learned λ).
      cross_example: ``Neg`` = every negative of the batch (eq. 5) instead of the row's (eq. 2).
      negative_fraction, top_k: mining (eqs. 3 and 6); at most one; ``None`` for both: every negative.
      positive_cosine: the margin, ``c -> margined c`` applied to the positives' similarities before ``scale``.
      owner: the name in error messages.
    """
    scale = check_scale(scale, owner)
    negative_fraction, top_k = resolve_mining(negative_fraction, top_k, None, owner)
    logits = scale * scores
    log_partition = negative_log_partition(
        logits, relevance == IRRELEVANT, bool(cross_example), negative_fraction, top_k
    )
    positive_logits = logits if positive_cosine is None else scale * positive_cosine(scores)
    return softmax_pair_loss(positive_logits, log_partition, relevance)


class SoftmaxFamilyLoss(RetrievalLoss):
    """Base of the softmax-family losses: ``scale``, negative set, optional mining; see the module docstring.

    Subclasses name their function (``softmax.py``, ``margin_softmax.py``) and fix the negative set / mining
    defaults; their constructor arguments are that function's hyper-parameters.
    """

    function = softmax_loss
    has_logit_scale = True

    #: default ``negative_fraction`` when neither it nor ``top_k`` is given (``None``: no mining).
    default_negative_fraction: float | None = None
    #: ``from_embeddings`` may run the tiled path (``tiled.py``) and a train step may shard the loss
    #: (``sharded.py``): every class of ``softmax.py`` and ``margin_softmax.py`` (a margin class's
    #: ``positive_cosine`` is both paths' margin). A subclass whose loss is not the pipeline's sets them to False,
    #: which refuses ``tile_size`` and ``loss_partition='sharded'``.
    supports_tiled: bool = True
    supports_sharded: bool = True
    #: the margin of step 1, a method ``c -> margined c`` in the margin classes; ``None``: no margin.
    positive_cosine = None

    def __init__(
        self,
        scale: float = 20.0,
        cross_example: bool = False,
        negative_fraction: float | None = None,
        top_k: int | None = None,
        bidirectional: bool = False,
        name: str | None = None,
        tile_size: int | None = None,
        **kwargs,
    ):
        super().__init__(bidirectional=bidirectional, name=name, **kwargs)
        self.scale = check_scale(scale, self.name)
        self.cross_example = bool(cross_example)
        self.negative_fraction, self.top_k = resolve_mining(
            negative_fraction, top_k, self.default_negative_fraction, self.name
        )
        if tile_size is not None:
            if not self.supports_tiled:
                raise ValueError(f"{self.name}: tile_size is not supported (no tiled path for {type(self).__name__})")
            if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
                raise ValueError(f"{self.name}: tile_size must be a positive integer, got {tile_size!r}")
        self.tile_size = tile_size

    def function_kwargs(self) -> dict:
        kwargs = super().function_kwargs()
        kwargs.pop("tile_size", None)  # a choice of path (``from_embeddings``), not a hyper-parameter of S's loss
        return kwargs

    def get_config(self) -> dict:
        """The base config, plus ``tile_size`` when set (a keyword every family class accepts)."""
        config = super().get_config()
        if self.tile_size is not None:
            config["tile_size"] = self.tile_size
        return config

    def from_embeddings(self, query_emb, doc_emb, query_ids, doc_ids, ignore_negative_ids: bool = False) -> tf.Tensor:
        """The loss of ``S = Q Dᵀ`` with relevance from ids (positive iff equal ids), from the embeddings.

        Runs the exact tiled path (``tiled.py``: no ``[N, M]`` matrix, memory O(N·T + (N + M)·d)) when the class
        ``supports_tiled`` and ``tile_size`` is set or ``N·M`` is statically above ``TILED_THRESHOLD``; otherwise
        the dense path ``self(R, Q Dᵀ)`` with its input checks. Both give the same value and gradients (to
        float32 rounding). Embeddings are used as given (normalise them for cosine logits); integer ids;
        ``ignore_negative_ids``: pairs with a negative id on either side are ignored (R = -1, e.g. padding).
        """
        query_emb, doc_emb = tf.convert_to_tensor(query_emb), tf.convert_to_tensor(doc_emb)
        entries = query_emb.shape[0] * doc_emb.shape[0] if query_emb.shape[0] and doc_emb.shape[0] else None
        if not self.supports_tiled or (self.tile_size is None and (entries is None or entries <= TILED_THRESHOLD)):
            relevance = relevance_from_ids(query_ids, doc_ids)
            if ignore_negative_ids:
                ignored = (tf.convert_to_tensor(query_ids)[:, None] < 0) | (tf.convert_to_tensor(doc_ids)[None, :] < 0)
                relevance = tf.where(ignored, -1.0, relevance)
            scores = tf.matmul(tf.cast(query_emb, tf.float32), tf.cast(doc_emb, tf.float32), transpose_b=True)
            return self(relevance, scores)

        def one_way(queries, docs, q_ids, d_ids):
            return self.tiled_loss(queries, docs, q_ids, d_ids, self.tile_size, ignore_negative_ids)

        value = one_way(query_emb, doc_emb, query_ids, doc_ids)
        if self.bidirectional:
            value = 0.5 * (value + one_way(doc_emb, query_emb, doc_ids, query_ids))
        return value

    def tiled_loss(
        self,
        query_emb,
        doc_emb,
        query_ids,
        doc_ids,
        tile_size: int | None = None,
        ignore_negative_ids: bool = False,
        across_replicas: bool = False,
        logit_scale=None,
    ) -> tf.Tensor:
        """One direction (queries -> documents) of this loss by the tiled path, ``tiled.tiled_softmax_loss`` with
        this instance's hyper-parameters (``bidirectional`` is the caller's: swap the arguments for the other).
        ``across_replicas``: this replica's share of the loss of every replica's rows (sharded + tiled);
        ``logit_scale``: a λ tensor instead of this instance's λ (a loss that ``needs_cosine``, as in :meth:`call`)."""
        from ce_retrieval.losses import tiled  # noqa: PLC0415  (tiled imports this module)

        return tiled.tiled_softmax_loss(
            query_emb,
            doc_emb,
            query_ids,
            doc_ids,
            self._scale_for(logit_scale),
            self.cross_example,
            self.negative_fraction,
            self.top_k,
            tile_size=tile_size,
            ignore_negative_ids=ignore_negative_ids,
            positive_cosine=self.positive_cosine,
            across_replicas=across_replicas,
            owner=self.name,
        )

    def sharded_share(self, relevance_local, scores_local, logit_scale=None) -> tf.Tensor:
        """One direction of this replica's share of the loss (``sharded.sharded_softmax_loss``): its rows
        ``[n, M]`` against every replica's documents; the shares of all replicas sum to the loss.
        ``logit_scale``: a λ tensor instead of this instance's λ (a loss that ``needs_cosine``, as in :meth:`call`)."""
        from ce_retrieval.losses.sharded import sharded_softmax_loss  # noqa: PLC0415  (sharded imports this module)

        return sharded_softmax_loss(
            relevance_local,
            scores_local,
            self._scale_for(logit_scale),
            self.cross_example,
            self.negative_fraction,
            self.top_k,
            positive_cosine=self.positive_cosine,
            owner=self.name,
        )

    def _scale_for(self, logit_scale) -> float | tf.Tensor:
        """λ of one evaluation: this instance's, or the given ``logit_scale`` tensor (``given_logit_scale``)."""
        return self.scale if logit_scale is None else self.given_logit_scale(logit_scale)


__all__ = ["SoftmaxFamilyLoss", "softmax_loss"]

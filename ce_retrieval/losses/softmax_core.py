"""The base class of the softmax family (``softmax.py``, ``margin_softmax.py``, ``mixed_softmax.py``): λ, the
negative set and mining as constructor arguments, on three paths: the dense matrix (``kernels/softmax.py``, the
pipeline and its equations), column tiles from embeddings (``kernels/tiled.py``) and a replica's share
(``kernels/sharded.py``).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss
from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE, check_scale, resolve_mining, softmax_loss
from ce_retrieval.losses.kernels.tiled import TILED_THRESHOLD, tiled_softmax_loss
from ce_retrieval.losses.relevance import relevance_from_ids


class SoftmaxFamilyLoss(RetrievalLoss):
    """Base of the softmax-family losses: ``scale``, negative set, optional mining; see the module docstring.

    Subclasses name their function (``softmax.py``, ``margin_softmax.py``) and fix the negative set / mining
    defaults; their constructor arguments are that function's hyper-parameters.
    """

    function = softmax_loss
    has_logit_scale = True

    #: default ``negative_fraction`` when neither it nor ``top_k`` is given (``None``: no mining).
    default_negative_fraction: float | None = None
    #: ``from_embeddings`` may run the tiled path (``kernels/tiled.py``) and a train step may shard the loss
    #: (``kernels/sharded.py``): every class of ``softmax.py`` and ``margin_softmax.py`` (a margin class's
    #: ``positive_cosine`` is both paths' margin). A subclass whose loss is not the pipeline's sets them to False,
    #: which refuses ``tile_size`` and ``loss_partition='sharded'``.
    supports_tiled: bool = True
    supports_sharded: bool = True
    #: the margin of step 1, a method ``c -> margined c`` in the margin classes; ``None``: no margin.
    positive_cosine = None

    def __init__(
        self,
        scale: float = DEFAULT_LOGIT_SCALE,
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

        Runs the exact tiled path (``kernels/tiled.py``: no ``[N, M]`` matrix, memory O(N·T + (N + M)·d)) when the class
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
        ``logit_scale``: λ instead of this instance's (``base``'s module docstring, "λ and b at call")."""
        folded, kwargs = self.given_scalars(logit_scale)
        query_emb, doc_emb = self.fold_into_embeddings(query_emb, doc_emb, folded)
        return tiled_softmax_loss(
            query_emb,
            doc_emb,
            query_ids,
            doc_ids,
            kwargs.get("logit_scale", self.scale),
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
        ``logit_scale``: λ instead of this instance's (``base``'s module docstring, "λ and b at call")."""
        folded, kwargs = self.given_scalars(logit_scale)
        return sharded_softmax_loss(
            relevance_local,
            folded.apply(scores_local),
            kwargs.get("logit_scale", self.scale),
            self.cross_example,
            self.negative_fraction,
            self.top_k,
            positive_cosine=self.positive_cosine,
            owner=self.name,
        )


__all__ = ["SoftmaxFamilyLoss"]

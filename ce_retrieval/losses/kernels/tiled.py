"""The softmax family (``softmax.py``) from embeddings, exact, without the ``[N, M]`` matrix: column tiles.

With logits ``l = λ·Q Dᵀ`` (``Q [N, d]`` queries, ``D [M, d]`` documents, embeddings *as given*: normalise them
first for cosine logits) and relevance from ids (``R_ij = 1`` iff ``query_ids[i] == doc_ids[j]``, else 0; with
``ignore_negative_ids`` a pair with a negative id on either side is ignored, ``R_ij = -1``)::

    loss = 1/|P| sum_{(i,j) in P} softplus(log Z_i - p_ij),   log Z_i = log sum_{s in Neg} w_s e^{s}

with ``p_ij = l_ij``, or ``λ ψ(l_ij / λ)`` for the margin softmaxes (``margin_softmax.py``: ψ = L-Softmax's psi,
A-Softmax, CosFace, ArcFace; margins touch positives only), exactly as :func:`softmax.softmax_loss` on
``S = Q Dᵀ``: ``Neg`` is row i's negatives (sampled, eq. 2) or all negatives of the batch (cross-example, eq. 5);
``w = 1``, or with mining the top-k weights (1 above the k-th largest negative t, ``(k - #{> t}) / #{== t}`` at t,
0 below; eqs. 3 and 6).

How, with ``D`` cut into ``ceil(M / T)`` column tiles of ``T = tile_size`` documents (each tile's logits
``[N, T]`` recomputed by one matmul in every pass, a ``tf.while_loop`` over tiles):

1. *positive pairs* from the ids, not from the matrix: a stable sort of ``doc_ids`` puts row i's positive
   documents at sorted positions ``[start_i, start_i + count_i)`` (counts by a merged sort, no ``[N, M]``
   comparison); slot ``k`` pairs each row with its k-th positive (``max_i count_i`` slots, gathers of ``[N, d]``).
2. *mining* (optional): the k-th largest negative ``t`` (per row or for the batch) by radix selection on the
   float bits (``fast_paths``): each digit pass accumulates the digit histogram over the tiles, then picks the
   bin; counts are int64 for the batch (``N·M`` may exceed 2^31). Exact with ties: the tie weight above.
3. *forward*: streaming log-sum-exp per row, a running max ``m_i`` and sum ``z_i`` rescaled tile by tile
   (``z ← z e^{m - m'} + sum_tile w e^{l - m'}``); cross-example combines the rows' ``(m_i, z_i)`` at the end.
4. *backward* (``tf.custom_gradient``, nothing ``[N, M]`` saved, only ``log Z``): with ``r_ij = σ(log Z_i - p_ij)
   / |P|`` on the positives, ``dL/dl_ij = -r_ij ψ'(l_ij / λ)`` there (``-r_ij`` without a margin),
   ``g_i = sum_j r_ij`` (cross-example: ``g = sum r``), and on the negatives
   ``dL/dl_ij = g_i w_ij e^{l_ij - log Z_i}`` (the softmax weight from the saved log Z),
   recomputed per tile: ``dQ += λ dL_t D_t``, ``dD_t = λ dL_tᵀ Q``. λ may be a tensor (a learned λ): it reaches
   the op folded into Q and, for the margin's ``λ ψ(l / λ)``, as an input whose gradient is
   ``-Σ_P r_ij (ψ(c_ij) - c_ij ψ'(c_ij))`` (c = l / λ; the rest of dL/dλ flows through ``λ Q``).

Eagerly too: the op's body runs on ``stop_gradient`` copies of its inputs, so an eager ``GradientTape`` records only
the custom gradient, not every tile's logits (which made an eager step O(N·M): +7.5 GiB at N = M = 16,384).
Sharded + tiled (``across_replicas=True``): the queries are this replica's rows and the documents all replicas'
(gathered); |P|, the cross-example ``(m, z)`` and the global mining histograms are summed over replicas as in
``sharded.py``, and the value is this replica's share. ``RetrievalObjective`` (``ce_retrieval/objective``) chooses
this path from the config (``train.loss_tile_size``).

Cost: one logits pass forward, one backward (plus 2 passes for cross-example mining, 3 per-row), each a ``[N, d] x
[d, T]`` matmul; memory O(N·T + (N + M)·d) (per-row mining adds ``[N, 2048]`` int32 histograms). Float16/bfloat16
embeddings are computed in float32 (the gradients come back in the input dtype). Values and gradients equal the
dense path's to float32 rounding (``tests/losses/test_tiled.py``); mining is exact provided a logit has the same
bits in every pass, which holds because every pass computes it by the same matmul.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.kernels.fast_paths import (
    GLOBAL_PASSES,
    ROW_PASSES,
    _find_bin,
    _histogram,
    key_to_float32,
    ordered_int32_key,
)
from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE, check_scale, resolve_mining
from ce_retrieval.utils.replicas import replica_sum, stack_from_replicas

_NEG_INF = float("-inf")

#: ``SoftmaxFamilyLoss.from_embeddings`` and ``loss_tile_size: auto`` tile by themselves above this many logits
#: ``N·M`` (2^26: a 256 MiB matrix).
TILED_THRESHOLD = 2**26
#: Default tile width T when none is given (tuned at N = 8192, d = 128 on CPU, XLA: 256-512 fastest, 2048+ slower;
#: benchmarks/scale/tiled.py --tile-sizes).
DEFAULT_TILE_SIZE = 512
#: The default tile holds at most this many logits (``N·T``): 2^25 float32 = 128 MiB per ``[N, T]`` temporary.
MAX_TILE_ENTRIES = 2**25


def default_tile_size(num_queries: int | None) -> int:
    """``DEFAULT_TILE_SIZE``, narrowed so that a tile holds at most ``MAX_TILE_ENTRIES`` logits (at least 128)."""
    if num_queries is None or num_queries <= 0:
        return DEFAULT_TILE_SIZE
    return max(128, min(DEFAULT_TILE_SIZE, MAX_TILE_ENTRIES // num_queries))


# no tensor-dependent Python control flow: autograph's conversion would only cost trace time
@tf.autograph.experimental.do_not_convert
def tiled_softmax_loss(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    scale: float = DEFAULT_LOGIT_SCALE,
    cross_example: bool = False,
    negative_fraction: float | None = None,
    top_k: int | None = None,
    tile_size: int | None = None,
    ignore_negative_ids: bool = False,
    positive_cosine=None,
    across_replicas: bool = False,
    owner: str = "tiled_softmax_loss",
) -> tf.Tensor:
    """The softmax-family loss of ``λ·Q Dᵀ`` with relevance from ids, over column tiles (module docstring).

    Args:
      query_emb: ``[N, d]`` floating query embeddings (as given; normalise first for cosine logits).
      doc_emb: ``[M, d]`` floating document embeddings.
      query_ids, doc_ids: ``[N]`` and ``[M]`` integer ids; a pair is positive iff its ids are equal.
      scale: logit scale λ: a number, or a scalar tensor (a learned λ; the gradient flows into it).
      cross_example: every negative of the batch (eq. 5) instead of the row's (eq. 2).
      negative_fraction, top_k: mining (eqs. 3 and 6), at most one; ``None`` for both: every negative.
      tile_size: documents per tile T (``None``: :func:`default_tile_size`); any T >= 1, need not divide M.
      ignore_negative_ids: pairs with a negative query or document id are ignored (R = -1: padding).
      positive_cosine: the margin of the margin softmaxes, an element-wise ``c -> ψ(c)`` applied to the positive
        pairs' similarities ``c = q·d`` before ``scale`` (``margin_softmax.py``); ``None``: no margin.
      across_replicas: sharded + tiled: the queries are this replica's rows, the documents every replica's
        (gathered); returns this replica's share of the global loss (``sharded.py``: the number of positive
        pairs, the cross-example partition function and the global mining histograms are combined over
        replicas; Σ_r share_r = the loss of all rows). The identity outside a multi-replica context.
      owner: the name in error messages.

    Returns:
      float32 scalar: the mean over positive pairs (0 without positive pairs), differentiable in both
      embedding matrices (with ``across_replicas``: this replica's share).
    """
    scale = check_scale(scale, owner)
    negative_fraction, top_k = resolve_mining(negative_fraction, top_k, None, owner)
    query_emb, doc_emb = tf.convert_to_tensor(query_emb), tf.convert_to_tensor(doc_emb)
    query_ids, doc_ids = tf.convert_to_tensor(query_ids), tf.convert_to_tensor(doc_ids)
    for label, emb in (("query_emb", query_emb), ("doc_emb", doc_emb)):
        if not emb.dtype.is_floating:
            raise ValueError(f"{owner}: {label} must be a floating tensor, got dtype {emb.dtype.name}")
        if emb.shape.rank is not None and emb.shape.rank != 2:
            raise ValueError(f"{owner}: {label} must have rank 2 [batch, dim], got shape {emb.shape}")
    for label, ids in (("query_ids", query_ids), ("doc_ids", doc_ids)):
        if not ids.dtype.is_integer:
            raise ValueError(f"{owner}: {label} must be integer ids, got dtype {ids.dtype.name}")
        if ids.shape.rank is not None and ids.shape.rank != 1:
            raise ValueError(f"{owner}: {label} must be a rank-1 vector, got shape {ids.shape}")
    if not query_emb.shape[-1:].is_compatible_with(doc_emb.shape[-1:]):
        raise ValueError(f"{owner}: embedding dims differ: {query_emb.shape} vs {doc_emb.shape}")
    if not query_emb.shape[:1].is_compatible_with(query_ids.shape):
        raise ValueError(f"{owner}: query_ids shape {query_ids.shape} does not match query_emb {query_emb.shape}")
    if not doc_emb.shape[:1].is_compatible_with(doc_ids.shape):
        raise ValueError(f"{owner}: doc_ids shape {doc_ids.shape} does not match doc_emb {doc_emb.shape}")
    if tile_size is None:
        tile_size = default_tile_size(query_emb.shape[0])
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f"{owner}: tile_size must be a positive integer, got {tile_size!r}")

    problem = _Problem(
        tf.cast(query_ids, tf.int64),
        tf.cast(doc_ids, tf.int64),
        int(tile_size),
        bool(cross_example),
        negative_fraction,
        top_k,
        bool(ignore_negative_ids),
        positive_cosine,
        bool(across_replicas),
    )
    # λ folded into Q once, so every pass computes a logit by the same matmul (identical bits: exact mining); λ is
    # an input of the op too, for the margin's λ ψ(l / λ).
    scale = tf.convert_to_tensor(scale, tf.float32)
    return problem.loss(scale * tf.cast(query_emb, tf.float32), tf.cast(doc_emb, tf.float32), scale)


class _Problem:
    """The ids, tiling and hyper-parameters of one call; :meth:`loss` is the custom-gradient op."""

    def __init__(
        self,
        query_ids,
        doc_ids,
        tile,
        cross_example,
        negative_fraction,
        top_k,
        ignore_negative_ids,
        margin,
        across_replicas=False,
    ):
        # Σ over replicas of a per-replica count or sum (sharded + tiled); the identity on one device.
        self.combine = replica_sum if across_replicas else (lambda x: x)
        self.across_replicas = across_replicas
        self.query_ids, self.doc_ids, self.tile = query_ids, doc_ids, tile
        self.margin = margin
        self.cross_example, self.negative_fraction, self.top_k = cross_example, negative_fraction, top_k
        self.num_queries = tf.size(query_ids)
        self.num_docs = tf.size(doc_ids)
        self.num_tiles = (self.num_docs + tile - 1) // tile
        padding = self.num_tiles * tile - self.num_docs
        in_range = tf.pad(tf.ones_like(doc_ids, tf.bool), [[0, padding]])
        self.tile_ids = tf.reshape(tf.pad(doc_ids, [[0, padding]]), [-1, tile])
        if ignore_negative_ids:
            self.row_ok = query_ids >= 0
            self.tile_ok = tf.reshape(in_range & (tf.pad(doc_ids, [[0, padding]]) >= 0), [-1, tile])
            valid_docs = tf.reduce_sum(tf.cast(doc_ids >= 0, tf.int32))
        else:
            self.row_ok = tf.ones_like(query_ids, tf.bool)
            self.tile_ok = tf.reshape(in_range, [-1, tile])
            valid_docs = self.num_docs
        self.padding = padding
        # Step 1: positive ranges in the stable order of doc_ids (ids < 0 never equal a valid query id).
        self.order = tf.argsort(doc_ids, stable=True)
        start = _count_docs_below(query_ids, doc_ids, inclusive=False)
        count = _count_docs_below(query_ids, doc_ids, inclusive=True) - start
        self.start = start
        self.count = tf.where(self.row_ok, count, 0)
        self.num_slots = tf.reduce_max(tf.concat([self.count, [0]], 0))
        self.num_positive = tf.reshape(self.combine(tf.reduce_sum(tf.cast(self.count, tf.float32))), [])  # all |P|
        self.row_negatives = tf.where(self.row_ok, valid_docs - self.count, 0)  # n_i, int32 [N]
        self.mining = negative_fraction is not None or top_k is not None

    # ---- tiles ------------------------------------------------------------------------------------------------

    def _tile(self, queries, doc_tiles, t):
        """Tile t: its documents ``[T, d]``, logits ``[N, T]`` and negative mask ``[N, T]``."""
        docs = doc_tiles[t]
        logits = tf.matmul(queries, docs, transpose_b=True)
        negative = (
            tf.not_equal(self.query_ids[:, None], self.tile_ids[t][None, :])
            & self.tile_ok[t][None, :]
            & self.row_ok[:, None]
        )
        return docs, logits, negative

    def _over_tiles(self, body, state):
        """``state = body(t, *state)`` for every tile t, in order (one tile's temporaries alive at a time)."""

        def step(t, *carried):
            return (t + 1, *body(t, *carried))

        out = tf.while_loop(lambda t, *_: t < self.num_tiles, step, (tf.constant(0), *state), parallel_iterations=1)
        return out[1:]

    # ---- step 2: mining -----------------------------------------------------------------------------------------

    def _select(self, queries, doc_tiles):
        """Threshold ``t`` and tie weight of the top-k negatives (per row ``[N, 1]`` or for the batch ``[1, 1]``)."""
        per_row = not self.cross_example
        if per_row:
            count = self.row_negatives
            if self.top_k is not None:
                k = tf.minimum(count, self.top_k)
            else:
                k = tf.cast(tf.math.ceil(tf.cast(count, tf.float64) * self.negative_fraction), tf.int32)
            passes, count_dtype = ROW_PASSES, tf.int32
        else:
            count = tf.reduce_sum(tf.cast(self.row_negatives, tf.int64), keepdims=True)  # [1], may exceed 2^31
            count = tf.reshape(self.combine(count), [1])  # reshaped: a gather loses the static shape
            if self.top_k is not None:
                k = tf.minimum(count, self.top_k)
            else:
                k = tf.cast(tf.math.ceil(tf.cast(count, tf.float64) * self.negative_fraction), tf.int64)
            passes, count_dtype = GLOBAL_PASSES, tf.int64
        k = tf.minimum(k, count)
        remaining = tf.clip_by_value(k, 1, tf.maximum(count, 1))
        greater = tf.zeros_like(remaining)
        rows = tf.shape(remaining)[0]
        prefix, in_bin, shift = None, None, 32
        for level, bits in enumerate(passes):
            shift -= bits
            size = 2**bits

            def body(t, hist, level=level, shift=shift, bits=bits, size=size, prefix=prefix):
                _, logits, negative = self._tile(queries, doc_tiles, t)
                key = ordered_int32_key(logits)
                if level == 0:
                    digits = tf.bitwise.right_shift(key, shift) + size // 2
                else:
                    digits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(key, shift), size - 1)
                    negative &= tf.equal(tf.bitwise.right_shift(key, shift + bits), prefix[:, None])
                digits = tf.where(negative, digits, size)  # dropped by the histogram
                return (hist + tf.cast(_histogram(digits, size, per_row), count_dtype),)

            (hist,) = self._over_tiles(body, (tf.zeros([rows if per_row else 1, size], count_dtype),))
            if not per_row:  # the batch's histogram: every replica's rows (reshaped: a gather loses the shape)
                hist = tf.reshape(self.combine(hist), [1, size])
            digit, above, in_bin = _find_bin(hist, remaining)
            greater += above
            remaining -= above
            prefix = digit - size // 2 if level == 0 else prefix * size + digit
        nonempty = count > 0
        threshold = tf.where(nonempty, key_to_float32(prefix), _NEG_INF)
        tie = tf.cast(k - greater, tf.float32) / tf.cast(tf.maximum(in_bin, 1), tf.float32)
        return threshold[:, None], tie[:, None]

    def _weights(self, logits, negative, selection):
        """Weights ``w`` of the negative set (1, or the top-k weights with ties sharing the last places)."""
        if selection is None:
            return tf.cast(negative, tf.float32)
        threshold, tie = selection
        return tf.where(negative & (logits > threshold), 1.0, tf.where(negative & (logits == threshold), tie, 0.0))

    # ---- step 3: streaming log-sum-exp --------------------------------------------------------------------------

    def _log_partition(self, queries, doc_tiles, selection):
        """``log Z``: ``[N]`` per row, or the batch's broadcast to ``[N]`` (cross-example); -inf for empty sets."""

        def body(t, peak, total):
            _, logits, negative = self._tile(queries, doc_tiles, t)
            weight = self._weights(logits, negative, selection)
            kept = weight > 0.0
            new_peak = tf.maximum(peak, tf.reduce_max(tf.where(kept, logits, _NEG_INF), axis=1))
            shift = tf.where(new_peak > _NEG_INF, new_peak, 0.0)
            exp = weight * tf.exp(tf.where(kept, logits - shift[:, None], _NEG_INF))
            return new_peak, total * tf.exp(peak - shift) + tf.reduce_sum(exp, axis=1)

        n = self.num_queries
        peak, total = self._over_tiles(body, (tf.fill([n], _NEG_INF), tf.zeros([n])))
        if self.cross_example:
            top = tf.reduce_max(peak)
            shift = tf.where(top > _NEG_INF, top, 0.0)
            total = tf.reduce_sum(total * tf.exp(peak - shift), keepdims=True)
            peak = tf.reshape(top, [1])
            if self.across_replicas:  # (m_r, s_r) of every replica: log Z = m + log Σ_r s_r e^{m_r - m}
                parts = stack_from_replicas(tf.concat([peak, total], 0))  # [R, 2]
                top = tf.reduce_max(parts[:, 0])
                shift = tf.where(top > _NEG_INF, top, 0.0)
                rescale = tf.where(parts[:, 0] > _NEG_INF, tf.exp(parts[:, 0] - shift), 0.0)
                total = tf.reduce_sum(parts[:, 1] * rescale, keepdims=True)
                peak = tf.reshape(top, [1])
        log_z = tf.where(total > 0.0, peak + tf.math.log(tf.where(total > 0.0, total, 1.0)), _NEG_INF)
        return tf.broadcast_to(log_z, [n])

    # ---- step 1 and 5: positive pairs ---------------------------------------------------------------------------

    def _slot(self, queries, docs, k):
        """Slot k: per row its k-th positive document's index ``[N]``, whether it exists, and its logit."""
        active = k < self.count
        column = tf.gather(self.order, tf.clip_by_value(self.start + k, 0, tf.maximum(self.num_docs - 1, 0)))
        logit = tf.reduce_sum(queries * tf.gather(docs, column), axis=1)
        return column, active, logit

    def _positive_logit(self, logit, scale):
        """The positive pair's logit ``p = λ ψ(l / λ)`` and ``dp/dl = ψ'(l / λ)`` (``l`` itself and 1 without a
        margin); element-wise, so the derivative is the gradient of the sum."""
        if self.margin is None:
            return logit, None
        with tf.GradientTape() as tape:
            cosine = logit / scale
            tape.watch(cosine)
            margined = self.margin(cosine)
        return scale * margined, tape.gradient(margined, cosine)

    def _positive_sum(self, queries, docs, log_z, scale):
        """``sum_{(i,j) in P} softplus(log Z_i - p_ij)``, one positive slot at a time."""

        def body(k, total):
            _, active, logit = self._slot(queries, docs, k)
            positive, _ = self._positive_logit(logit, scale)
            return k + 1, total + tf.reduce_sum(tf.where(active, tf.math.softplus(log_z - positive), 0.0))

        return tf.while_loop(lambda k, _: k < self.num_slots, body, (tf.constant(0), tf.constant(0.0)))[1]

    # ---- the op --------------------------------------------------------------------------------------------------

    def loss(self, queries: tf.Tensor, docs: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        """The op on ``queries = λ Q`` (λ folded in), ``docs = D`` and λ (which the margin's ``λ ψ(l / λ)`` reads)."""

        @tf.custom_gradient
        def op(queries, docs, scale):
            # Eagerly, a tape records every op inside a custom-gradient function whose inputs it watches (and keeps
            # each tile's logits for a backward that never runs: O(N·M)); cut the inputs off the tape so only the
            # custom gradient below is recorded. A no-op in a graph, where the custom gradient replaces the body's.
            queries, docs, scale = tf.stop_gradient(queries), tf.stop_gradient(docs), tf.stop_gradient(scale)
            doc_tiles = tf.reshape(tf.pad(docs, [[0, self.padding], [0, 0]]), [-1, self.tile, tf.shape(docs)[1]])
            selection = self._select(queries, doc_tiles) if self.mining else None
            log_z = self._log_partition(queries, doc_tiles, selection)
            denominator = tf.maximum(self.num_positive, 1.0)
            value = self._positive_sum(queries, docs, log_z, scale) / denominator

            def grad_fn(upstream):
                return self._gradient(upstream / denominator, queries, docs, doc_tiles, log_z, selection, scale)

            return value, grad_fn

        return op(queries, docs, scale)

    def _gradient(self, upstream, queries, docs, doc_tiles, log_z, selection, scale):
        """``(dL/dqueries, dL/ddocs, dL/dλ)`` (step 4 of the module docstring); dL/dλ is the margin's part only,
        ``∂p/∂λ = ψ(c) - c ψ'(c)`` at fixed ``l`` (c = l / λ): the rest reaches λ through ``queries = λ Q``."""

        def positive(k, g, d_queries, d_docs, d_scale):
            column, active, logit = self._slot(queries, docs, k)
            positive, slope = self._positive_logit(logit, scale)
            r = tf.where(active, tf.math.sigmoid(log_z - positive), 0.0) * upstream  # -dL/dp = dL/dlog Z share
            d_logit = r if slope is None else r * slope  # -dL/dl = r dp/dl
            d_queries -= d_logit[:, None] * tf.gather(docs, column)
            d_docs = tf.tensor_scatter_nd_add(d_docs, column[:, None], -d_logit[:, None] * queries)
            if slope is not None:  # -r ∂p/∂λ, with λ (ψ(c) - c ψ'(c)) = p - l ψ'(c)
                d_scale -= tf.reduce_sum(r * (positive - logit * slope)) / scale
            return k + 1, g + r, d_queries, d_docs, d_scale

        zeros_q, zeros_d = tf.zeros_like(queries), tf.zeros_like(docs)
        _, g, d_queries, d_docs, d_scale = tf.while_loop(
            lambda k, *_: k < self.num_slots,
            positive,
            (tf.constant(0), tf.zeros([self.num_queries]), zeros_q, zeros_d, tf.zeros_like(scale)),
        )
        if self.cross_example:  # every positive pair of every replica shares log Z
            g = tf.broadcast_to(self.combine(tf.reduce_sum(g)), tf.shape(g))
        shift = tf.where(log_z > _NEG_INF, log_z, 0.0)[:, None]

        def negative(t, d_queries, d_tiles):
            tile_docs, logits, negative = self._tile(queries, doc_tiles, t)
            weight = self._weights(logits, negative, selection)
            d_logits = (g[:, None] * weight) * tf.exp(tf.where(weight > 0.0, logits - shift, _NEG_INF))
            d_queries += tf.matmul(d_logits, tile_docs)
            return d_queries, d_tiles.write(t, tf.matmul(d_logits, queries, transpose_a=True))

        tiles = tf.TensorArray(tf.float32, size=self.num_tiles, element_shape=doc_tiles.shape[1:])
        d_queries, tiles = self._over_tiles(negative, (d_queries, tiles))
        d_tiles = tf.reshape(tiles.stack(), [-1, tf.shape(docs)[1]])[: self.num_docs]
        return d_queries, d_docs + d_tiles, d_scale


def _count_docs_below(query_ids: tf.Tensor, doc_ids: tf.Tensor, inclusive: bool) -> tf.Tensor:
    """Per query ``#{j : doc_ids[j] < query_ids[i]}`` (``<=`` with ``inclusive``), int32 ``[N]``, by one merged
    stable sort (ties resolved by the concatenation order) instead of an ``[N, M]`` comparison."""
    n = tf.size(query_ids)
    keys = tf.concat([doc_ids, query_ids] if inclusive else [query_ids, doc_ids], 0)
    ones, zeros = tf.ones_like(doc_ids, tf.int32), tf.zeros_like(query_ids, tf.int32)
    is_doc = tf.concat([ones, zeros] if inclusive else [zeros, ones], 0)
    order = tf.argsort(keys, stable=True)
    docs_so_far = tf.cumsum(tf.gather(is_doc, order))  # at a query's position: the documents sorted before it
    position = tf.scatter_nd(order[:, None], tf.range(tf.size(order)), tf.shape(order))
    query_position = position[tf.size(doc_ids) :] if inclusive else position[:n]
    return tf.gather(docs_so_far, query_position)


__all__ = ["DEFAULT_TILE_SIZE", "MAX_TILE_ENTRIES", "TILED_THRESHOLD", "default_tile_size", "tiled_softmax_loss"]

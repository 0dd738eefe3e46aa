"""SigLIP's sigmoid loss over column tiles of the documents, without the ``[N, M]`` logits, forward or backward.

With ``D`` cut into ``ceil(M / T)`` tiles of ``T`` documents, logits ``l_ij = t·q_i·d_j + b`` and
``z_ij = +1`` (same id) or ``-1``:

    L = 1/N · Σ_{i,j: R_ij ≠ -1} softplus(-z_ij l_ij)               (forward: one pass, a running sum)
    dL/dl_ij = -z_ij σ(-z_ij l_ij) / N                               (backward: recomputed tile by tile)
    dQ = Σ_t t·G_t D_t,   dD_t = t·G_tᵀ Q                            (G_t = dL/dl over tile t, [N, T])

so nothing ``[N, M]`` is kept for the backward (a ``tf.custom_gradient`` saves only the inputs). OpenCLIP's
chunked ``SigLipLoss`` keeps every block's logits for autograd instead, which is what runs out of memory at a
64k global batch there. Every pair is its own term, so the tiles need no log-sum-exp and no mining.

``across_replicas`` (sharded + tiled): the queries are this replica's rows, the documents every replica's
(gathered); N is the number of rows of all replicas (summed, no gradient) and the value is this replica's share
(Σ_r share_r = L). The body runs on ``stop_gradient`` copies of its inputs, so an eager ``GradientTape`` records
only the custom gradient (as ``tiled.py``). Float16/bfloat16 embeddings are computed in float32.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.kernels.tiled import default_tile_size
from ce_retrieval.utils.replicas import replica_sum


@tf.autograph.experimental.do_not_convert
def tiled_sigmoid_loss(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    scale: float,
    bias: float,
    tile_size: int | None = None,
    ignore_negative_ids: bool = False,
    across_replicas: bool = False,
) -> tf.Tensor:
    """SigLIP's ``1/N Σ softplus(-z (scale·q·d + bias))`` of ``query_emb [N, d]`` against ``doc_emb [M, d]`` with
    relevance from integer ids, over column tiles (module docstring); ``ignore_negative_ids``: pairs with a
    negative id on either side enter no term. Returns a float32 scalar (this replica's share ``across_replicas``)."""
    query_emb, doc_emb = tf.convert_to_tensor(query_emb), tf.convert_to_tensor(doc_emb)
    tile = default_tile_size(query_emb.shape[0]) if tile_size is None else tile_size
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tiled_sigmoid_loss: tile_size must be a positive integer, got {tile_size!r}")
    q_ids = tf.cast(tf.reshape(query_ids, [-1]), tf.int64)
    d_ids = tf.cast(tf.reshape(doc_ids, [-1]), tf.int64)
    num_docs = tf.size(d_ids)
    num_tiles = (num_docs + tile - 1) // tile
    padding = num_tiles * tile - num_docs
    tile_ids = tf.reshape(tf.pad(d_ids, [[0, padding]]), [-1, tile])
    tile_ok = tf.reshape(tf.pad(tf.ones_like(d_ids, tf.bool), [[0, padding]]), [-1, tile])
    row_ok = tf.ones_like(q_ids, tf.bool)
    if ignore_negative_ids:
        tile_ok &= tile_ids >= 0
        row_ok = q_ids >= 0
    rows = tf.cast(tf.size(q_ids), tf.float32)
    if across_replicas:
        rows = tf.reshape(replica_sum(tf.stop_gradient(rows)), [])
    rows = tf.maximum(rows, 1.0)

    def over_tiles(body, state):
        out = tf.while_loop(
            lambda t, *_: t < num_tiles, lambda t, *s: (t + 1, *body(t, *s)), (0, *state), parallel_iterations=1
        )
        return out[1:]

    def signed_logits(queries, doc_tiles, t):
        """Tile t: ``z·l`` ``[N, T]``, whether each pair is relevant, whether it enters a term."""
        logits = tf.matmul(queries, doc_tiles[t], transpose_b=True) + bias
        positive = tf.equal(q_ids[:, None], tile_ids[t][None, :])
        counted = tile_ok[t][None, :] & row_ok[:, None]
        return tf.where(positive, logits, -logits), positive, counted

    @tf.custom_gradient
    def op(queries, docs):
        queries, docs = tf.stop_gradient(queries), tf.stop_gradient(docs)  # eager: record only the custom gradient
        width = tf.shape(docs)[1]
        doc_tiles = tf.reshape(tf.pad(docs, [[0, padding], [0, 0]]), [-1, tile, width])

        def forward(t, total):
            signed, _, counted = signed_logits(queries, doc_tiles, t)
            return (total + tf.reduce_sum(tf.where(counted, tf.math.softplus(-signed), 0.0)),)

        (total,) = over_tiles(forward, (tf.constant(0.0),))

        def grad_fn(upstream):
            scale_up = upstream / rows

            def backward(t, d_queries, d_tiles):
                signed, positive, counted = signed_logits(queries, doc_tiles, t)
                slope = tf.math.sigmoid(-signed)  # d softplus(-z l)/dl = -z σ(-z l)
                d_logits = tf.where(counted, tf.where(positive, -slope, slope), 0.0) * scale_up
                d_queries += tf.matmul(d_logits, doc_tiles[t])
                return d_queries, d_tiles.write(t, tf.matmul(d_logits, queries, transpose_a=True))

            tiles = tf.TensorArray(tf.float32, size=num_tiles, element_shape=doc_tiles.shape[1:])
            d_queries, tiles = over_tiles(backward, (tf.zeros_like(queries), tiles))
            return d_queries, tf.reshape(tiles.stack(), [-1, width])[:num_docs]

        return total / rows, grad_fn

    # t folded into Q once: every logit is one matmul
    return op(float(scale) * tf.cast(query_emb, tf.float32), tf.cast(doc_emb, tf.float32))


__all__ = ["tiled_sigmoid_loss"]

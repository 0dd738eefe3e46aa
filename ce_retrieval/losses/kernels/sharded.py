"""The softmax family's loss sharded over replicas: each replica computes its own rows only (OpenCLIP's
``local_loss=True, gather_with_grad=True``), and the replicas' shares sum to the global loss, value and gradient.

A global batch of B rows is split over R replicas; replica r holds its query rows Q_r (n = B/R of them) and
the gathered documents D (all B, ``gather_from_replicas``, differentiable). With logits l = λ S_r, S_r = Q_r Dᵀ
(``[n, B]``), P the positive pairs of the whole batch and P_r those of replica r's rows:

    L       = 1/|P| Σ_{(i,j) ∈ P} softplus(log Z_i - l_ij)                        (softmax.py)
    share_r = 1/|P| Σ_{(i,j) ∈ P_r} softplus(log Z_i - l_ij),   |P| = Σ_r |P_r|    (all-reduced, no gradient)
    Σ_r share_r = L

(p_ij = l_ij, or λ ψ(s_ij) for the margin softmaxes: the margin touches a row's own positives, so it is local)
and the gradient of ``Σ_r share_r`` is dL/dθ because every cross-replica combine below is differentiable
(its gradient sums the replicas' upstream gradients) and Keras sums the replicas' variable gradients.

* sampled (eq. 2) and stochastic negative mining (eq. 3): Z_i is row i's own: local (every replica holds all
  columns of its rows, so per-row mining is local too).
* cross-example (eq. 5): Z = Σ_r Z_r is global. Each replica sends (m_r, s_r) = (max of its negatives,
  Σ_{its negatives} e^{l - m_r}); every replica forms ``log Z = m + log Σ_r s_r e^{m_r - m}``, m = max_r m_r.
  m_r carries no gradient (the value does not depend on it); s_r does, through the gather.
* cross-example negative mining (eq. 6): the global k-th largest negative t, k = ceil(f·n) of the global count n,
  by radix selection whose digit histograms are summed over replicas at every pass (``fast_paths.py``): the same
  threshold and tie counts #{> t}, #{= t} as on one device, so ties share the weight (k - #{> t}) / #{= t}
  exactly as in the dense loss.

The same combines stream over column tiles in ``tiled.py`` (``across_replicas=True``: sharded + tiled).
Cross-replica combines use ``gather_from_replicas`` (:mod:`ce_retrieval.utils.replicas`: an ``all_gather`` with a
SUM all-reduce as gradient, placed for ``MultiWorkerMirroredStrategy``) of per-replica scalars or histograms.
(In TF 2.20 ``ReplicaContext.all_reduce`` is differentiable too for SUM/MEAN: its custom gradient all-reduces the
upstream with the same op; for MAX that "gradient" would be wrong, which is why the maxima here are
``stop_gradient``-ed.) Outside a replica context, or with one replica, the share is the dense loss
(``softmax.softmax_loss``).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.kernels.fast_paths import (
    GLOBAL_PASSES,
    _find_bin,
    _histogram,
    key_to_float32,
    ordered_int32_key,
)
from ce_retrieval.losses.kernels.softmax import (
    DEFAULT_LOGIT_SCALE,
    check_scale,
    mining_k,
    negative_log_partition,
    resolve_mining,
)
from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT
from ce_retrieval.utils.replicas import replica_sum, stack_from_replicas

_NEG_INF = float("-inf")


def sharded_softmax_loss(
    relevance_local: tf.Tensor,
    scores_local: tf.Tensor,
    scale: float = DEFAULT_LOGIT_SCALE,
    cross_example: bool = False,
    negative_fraction: float | None = None,
    top_k: int | None = None,
    positive_cosine=None,
    owner: str = "sharded_softmax_loss",
) -> tf.Tensor:
    """This replica's share of the global softmax-family loss (module docstring); Σ_r share_r = L.

    Args:
      relevance_local, scores_local: float32 ``[n, M]``: this replica's rows against ALL (gathered) columns.
      scale: logit scale λ (logits ``λ·S``): a number, or a scalar tensor (a learned λ).
      cross_example: ``Neg`` = every negative of the global batch (eq. 5) instead of the row's (eq. 2).
      negative_fraction, top_k: mining (eqs. 3 and 6); at most one; ``None`` for both: every negative.
      positive_cosine: the margin of the margin softmaxes (``c -> ψ(c)`` on the positives' scores before ``scale``,
        as in ``softmax.softmax_loss``); ``None``: no margin. Row-local, so it shards like the rest.
      owner: the name in error messages.
    """
    scale = check_scale(scale, owner)
    negative_fraction, top_k = resolve_mining(negative_fraction, top_k, None, owner)
    relevance = tf.cast(relevance_local, tf.float32)
    logits = scale * tf.cast(scores_local, tf.float32)
    negatives, positives = tf.equal(relevance, IRRELEVANT), tf.equal(relevance, RELEVANT)
    if cross_example:
        log_partition = _global_log_partition(logits, negatives, negative_fraction, top_k)  # [1, 1]
    else:  # per row: every row's negatives (and its top k) are on this replica
        log_partition = negative_log_partition(logits, negatives, False, negative_fraction, top_k)  # [n, 1]
    positive_logits = logits if positive_cosine is None else scale * positive_cosine(tf.cast(scores_local, tf.float32))
    per_pair = tf.math.softplus(log_partition - positive_logits)
    local = tf.reduce_sum(tf.where(positives, per_pair, tf.zeros_like(per_pair)))
    num_positive = replica_sum(tf.stop_gradient(tf.reduce_sum(tf.cast(positives, tf.float32))))
    return local / tf.maximum(num_positive, 1.0)


def _global_log_partition(logits, negatives, negative_fraction, top_k):
    """``log Z`` over the negatives of all replicas' rows (``[1, 1]``; -inf when there are none).

    (m_r, s_r) gathered in one collective: ``log Z = m + log Σ_r s_r e^{m_r - m}``, m = max_r m_r.
    """
    masked = tf.where(negatives, logits, _NEG_INF)
    peak_local = tf.stop_gradient(tf.reduce_max(tf.reduce_max(masked, axis=-1), axis=0))
    shift = tf.where(peak_local > _NEG_INF, peak_local, 0.0)
    exp = tf.exp(masked - shift)  # 0 outside the negatives
    if negative_fraction is not None or top_k is not None:
        exp = exp * _global_top_k_weights(masked, negatives, negative_fraction, top_k)
    total_local = tf.reduce_sum(tf.reduce_sum(exp, axis=-1), axis=0)
    parts = stack_from_replicas(tf.stack([peak_local, total_local]))  # [R, 2]; gradient flows into the sums only
    peaks, totals = tf.stop_gradient(parts[:, 0]), parts[:, 1]
    peak = tf.reduce_max(peaks)  # -inf on a replica without negatives (its total is 0)
    safe_peak = tf.where(peak > _NEG_INF, peak, 0.0)
    rescale = tf.where(peaks > _NEG_INF, tf.exp(peaks - safe_peak), 0.0)
    total = tf.reduce_sum(totals * rescale)
    nonempty = total > 0.0
    log_z = tf.where(nonempty, safe_peak + tf.math.log(tf.where(nonempty, total, 1.0)), _NEG_INF)
    return tf.reshape(log_z, [1, 1])


def _global_top_k_weights(masked, negatives, negative_fraction, top_k):
    """``fast_paths.top_k_weights`` over the negatives of all replicas: 1 above the global k-th largest t,
    (k - #{> t}) / #{= t} at t, 0 below; k = ``mining_k`` of the global count. No gradient."""
    masked = tf.stop_gradient(masked)
    count = replica_sum(tf.reduce_sum(tf.cast(negatives, tf.int32)))
    k = tf.minimum(mining_k(count, negative_fraction, top_k), count)
    threshold, greater, equal = global_kth_largest(masked, k, count)
    tie_weight = tf.cast(k - greater, tf.float32) / tf.cast(tf.maximum(equal, 1), tf.float32)
    return tf.where(masked > threshold, 1.0, tf.where(masked == threshold, tie_weight, 0.0))


def global_kth_largest(
    masked: tf.Tensor, k: tf.Tensor, count: tf.Tensor, passes=GLOBAL_PASSES
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The k-th largest of the candidates of ALL replicas, with the global #{> t} and #{= t} (scalars).

    ``masked``: this replica's candidates, -inf elsewhere; ``k``, ``count`` (global number of candidates, k <= count):
    int32 scalars, equal on every replica. Most-significant-digit radix selection as in ``fast_paths._radix_select``
    with each pass's histogram summed over replicas, so every replica walks the same global histogram.
    """
    key = tf.reshape(ordered_int32_key(masked), [1, -1])
    count = tf.reshape(count, [1])
    remaining = tf.clip_by_value(tf.reshape(k, [1]), 1, tf.maximum(count, 1))
    greater = tf.zeros_like(remaining)
    prefix, in_bin, shift = None, None, 32
    for level, bits in enumerate(passes):
        shift -= bits
        size = 2**bits
        if level == 0:
            digits = tf.bitwise.right_shift(key, shift) + size // 2
        else:  # entries outside the prefix land at >= size and are dropped (see fast_paths._radix_select)
            offset = tf.bitcast(key - ((prefix * size) * (2**shift))[:, None], tf.uint32)
            if shift:
                digits = tf.bitcast(tf.bitwise.right_shift(offset, tf.constant(shift, tf.uint32)), tf.int32)
            else:
                digits = tf.bitcast(tf.minimum(offset, tf.constant(size, tf.uint32)), tf.int32)
        # [1, size], global; reshaped: a multi-worker all_gather loses the static shape
        hist = tf.reshape(replica_sum(_histogram(digits, size, per_row=False)), [1, size])
        digit, above, in_bin = _find_bin(hist, remaining)
        greater += above
        remaining -= above
        prefix = digit - size // 2 if level == 0 else prefix * size + digit
    nonempty = count > 0
    value = tf.where(nonempty, key_to_float32(prefix), _NEG_INF)
    zero = tf.zeros_like(greater)
    greater, equal = tf.where(nonempty, greater, zero), tf.where(nonempty, in_bin, zero)
    equal = tf.where(value == _NEG_INF, count - greater, equal)  # a -inf threshold ties with the fillers
    return value[0], greater[0], equal[0]


__all__ = ["global_kth_largest", "sharded_softmax_loss"]

"""The centroid upper bound on the triplet loss (Do et al. 2019; ProbML 16.2.5.3).

With fixed class centroids ``c_m`` (the columns of ``S``: a frozen
:class:`ce_retrieval.modeling.proxies.ProxySimilarity` initialised by
:func:`ce_retrieval.modeling.proxies.fixed_centroids`, one-hot or k-means on the sphere), the triangle
inequality bounds the margin-free triplet loss ``‖f_i − f_j‖ − ‖f_i − f_k‖`` summed over all triplets by

    L_u = N' Σ_i ( ‖f_i − c_{y_i}‖ − 1/(3(C − 1)) Σ_{m ≠ y_i} ‖f_i − c_m‖ ),

computable in ``O(NC)``. This loss returns the bracket averaged over positive (example, centroid) pairs,
i.e. ``L_u / (N' N)``: the constant ``N' = 3(C−1)(N/C − 1)N/C`` only rescales the learning rate.
``C − 1`` is the number of negative columns of the row (relevance 0). Distances are **not** squared:
``‖f − c‖ = sqrt(2 − 2 cos)`` for unit vectors (``similarity='cosine'``) or ``sqrt(−S)``.

Only row ``i`` (an example against every centroid) is read; the columns are centroids (``needs_proxies``), so
no Gram matrix is needed (``needs_gram`` is false). Functional core: :func:`centroid_upper_bound`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._similarity import check_similarity, distance
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import mean_over_positives
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.relevance import IRRELEVANT


def _check(similarity, epsilon, owner: str) -> tuple[str, float]:
    return check_similarity(similarity, owner), float(epsilon)


def centroid_upper_bound(relevance, scores, similarity: str = "cosine", epsilon: float = 1e-12):
    """The bracket of ``L_u`` (module docstring), mean over positive (example, centroid) pairs."""
    similarity, epsilon = _check(similarity, epsilon, "centroid_upper_bound")
    dist = distance(scores, "euclidean", similarity, epsilon)
    negative = tf.cast(relevance == IRRELEVANT, tf.float32)
    num_neg = tf.reduce_sum(negative, axis=1, keepdims=True)
    mean_neg = tf.reduce_sum(dist * negative, axis=1, keepdims=True) / tf.maximum(num_neg, 1.0)
    return mean_over_positives(dist - mean_neg / 3.0, relevance)


@register
class CentroidUpperBoundLoss(RetrievalLoss):
    """Triplet upper bound through fixed centroids; see the module docstring."""

    function = centroid_upper_bound
    check = staticmethod(_check)
    supports_bidirectional = False
    needs_proxies = True


__all__ = ["CentroidUpperBoundLoss"]

"""How the losses read a similarity matrix ``S``: the one vocabulary of similarities and distances (private).

The loss contract hands every loss ``S [N, M]``; a loss stated with distances evaluates them from ``S``. Two
names say what ``S`` is and what distance a loss uses:

``similarity`` (how to read ``S``; the constructor argument of NCA, ProxyNCA, LMNN and the centroid bound):

* ``'cosine'``: cosines of unit vectors, so ``d² = ‖x − y‖² = 2 − 2S`` (ProbML 16.2.2);
* ``'negative_squared_distance'``: ``S = −d²`` already, e.g. the output of
  :class:`ce_retrieval.modeling.mahalanobis.PairwiseNegativeSquaredDistance` (a learned Mahalanobis metric).

``distance`` (which ``D`` a loss uses; the constructor argument of the triplet loss):

* ``'squared_euclidean'``: ``D = d²``;
* ``'euclidean'``: ``D = sqrt(d²)``, the argument clipped at ``epsilon`` (1e-12) so that coincident points get a
  zero (not infinite) gradient;
* ``'cosine'``: ``D = 1 − S`` (cosine ``S`` only).

All losses of the package convert with :func:`squared_distance` and :func:`distance` below. :func:`require_gram`
is the check behind the ``needs_gram`` capability: ``S`` must be the Gram matrix ``X·Xᵀ`` of one embedding set.
"""

from __future__ import annotations

import tensorflow as tf

SIMILARITIES = ("cosine", "negative_squared_distance")
DISTANCES = ("squared_euclidean", "euclidean", "cosine")

#: Largest ``|S − Sᵀ|`` and ``|diag(S) − 1|`` (cosine) accepted as a Gram matrix: loose enough for bfloat16
#: similarities (about 3 significant digits), far below what a text × image matrix shows.
GRAM_TOLERANCE = 1e-2


def check_similarity(similarity: str, owner: str) -> str:
    """``similarity`` if it is one of :data:`SIMILARITIES`, else a ``ValueError`` naming ``owner``."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"{owner}: similarity must be one of {SIMILARITIES}, got {similarity!r}")
    return similarity


def check_distance(distance: str, owner: str) -> str:
    """``distance`` if it is one of :data:`DISTANCES`, else a ``ValueError`` naming ``owner``."""
    if distance not in DISTANCES:
        raise ValueError(f"{owner}: distance must be one of {DISTANCES}, got {distance!r}")
    return distance


def squared_distance(scores: tf.Tensor, similarity: str = "cosine") -> tf.Tensor:
    """``d²`` (clamped at 0 against rounding) from ``S`` read as ``similarity``."""
    if similarity == "cosine":
        return tf.maximum(2.0 - 2.0 * scores, 0.0)
    if similarity == "negative_squared_distance":
        return tf.maximum(-scores, 0.0)
    raise ValueError(f"unknown similarity {similarity!r}; expected one of {SIMILARITIES}")


def distance(scores: tf.Tensor, kind: str, similarity: str = "cosine", epsilon: float = 1e-12) -> tf.Tensor:
    """The distance ``kind`` (one of :data:`DISTANCES`) from ``S`` read as ``similarity``; see the module doc."""
    if kind == "cosine":
        if similarity != "cosine":
            raise ValueError(f"the cosine distance 1 - S needs cosine similarities, got similarity={similarity!r}")
        return 1.0 - scores
    squared = squared_distance(scores, similarity)
    if kind == "squared_euclidean":
        return squared
    if kind == "euclidean":
        return tf.sqrt(tf.maximum(squared, epsilon))
    raise ValueError(f"unknown distance {kind!r}; expected one of {DISTANCES}")


def require_gram(scores: tf.Tensor, owner: str, similarity: str = "cosine", tolerance: float = GRAM_TOLERANCE):
    """``scores`` with checks that it is the Gram matrix of one embedding set: square, symmetric within
    ``tolerance`` and, for cosines, a unit diagonal (``diag = 0`` for ``'negative_squared_distance'``).

    A static shape that is not square raises ``ValueError`` at once; the rest are ``tf.debugging`` asserts
    (``tf.errors.InvalidArgumentError``, raised at once in eager mode; XLA compiles asserts out).
    """
    why = (
        "S must be the Gram matrix X·Xᵀ of one embedding set (queries and documents are the same items), e.g. "
        "the joint Gram matrix of [text; image] embeddings; a two-tower text × image matrix is not one"
    )
    shape = scores.shape
    if shape.rank == 2 and shape[0] is not None and shape[1] is not None and shape[0] != shape[1]:
        raise ValueError(f"{owner} needs a square similarity matrix, got shape {shape}: {why}")
    square = tf.debugging.assert_equal(
        tf.shape(scores)[0], tf.shape(scores)[1], message=f"{owner} needs a square similarity matrix: {why}"
    )
    with tf.control_dependencies([square]):
        asymmetry = tf.reduce_max(tf.abs(scores - tf.transpose(scores)))
        diagonal = tf.linalg.diag_part(scores) - (1.0 if similarity == "cosine" else 0.0)
    checks = [
        square,
        tf.debugging.assert_less_equal(
            asymmetry, tolerance, message=f"{owner}: the similarity matrix is not symmetric: {why}"
        ),
        tf.debugging.assert_less_equal(
            tf.reduce_max(tf.abs(diagonal)),
            tolerance,
            message=f"{owner}: the diagonal of the similarity matrix is not "
            f"{'1 (unit vectors)' if similarity == 'cosine' else '0'}: {why}",
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(scores)

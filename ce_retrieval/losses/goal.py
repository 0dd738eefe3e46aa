"""GOAL: image-text objectives defined by their gradient (Xuan & Chen, WACV 2023; docs/goal.md).

GOAL does not define a loss. For every matched image/text pair ``i`` it forms two triplets on the similarity
matrix ``S`` (rows images, columns texts; see "Orientation" below) and *prescribes* their gradient:

* image anchor: positive ``p_i = S[i, i]``, hardest negative ``n_i = max_{j: R[i, j] = 0} S[i, j]`` at column a(i);
* text anchor:  positive ``p_i``,          hardest negative ``n'_i = max_{j: R[j, i] = 0} S[j, i]`` at row b(i);

    dL/dS = W,   W[i, i] -= t_i wp_i + t'_i wp'_i,   W[i, a(i)] += t_i wn_i,   W[b(i), i] += t'_i wn'_i,

with a triplet weight ``t = w_t(p, n)`` and pair weights ``wp, wn`` (all constants of the backward pass):

    w_t   constant: 1          nca: sigma(-tau (p - n))          circle: sigma(-tau (p (2 - p) - n^2 - 1/2))
    wp,wn constant: 1, 1       linear: 1 - p, n                   sigmoid: sigma(-a (p - lam)), sigma(b (n - lam))
    sigmoid-ms: wp = 1 / (e^{a (p_i - lam)} + r_p),   wn = 1 / (e^{-b (n_i - lam)} + r_n)
    linear-ms:  wp = (1 - r_p)(1 - p_i),             wn = (1 + r_n) n_i
    r_p = mean_{j != i matched, p_j <= n_i + eps} e^{a (p_i - p_j)}   (linear-ms: of p_i - p_j), 0 if empty
    r_n = mean_{j != a(i), R[i, j] = 0, S[i, j] >= min_k p_k - eps} e^{-b (n_i - S[i, j])}   (linear-ms: n_i - S[i, j])

(the text anchor uses column i instead of row i). Since ``S = X Y^T``, back-propagating ``W`` through ``S``
gives exactly goal.md's per-feature gradients ``dL/dX = W Y`` and ``dL/dY = W^T X``; it is attached to ``S``
with ``tf.custom_gradient``. Vectorised, no loop over the batch: one masked matrix with two max and two
first-index reductions mines the negatives, the MS sets cost one more pass over ``S`` (shared by both
directions) and a sort + searchsorted over the ``N`` pair scores, and ``W`` (3N non-zeros) is scattered in
the backward pass only. Scores are expected to be cosine similarities (goal.md's L2-normalised features).

Value versus gradient. The number returned (and logged by ``model.fit`` as ``loss``; the default name is
``goal_value``) is goal.md's *logging value* ``Sum_i (n_i - p_i) + Sum_i (n'_i - p_i)``, divided by the number
of matched pairs ``P`` by default (``average_over_pairs=True``, the library's mean-over-positive-pairs
convention; ``False`` gives goal.md's plain sums). The gradient applied to the model is ``W`` (divided by the
same ``P``), which is the gradient of that value **only** for ``constant x constant``. Never read a falling
value as the objective decreasing for the other 14 combinations: it is the hardest-negative margin, a
diagnostic.

Layout of ``y_true`` (goal.md assumes ``N`` matched pairs on the diagonal). ``S`` must be square; pair ``i`` is
``(image i, text i)``, so ``R[i, i]`` must be 1 (a matched pair) or -1 (no pair: row and column ``i`` give no
anchor but can still be mined as negatives of the others); ``R[i, i] = 0`` raises. Off-diagonal entries: 0 is
a negative (the only entries ever mined), -1 is ignored, and 1 is another correct match (e.g. two captions
of one image, as ``relevance_from_ids`` marks duplicated ids): it is neither mined nor pulled, because with
paired batches it duplicates a diagonal pair already pulled. So several positives per row are supported, the
number of distinct ids may be smaller than ``N``, and layouts whose matched pairs are not on the diagonal
(rectangular ``[N, M]``, permuted pairs) are rejected. An anchor whose row (column) holds no negative has no
image (text) triplet. Under ``jit_compile=True`` the run-time layout asserts are compiled out (as in the base
class): a zero diagonal entry then silently means "no pair".

Orientation. The objective is symmetric in the two anchors: transposing ``S`` (and ``R``) swaps the image-
and text-anchor triplet sets, and every weight depends only on the anchor's own row/column, the pair scores
``p`` and ``min_k p_k``, all invariant under transposition. Hence ``L(S^T, R^T) = L(S, R)`` and
``W(S^T) = W(S)^T``: pass goal.md's ``S = X Y^T`` or the two-tower model's ``S = Y X^T`` (rows texts, as the
other losses), the training update is identical. ``bidirectional`` is therefore not offered.

Distribution and mixed precision: the base class computes in float32; the caller's replica scaling (the train
step's ``1 / num_replicas_in_sync``) and a ``LossScaleOptimizer``'s loss scale reach ``W`` through the upstream
gradient, which the custom gradient multiplies it by.

Which combinations are the gradient of a known loss (derived in docs/goal.md and checked in the tests: for
the integrable ones ``W`` equals the autodiff gradient of the loss below, summed over both anchors; for the
others the Jacobian of ``S -> W`` is not symmetric, so no loss has this gradient):

==============  ===========================================================================================
combination     loss per triplet (p, n) whose gradient it is
==============  ===========================================================================================
constant x      ``n - p``: hardest-negative triplet (VSE++ max-violation) inside its margin, no margin
constant
constant x      ``((1 - p)^2 + n^2) / 2``: contrastive loss on d = 1 - cos with margin 1 (for n >= 0) on the
linear          hardest negative; also the gamma -> 0 limit of Circle loss
constant x      ``softplus(-a (p - lam)) / a + softplus(b (n - lam)) / b``: Multi-Similarity loss with one
sigmoid         positive and the hardest negative (= binomial deviance with MS scaling)
nca x constant  ``softplus(tau (n - p)) / tau``: NCA / logistic soft-margin triplet (2-way softmax, T = 1/tau)
circle x        ``softplus(tau ((1 - p)^2 + n^2 - 1/2)) / (2 tau)``: Circle loss (m = 1/2, gamma = tau) with
linear          its alphas differentiated (not detached), times 1 / (2 tau)
all 10 others   new (not integrable): nca x {linear, sigmoid}, circle x {constant, sigmoid}, and every
                ``*-ms`` pair weight (MS-style relative weights pooled over the other pairs of the batch)
==============  ===========================================================================================
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.registry import register

TRIPLET_WEIGHTS = ("constant", "nca", "circle")
PAIR_WEIGHTS = ("constant", "linear", "sigmoid", "linear-ms", "sigmoid-ms")

__all__ = ["GradientObjective", "goal_gradient", "gradient_objective"]


def goal_gradient(relevance, scores, *args, **kwargs) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Functional form: ``(value, W, num_pairs)`` for float32 ``relevance`` / ``scores`` of shape ``[N, N]``.

    ``value = Sum_i (n_i - p_i) + Sum_i (n'_i - p_i)`` and ``W`` (goal.md's dL/dS) are sums over anchors, not
    divided by ``num_pairs``. Arguments after ``scores`` are those of :class:`GradientObjective` (without
    ``average_over_pairs``). The weights are computed from ``scores`` as given: differentiating ``W`` with
    respect to ``scores`` is possible (the tests do it to check integrability) but is not what training does.
    """
    value, indices, updates, pairs = goal_terms(relevance, scores, *args, **kwargs)
    return value, tf.scatter_nd(indices, updates, tf.shape(scores)), pairs


def goal_terms(
    relevance,
    scores,
    triplet_weight: str = "circle",
    pair_weight: str = "sigmoid-ms",
    tau: float = 10.0,
    ms_alpha: float = 2.0,
    ms_beta: float = 10.0,
    ms_lambda: float = 0.5,
    ms_margin: float = 0.1,
):
    """``(value, indices [3N, 2], updates [3N], num_pairs)``: W = scatter_nd(indices, updates) has 3N non-zeros.

    ``W[i, i] = -(t_i wp_i + t'_i wp'_i)``, ``W[i, a(i)] = t_i wn_i``, ``W[b(i), i] = t'_i wn'_i`` (anchors
    without a triplet get 0), so the backward pass never materialises dense one-hot matrices.
    """
    _check_names(triplet_weight, pair_weight)
    s = tf.convert_to_tensor(scores, tf.float32)
    r = tf.convert_to_tensor(relevance, tf.float32)
    size = tf.shape(s)[0]
    index = tf.range(size)
    p = tf.linalg.diag_part(s)
    matched = tf.equal(tf.linalg.diag_part(r), 1.0)
    # R[i, i] is never 0 for a matched pair, so (i, i) needs no explicit exclusion from the negatives: it lies
    # only in row i and column i, which belong to anchor i, and anchor i exists only if R[i, i] = 1.
    negative = tf.equal(r, 0.0)

    # Hardest negatives of every image anchor (row) and text anchor (column), from one masked matrix.
    masked = tf.where(negative, s, float("-inf"))
    n_row, n_col = tf.reduce_max(masked, axis=1), tf.reduce_max(masked, axis=0)
    a_row, b_col = _first_index_of(masked, n_row, 1), _first_index_of(masked, n_col, 0)
    row_ok = matched & (n_row > float("-inf"))
    col_ok = matched & (n_col > float("-inf"))
    n_row, n_col = tf.where(row_ok, n_row, 0.0), tf.where(col_ok, n_col, 0.0)

    t_row, t_col = (_triplet_weight(triplet_weight, p, n, tau) for n in (n_row, n_col))
    if pair_weight.endswith("-ms"):
        linear = pair_weight == "linear-ms"
        sorted_p = tf.sort(tf.where(matched, p, float("inf")))
        p_min = tf.where(tf.reduce_any(matched), sorted_p[0], 0.0)
        r_p = _ms_positive_mean(sorted_p, p_min, p, matched, tf.concat([n_row, n_col], 0) + ms_margin, linear, ms_alpha)
        r_n_row, r_n_col = _ms_negative_means(
            s, negative, n_row, row_ok, n_col, col_ok, p_min - ms_margin, linear, ms_beta
        )
        r_p_row, r_p_col = r_p[:size], r_p[size:]
        if linear:
            wp_row, wp_col = (1.0 - r_p_row) * (1.0 - p), (1.0 - r_p_col) * (1.0 - p)
            wn_row, wn_col = (1.0 + r_n_row) * n_row, (1.0 + r_n_col) * n_col
        else:
            wp_row = 1.0 / (tf.exp(ms_alpha * (p - ms_lambda)) + r_p_row)
            wp_col = 1.0 / (tf.exp(ms_alpha * (p - ms_lambda)) + r_p_col)
            wn_row = 1.0 / (tf.exp(-ms_beta * (n_row - ms_lambda)) + r_n_row)
            wn_col = 1.0 / (tf.exp(-ms_beta * (n_col - ms_lambda)) + r_n_col)
    else:
        wp_row = wp_col = _positive_pair_weight(pair_weight, p, ms_alpha, ms_lambda)
        wn_row, wn_col = (_negative_pair_weight(pair_weight, n, ms_beta, ms_lambda) for n in (n_row, n_col))

    zero = tf.zeros_like(p)
    pull = tf.where(row_ok, t_row * wp_row, zero) + tf.where(col_ok, t_col * wp_col, zero)
    push_row = tf.where(row_ok, t_row * wn_row, zero)  # goes to W[i, a(i)]
    push_col = tf.where(col_ok, t_col * wn_col, zero)  # goes to W[b(i), i]
    indices = tf.concat([tf.stack([index, index], 1), tf.stack([index, a_row], 1), tf.stack([b_col, index], 1)], axis=0)
    updates = tf.concat([-pull, push_row, push_col], axis=0)
    value = tf.reduce_sum(tf.where(row_ok, n_row - p, zero)) + tf.reduce_sum(tf.where(col_ok, n_col - p, zero))
    return value, indices, updates, tf.reduce_sum(tf.cast(matched, tf.float32))


def _first_index_of(masked, maximum, axis):
    """Index of the first maximum along ``axis``, as ``argmax`` but with a defined tie-break and ~5x faster
    under XLA on CPU (a compare-select-min pass fuses; XLA's variadic arg-max reduction does not)."""
    size = tf.shape(masked)[axis]
    index = tf.range(size)
    candidates = tf.where(masked == tf.expand_dims(maximum, axis), tf.expand_dims(index, 1 - axis), size)
    return tf.minimum(tf.reduce_min(candidates, axis=axis), size - 1)  # all -inf rows: any index (weight 0)


def _triplet_weight(kind, p, n, tau):
    if kind == "constant":
        return tf.ones_like(p)
    if kind == "nca":  # 1 / (1 + e^{tau (p - n)})
        return tf.sigmoid(-tau * (p - n))
    return tf.sigmoid(-tau * (p * (2.0 - p) - tf.square(n) - 0.5))  # circle


def _positive_pair_weight(kind, p, alpha, lam):
    if kind == "constant":
        return tf.ones_like(p)
    if kind == "linear":
        return 1.0 - p
    return tf.sigmoid(-alpha * (p - lam))  # sigmoid: 1 / (e^{a (p - lam)} + 1)


def _negative_pair_weight(kind, n, beta, lam):
    if kind == "constant":
        return tf.ones_like(n)
    if kind == "linear":
        return n
    return tf.sigmoid(beta * (n - lam))  # sigmoid: 1 / (e^{-b (n - lam)} + 1)


def _ms_positive_mean(sorted_p, p_min, p, matched, thresholds, linear, alpha):
    """``r_p`` for 2N anchors (image anchors then text anchors) by one sort of the matched pair scores.

    ``sorted_p`` holds the matched ``p_j`` ascending (+inf for non-pairs); the set of anchor ``k`` is
    ``{j != k matched: p_j <= thresholds[k]}``: a prefix of ``sorted_p`` (searchsorted) minus the anchor itself.
    With ``u_j = e^{-a (p_j - p_min)}`` (in (0, 1], no overflow),
    ``Sum_j e^{a (p_k - p_j)} = e^{a (p_k - p_min)} Sum_j u_j``.
    """
    p2 = tf.concat([p, p], 0)
    self_in = tf.cast(tf.concat([matched, matched], 0) & (p2 <= thresholds), tf.float32)
    count = tf.searchsorted(sorted_p, thresholds, side="right")
    if linear:
        terms, own = tf.where(tf.math.is_finite(sorted_p), sorted_p, 0.0), p2
    else:
        terms, own = tf.exp(-alpha * (sorted_p - p_min)), tf.exp(-alpha * (p2 - p_min))
    prefix = tf.concat([tf.zeros([1]), tf.cumsum(terms)], 0)
    others = tf.gather(prefix, count) - self_in * own
    size = tf.cast(count, tf.float32) - self_in
    mean = others / tf.maximum(size, 1.0)
    mean = p2 - mean if linear else tf.exp(alpha * (p2 - p_min)) * tf.maximum(mean, 0.0)
    return tf.where(size > 0, mean, 0.0)


def _ms_negative_means(s, negative, n_row, row_ok, n_col, col_ok, floor, linear, beta):
    """``r_n`` of every image anchor (over its row) and text anchor (over its column).

    The candidate set ``{R = 0, S >= min_k p_k - eps}`` is the same matrix for both directions, and the terms
    factorise: ``n_i - S_ij`` gives ``n_i |set| - Sum S``, and
    ``e^{-b (n_i - S_ij)} = e^{b (c - n_i)} e^{b (S_ij - c)}``
    with ``c`` the largest negative score (so every factor stays <= e^{2b} for cosines): one pass over S serves
    both directions. The mined negative itself (``j = a(i)``) is then removed from the set (its term is ``0``
    for linear-ms, ``1`` for sigmoid-ms), which drops exactly one of several tied maxima, as ``j != a(i)`` does.
    """
    in_set = negative & (s >= floor)
    member = tf.cast(in_set, tf.float32)
    c = tf.reduce_max(tf.where(row_ok | col_ok, tf.maximum(n_row, n_col), float("-inf")))
    c = tf.where(tf.math.is_finite(c), c, 0.0)
    terms = tf.where(in_set, s, 0.0) if linear else tf.where(in_set, tf.exp(beta * (s - c)), 0.0)
    means = []
    for axis, hardest, ok in ((1, n_row, row_ok), (0, n_col, col_ok)):
        self_in = tf.cast(ok & (hardest >= floor), tf.float32)
        count = tf.reduce_sum(member, axis=axis) - self_in
        total = tf.reduce_sum(terms, axis=axis)
        if linear:  # Sum_{j != a(i)} (n_i - S_ij)
            mean = hardest - (total - self_in * hardest) / tf.maximum(count, 1.0)
        else:  # Sum_{j != a(i)} e^{-b (n_i - S_ij)}
            own = tf.exp(beta * (hardest - c))
            mean = tf.exp(beta * (c - hardest)) * tf.maximum(total - self_in * own, 0.0) / tf.maximum(count, 1.0)
        means.append(tf.where(count > 0, mean, 0.0))
    return means


def prescribe_gradient(x, value, gradient):
    """Returns ``value`` (a scalar) whose gradient with respect to ``x`` is ``gradient`` times the upstream one.

    ``value`` and ``gradient`` must not depend differentiably on ``x`` (compute them from ``stop_gradient(x)``).
    ``gradient`` may be a tensor shaped like ``x``, or a function ``upstream -> gradient`` (built lazily, in
    the backward pass only).
    """

    @tf.custom_gradient
    def _attach(x_):
        def grad(upstream):
            return gradient(upstream) if callable(gradient) else upstream * gradient

        return tf.identity(value), grad

    return _attach(x)


def gradient_objective(
    relevance,
    scores,
    triplet_weight: str = "circle",
    pair_weight: str = "sigmoid-ms",
    tau: float = 10.0,
    ms_alpha: float = 2.0,
    ms_beta: float = 10.0,
    ms_lambda: float = 0.5,
    ms_margin: float = 0.1,
    average_over_pairs: bool = True,
    name: str = "gradient_objective",
) -> tf.Tensor:
    """The GOAL logging value with the prescribed gradient ``W`` attached to ``scores`` (module docstring):
    arguments as :class:`GradientObjective`; ``name`` appears in the layout errors."""
    _check_options(triplet_weight, pair_weight, tau, ms_alpha, ms_beta)
    relevance, scores = _check_layout(relevance, scores, name)
    value, indices, updates, pairs = goal_terms(
        relevance,
        tf.stop_gradient(scores),
        triplet_weight,
        pair_weight,
        float(tau),
        float(ms_alpha),
        float(ms_beta),
        float(ms_lambda),
        float(ms_margin),
    )
    if average_over_pairs:
        value, updates = value / tf.maximum(pairs, 1.0), updates / tf.maximum(pairs, 1.0)
    updates, shape = tf.stop_gradient(updates), tf.shape(scores)
    return prescribe_gradient(scores, value, lambda upstream: tf.scatter_nd(indices, upstream * updates, shape))


@register
class GradientObjective(RetrievalLoss):
    """GOAL gradient objective on a square similarity matrix with matched pairs on the diagonal.

    The returned value is a logging value, not a loss whose gradient is applied: see the module docstring for
    the equations, the layout of ``y_true``, why orientation (``X Y^T`` or ``Y X^T``) does not matter, and the
    table of combinations that equal a known loss's gradient.

    Args:
      triplet_weight: ``'constant' | 'nca' | 'circle'``.
      pair_weight: ``'constant' | 'linear' | 'sigmoid' | 'linear-ms' | 'sigmoid-ms'``.
      tau: scale of the ``nca`` and ``circle`` triplet weights (10 in the paper's code).
      ms_alpha, ms_beta, ms_lambda: ``a``, ``b``, ``lambda`` of the sigmoid / MS pair weights (2, 10, 0.5).
      ms_margin: ``eps`` of the MS set mining (``p_j <= n_i + eps``, ``S >= min_k p_k - eps``; 0.1).
      average_over_pairs: divide value and gradient by the number of matched pairs (default) or use goal.md's
        sums over anchors (the paper's, and VSE++'s, scale; equivalent to a learning rate times ``P``).
      name: defaults to ``'goal_value'`` so that it reads as the logging value it is.

    ``S`` is the image × text matrix of matched pairs itself, not a Gram matrix (``needs_gram`` is false).

    Combinations equal to a known loss's gradient: ``constant x constant`` (hardest-negative triplet),
    ``constant x linear`` (contrastive, margin 1), ``constant x sigmoid`` (Multi-Similarity / binomial deviance
    on the hardest negative), ``nca x constant`` (NCA / soft-margin triplet), ``circle x linear`` (Circle loss,
    m = 1/2, gamma = tau, scaled 1 / (2 tau)); the 10 others are new. The paper's best is ``circle x sigmoid-ms``.
    """

    function = gradient_objective
    default_name = "goal_value"
    supports_bidirectional = False

    def __init__(
        self,
        triplet_weight: str = "circle",
        pair_weight: str = "sigmoid-ms",
        tau: float = 10.0,
        ms_alpha: float = 2.0,
        ms_beta: float = 10.0,
        ms_lambda: float = 0.5,
        ms_margin: float = 0.1,
        average_over_pairs: bool = True,
        name: str | None = None,
        **kwargs,
    ):
        _check_options(triplet_weight, pair_weight, tau, ms_alpha, ms_beta)
        super().__init__(name=name, **kwargs)
        self.triplet_weight, self.pair_weight = triplet_weight, pair_weight
        self.tau, self.ms_alpha, self.ms_beta = float(tau), float(ms_alpha), float(ms_beta)
        self.ms_lambda, self.ms_margin = float(ms_lambda), float(ms_margin)
        self.average_over_pairs = bool(average_over_pairs)

    def function_kwargs(self) -> dict:
        return {**self.hyperparameters(), "name": self.name}


def _check_options(triplet_weight, pair_weight, tau, ms_alpha, ms_beta):
    _check_names(triplet_weight, pair_weight)
    for key, val in (("tau", tau), ("ms_alpha", ms_alpha), ("ms_beta", ms_beta)):
        if not float(val) > 0:
            raise ValueError(f"GradientObjective: {key} must be > 0, got {val}")


def _check_names(triplet_weight, pair_weight):
    if triplet_weight not in TRIPLET_WEIGHTS:
        raise ValueError(
            f"GradientObjective: unknown triplet_weight {triplet_weight!r}; choose one of {TRIPLET_WEIGHTS}"
        )
    if pair_weight not in PAIR_WEIGHTS:
        raise ValueError(f"GradientObjective: unknown pair_weight {pair_weight!r}; choose one of {PAIR_WEIGHTS}")


def _check_layout(relevance, scores, name):
    shape = scores.shape
    if shape.rank == 2 and shape[0] is not None and shape[1] is not None and shape[0] != shape[1]:
        raise ValueError(
            f"{name}: GOAL needs a square similarity matrix with the matched pair (image i, text i) at S[i, i], "
            f"got shape {shape}; rectangular layouts (several texts per image as columns) are not supported"
        )
    diagonal = tf.linalg.diag_part(relevance)
    checks = [
        tf.debugging.assert_equal(
            tf.shape(scores)[0], tf.shape(scores)[1], message=f"{name}: GOAL needs a square similarity matrix"
        ),
        tf.debugging.assert_equal(
            tf.reduce_any(tf.equal(diagonal, 0.0)),
            False,
            message=f"{name}: y_true[i, i] is 0: GOAL needs the matched pairs on the diagonal "
            "(y_true[i, i] = 1 for a pair, -1 for no pair); align rows and columns",
        ),
        tf.debugging.assert_equal(
            tf.reduce_any(tf.equal(diagonal, 1.0)), True, message=f"{name}: no matched pair on the diagonal of y_true"
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(relevance), tf.identity(scores)

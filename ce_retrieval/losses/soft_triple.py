"""SoftTriple loss (Qian et al. 2019): a softmax over classes, each class represented by K centres.

``S = cos(E, W)`` has ``C·K`` columns, class-major (column ``c·K + k`` is centre ``k`` of class ``c``), as
:class:`ce_retrieval.modeling.proxies.ProxySimilarity` lays them out. The relaxed class similarity is a
soft maximum over a class's centres,

    S'_ic = Σ_k softmax_k(S_ick / γ) · S_ick,

and for each positive (example, class) pair ``(i, y)``:

    ℓ_iy = −log( e^{λ(S'_iy − δ)} / (e^{λ(S'_iy − δ)} + Σ_{c ∈ Neg_i} e^{λ S'_ic}) ).

Paper defaults: λ = 20, γ = 0.1, δ = 0.01, K = 10. With one label per example this is the paper's
cross-entropy; several positive classes (multi-label) each give a term, negatives are classes with
relevance 0, ``-1`` excludes a class. A class's relevance is read from its first centre's column.
Mean over positive (example, class) pairs. Equal to pytorch-metric-learning's ``SoftTripleLoss``.

The centre regulariser τ·R(W) (eq. 13) needs the centres, which the loss never sees: it is
:class:`ce_retrieval.modeling.proxies.SoftTripleCenterRegularizer`, set as the ``proxy_regularizer`` of the
proxy layer, so Keras adds it to ``model.losses`` (``model.fit`` minimises loss + τR, as in the paper).
The columns are centres (``needs_proxies``); each term reads one row (``needs_gram`` is false).
Functional core: :func:`soft_triple`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp, mean_over_positives
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT


def check_soft_triple(proxies_per_class, la, gamma, delta, owner: str):
    if int(proxies_per_class) < 1 or la <= 0 or gamma <= 0:
        raise ValueError(
            f"{owner}: need proxies_per_class >= 1, la > 0, gamma > 0; got {proxies_per_class}, {la}, {gamma}"
        )
    return int(proxies_per_class), float(la), float(gamma), float(delta)


def soft_triple(
    relevance, scores, proxies_per_class: int = 10, la: float = 20.0, gamma: float = 0.1, delta: float = 0.01
):
    """SoftTriple (module docstring) on ``[N, C·K]`` cosines, ``K = proxies_per_class`` centres per class."""
    k, la, gamma, delta = check_soft_triple(proxies_per_class, la, gamma, delta, "soft_triple")
    if scores.shape[-1] is not None and scores.shape[-1] % k:
        raise ValueError(f"SoftTripleLoss: {scores.shape[-1]} columns are not a multiple of proxies_per_class={k}")
    check = tf.debugging.assert_equal(
        tf.shape(scores)[1] % k, 0, message=f"SoftTripleLoss: columns are not a multiple of proxies_per_class={k}"
    )
    with tf.control_dependencies([check]):
        grouped = tf.reshape(scores, [tf.shape(scores)[0], -1, k])  # [N, C, K]
    weights = tf.nn.softmax(grouped / gamma, axis=-1)
    class_sim = tf.reduce_sum(weights * grouped, axis=-1)  # [N, C]
    class_rel = tf.reshape(relevance, [tf.shape(relevance)[0], -1, k])[:, :, 0]
    logits = la * class_sim
    log_neg = masked_logsumexp(logits, class_rel == IRRELEVANT)  # [N]
    has_neg = tf.reduce_any(class_rel == IRRELEVANT, axis=1)
    pos_logit = la * (class_sim - delta)
    # -log(e^a / (e^a + e^b)) = softplus(b - a), b = -inf (no negative) gives 0.
    per_pair = tf.where(has_neg[:, None], tf.nn.softplus(log_neg[:, None] - pos_logit), 0.0)
    return mean_over_positives(per_pair, tf.where(class_rel == RELEVANT, RELEVANT, IRRELEVANT))


@register
class SoftTripleLoss(RetrievalLoss):
    """SoftTriple on ``[N, C·K]`` cosines; see the module docstring."""

    function = soft_triple
    check = staticmethod(check_soft_triple)
    supports_bidirectional = False
    needs_proxies = True


__all__ = ["SoftTripleLoss"]

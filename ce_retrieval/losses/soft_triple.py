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
"""
from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._pairs import masked_logsumexp
from ce_retrieval.losses.base import IRRELEVANT, RELEVANT, RetrievalLoss, mean_over_positives
from ce_retrieval.losses.registry import register


@register
class SoftTripleLoss(RetrievalLoss):
    """SoftTriple on ``[N, C·K]`` cosines; see the module docstring."""

    supports_bidirectional = False
    requires_proxies = True

    def __init__(self, proxies_per_class: int = 10, la: float = 20.0, gamma: float = 0.1, delta: float = 0.01,
                 **kwargs):
        super().__init__(**kwargs)
        if int(proxies_per_class) < 1 or la <= 0 or gamma <= 0:
            raise ValueError(
                f"SoftTripleLoss: need proxies_per_class >= 1, la > 0, gamma > 0; got {proxies_per_class}, {la}, {gamma}"
            )
        self.proxies_per_class = int(proxies_per_class)
        self.la = float(la)
        self.gamma = float(gamma)
        self.delta = float(delta)

    def compute(self, relevance, scores):
        k = self.proxies_per_class
        if scores.shape[-1] is not None and scores.shape[-1] % k:
            raise ValueError(
                f"SoftTripleLoss: {scores.shape[-1]} columns are not a multiple of proxies_per_class={k}"
            )
        check = tf.debugging.assert_equal(
            tf.shape(scores)[1] % k, 0, message=f"SoftTripleLoss: columns are not a multiple of proxies_per_class={k}"
        )
        with tf.control_dependencies([check]):
            grouped = tf.reshape(scores, [tf.shape(scores)[0], -1, k])  # [N, C, K]
        weights = tf.nn.softmax(grouped / self.gamma, axis=-1)
        class_sim = tf.reduce_sum(weights * grouped, axis=-1)  # [N, C]
        class_rel = tf.reshape(relevance, [tf.shape(relevance)[0], -1, k])[:, :, 0]
        logits = self.la * class_sim
        log_neg = masked_logsumexp(logits, class_rel == IRRELEVANT)  # [N]
        has_neg = tf.reduce_any(class_rel == IRRELEVANT, axis=1)
        pos_logit = self.la * (class_sim - self.delta)
        # -log(e^a / (e^a + e^b)) = softplus(b - a), b = -inf (no negative) gives 0.
        per_pair = tf.where(has_neg[:, None], tf.nn.softplus(log_neg[:, None] - pos_logit), 0.0)
        return mean_over_positives(per_pair, tf.where(class_rel == RELEVANT, RELEVANT, IRRELEVANT))

    def get_config(self):
        return {**super().get_config(), "proxies_per_class": self.proxies_per_class, "la": self.la,
                "gamma": self.gamma, "delta": self.delta}


__all__ = ["SoftTripleLoss"]

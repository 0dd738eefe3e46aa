"""Proxy Anchor loss (Kim et al. 2020): each proxy is an anchor pulling its positives, pushing its negatives.

On ``S = cos(E, P)`` (columns are proxies, from :class:`ce_retrieval.modeling.proxies.ProxySimilarity`):

    L = 1/|P⁺| Σ_{p ∈ P⁺} log(1 + Σ_{x ∈ X_p⁺} e^{−α(s(x,p) − δ)})
      + 1/|P|  Σ_{p ∈ P}  log(1 + Σ_{x ∈ X_p⁻} e^{ α(s(x,p) + δ)})

``X_p⁺`` / ``X_p⁻``: the batch's embeddings with relevance 1 / 0 in column ``p`` (``-1`` excluded);
``P⁺``: proxies with at least one positive in the batch; ``P``: all proxies (columns). α = 32, δ = 0.1
(paper defaults). The terms are per proxy (column), not per positive pair: the reduction is the paper's,
identical to pytorch-metric-learning's ``ProxyAnchorLoss`` (negative term divided by the number of proxies).
With ``K > 1`` proxies per class each column is its own anchor. Functional core: :func:`proxy_anchor`.
The columns are proxies (``needs_proxies``); no Gram matrix is read (``needs_gram`` is false).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT


def check_proxy_anchor(alpha, delta, owner: str) -> tuple[float, float]:
    if not alpha > 0:
        raise ValueError(f"{owner}: alpha must be > 0, got {alpha}")
    return float(alpha), float(delta)


def proxy_anchor(relevance, scores, alpha: float = 32.0, delta: float = 0.1):
    """Proxy Anchor (module docstring) on ``S = cos(E, P)``: a term per proxy (column)."""
    alpha, delta = check_proxy_anchor(alpha, delta, "proxy_anchor")
    positive = relevance == RELEVANT
    negative = relevance == IRRELEVANT
    pos_term = masked_logsumexp(-alpha * (scores - delta), positive, axis=0, add_one=True)  # [M]
    neg_term = masked_logsumexp(alpha * (scores + delta), negative, axis=0, add_one=True)  # [M]
    with_pos = tf.cast(tf.reduce_any(positive, axis=0), tf.float32)
    num_with_pos = tf.maximum(tf.reduce_sum(with_pos), 1.0)
    num_proxies = tf.cast(tf.shape(scores)[1], tf.float32)
    return tf.reduce_sum(pos_term * with_pos) / num_with_pos + tf.reduce_sum(neg_term) / num_proxies


@register
class ProxyAnchorLoss(RetrievalLoss):
    """Proxy Anchor on cosine similarities; ``alpha`` (scale α) and ``delta`` (margin δ) as in the paper."""

    function = proxy_anchor
    check = staticmethod(check_proxy_anchor)
    supports_bidirectional = False
    needs_proxies = True


__all__ = ["ProxyAnchorLoss"]

"""ProxyNCA (Movshovitz-Attias et al. 2017) and the ProxyNCA++ conventions (Teh et al. 2020).

NCA (see ``nca.py``) with learned class proxies as the documents: ``S = cos(E, P)`` from
:class:`ce_retrieval.modeling.proxies.ProxySimilarity`, relevance from
:func:`ce_retrieval.modeling.proxies.proxy_relevance`. For an embedding ``x`` of class ``y``, with unit-norm
``x`` and proxies and ``d² = ‖x − p‖² = 2 − 2·cos``:

    ProxyNCA++ (default):  L = −log( Σ_{p ∈ P(y)} e^{−d²(x,p)/T} / Σ_{all p} e^{−d²(x,p)/T} )
    ProxyNCA (original):   L = −log( Σ_{p ∈ P(y)} e^{−d²(x,p)}   / Σ_{p ∉ P(y)} e^{−d²(x,p)} )

``scale = 1/T``; the default 9 is ProxyNCA++'s T = 1/9 (with ``d² = 2 − 2 cos`` this equals a softmax over
``18·cos``). ``include_positives_in_denominator=False`` with ``scale=1`` is the original (whose value may be
negative). ``P(y)`` is the ``K`` proxies of class ``y`` (``K = 1`` in both papers). ProxyNCA++'s other
ingredients (global max pooling, fast proxy learning rate) belong to the backbone and optimiser, not here;
give the proxy layer its own learning rate through the optimiser if wanted.
Matches pytorch-metric-learning's ``ProxyNCALoss(softmax_scale=scale)`` (which normalises embeddings and
proxies and includes positives). Mean over queries (one positive class per query).

The logit scale is λ = 2·scale, as for :class:`~ce_retrieval.losses.NCALoss`. Functional core: :func:`proxy_nca`.
The columns are proxies (``needs_proxies``); each term reads one row (``needs_gram`` is false).
"""

from __future__ import annotations

from ce_retrieval.losses.nca import NCALoss, nca
from ce_retrieval.losses.registry import register


def proxy_nca(
    relevance,
    scores,
    scale: float = 9.0,
    include_positives_in_denominator: bool = True,
    similarity: str = "cosine",
    objective: str = "log",
):
    """ProxyNCA++ (default) or, with ``include_positives_in_denominator=False``, the original ProxyNCA."""
    return nca(relevance, scores, scale, similarity, objective, include_positives_in_denominator)


@register
class ProxyNCALoss(NCALoss):
    """ProxyNCA / ProxyNCA++ on ``S = cos(E, proxies)``; see the module docstring."""

    function = proxy_nca
    supports_bidirectional = False
    needs_proxies = True

    def __init__(
        self,
        scale: float = 9.0,
        include_positives_in_denominator: bool = True,
        similarity: str = "cosine",
        objective: str = "log",
        **kwargs,
    ):
        super().__init__(scale=scale, similarity=similarity, objective=objective, **kwargs)
        self.include_positives_in_denominator = bool(include_positives_in_denominator)


__all__ = ["ProxyNCALoss"]

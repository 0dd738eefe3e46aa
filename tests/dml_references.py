"""Independent float64 NumPy references (plain loops) for the proxy / NCA / LMNN / centroid losses."""
import numpy as np


def _lse(v):
    m = np.max(v)
    return m + np.log(np.sum(np.exp(v - m)))


def nca(rel, s, scale=1.0, objective="log", include_positives=True, sq=None):
    d2 = np.maximum(2 - 2 * s, 0) if sq is None else -s
    terms = []
    for i in range(len(s)):
        logits = -scale * d2[i]
        pos, neg = rel[i] == 1, rel[i] == 0
        den = pos | neg if include_positives else neg
        if not pos.any() or not den.any():
            continue
        log_p = _lse(logits[pos]) - _lse(logits[den])
        terms.append(-log_p if objective == "log" else 1 - np.exp(log_p))
    return float(np.mean(terms))


def proxy_anchor(rel, s, alpha=32.0, delta=0.1):
    pos_terms, neg_total = [], 0.0
    for p in range(s.shape[1]):
        pos, neg = rel[:, p] == 1, rel[:, p] == 0
        if pos.any():
            pos_terms.append(np.log1p(np.sum(np.exp(-alpha * (s[pos, p] - delta)))))
        neg_total += np.log1p(np.sum(np.exp(alpha * (s[neg, p] + delta))))
    return float(np.mean(pos_terms) + neg_total / s.shape[1])


def soft_triple(rel, s, k, la=20.0, gamma=0.1, delta=0.01):
    n, m = s.shape
    terms = []
    for i in range(n):
        cls_sim = []
        for c in range(m // k):
            block = s[i, c * k:(c + 1) * k]
            w = np.exp(block / gamma - _lse(block / gamma))
            cls_sim.append(np.sum(w * block))
        cls_sim = np.array(cls_sim)
        cls_rel = rel[i, ::k]
        for y in np.flatnonzero(cls_rel == 1):
            pos = la * (cls_sim[y] - delta)
            negs = la * cls_sim[cls_rel == 0]
            terms.append(-(pos - _lse(np.concatenate([[pos], negs]))))
    return float(np.mean(terms))


def lmnn(rel, s, k=3, margin=1.0, lam=0.5, sq=None):
    d2 = np.maximum(2 - 2 * s, 0) if sq is None else -s
    terms = []
    for i in range(len(s)):
        pos = np.flatnonzero(rel[i] == 1)
        targets = pos[np.argsort(d2[i, pos], kind="stable")]
        if k is not None:
            targets = targets[:k]
        for j in targets:
            push = sum(max(0.0, margin + d2[i, j] - d2[i, m]) for m in np.flatnonzero(rel[i] == 0))
            terms.append((1 - lam) * d2[i, j] + lam * push)
    return float(np.mean(terms))


def centroid_bound(rel, s):
    d = np.sqrt(np.maximum(2 - 2 * s, 1e-12))
    terms = []
    for i in range(len(s)):
        neg = rel[i] == 0
        for y in np.flatnonzero(rel[i] == 1):
            terms.append(d[i, y] - np.mean(d[i, neg]) / 3.0 if neg.any() else d[i, y])
    return float(np.mean(terms))

"""Independent float64 NumPy references of every loss, for the tests: explicit loops over pairs, triplets and
queries written straight from the papers (not from the library's vectorised code).

One convention for all: ``fn(relevance, scores, **hyper) -> float`` with ``relevance`` (R, in {-1, 0, 1}) and
``scores`` (S) both ``[N, M]``, as the library's functional API; ``R == -1`` pairs appear nowhere.
"""

import math

import numpy as np


def softplus(x):
    return np.logaddexp(0.0, x)


def _lse(v):
    m = np.max(v)
    return m + np.log(np.sum(np.exp(v - m)))


def pos_pairs(r):
    return [(i, j) for i in range(r.shape[0]) for j in range(r.shape[1]) if r[i, j] == 1]


def negs(r, i):
    return [k for k in range(r.shape[1]) if r[i, k] == 0]


def dist(s, kind):
    sq = np.maximum(2.0 - 2.0 * s, 0.0)
    return {"squared_euclidean": sq, "euclidean": np.sqrt(np.maximum(sq, 1e-12)), "cosine": 1.0 - s}[kind]


# ---- the softmax family (Veit & Wilber 2020, eqs. 2-6) and the margin softmax losses ---------------------------


def psi(c, m):
    """L-Softmax's psi_m(theta) = (-1)^k cos(m theta) - 2k, k = floor(m theta / pi) (from the angle)."""
    theta = np.arccos(np.clip(c, -1.0, 1.0))
    k = np.clip(np.floor(m * theta / np.pi), 0, m - 1)
    return (-1.0) ** k * np.cos(m * theta) - 2.0 * k


def sphereface(c, m, lam):
    """A-Softmax's margined cosine (lam cos(theta) + psi_m(theta)) / (1 + lam)."""
    return (lam * np.clip(c, -1.0, 1.0) + psi(c, m)) / (1.0 + lam)


def arcface(c, m):
    """ArcFace's cos(theta + m), and cos(theta) - m sin(m) once theta + m > pi."""
    theta = np.arccos(np.clip(c, -1.0, 1.0))
    return np.where(theta + m <= np.pi, np.cos(theta + m), c - m * np.sin(m))


def softmax(relevance, scores, scale=20.0, cross_example=False, fraction=None, top_k=None, positive_fn=None):
    """Mean over positive pairs of ``-log(e^p_ij / (e^p_ij + sum_{l in topk(Neg)} e^l))`` with logits
    ``l = scale * S`` and ``p_ij = scale * positive_fn(s_ij)`` (no margin by default), written out with sorts.

    ``Neg``: the row's negatives, or every negative of the batch with ``cross_example``; mining keeps the top
    ``ceil(fraction * n)`` or ``min(top_k, n)`` of them.
    """
    relevance = np.asarray(relevance, np.float64)
    logits = scale * np.asarray(scores, np.float64)

    def keep(negatives):
        negatives = np.sort(negatives)[::-1]
        n = len(negatives)
        if top_k is not None:
            return negatives[: min(top_k, n)]
        if fraction is not None:
            return negatives[: math.ceil(fraction * n)]
        return negatives

    batch_negatives = keep(logits[relevance == 0])
    terms = []
    for i in range(relevance.shape[0]):
        negatives = batch_negatives if cross_example else keep(logits[i][relevance[i] == 0])
        log_z = np.logaddexp.reduce(negatives) if len(negatives) else -np.inf
        for j in np.flatnonzero(relevance[i] == 1):
            p = logits[i, j] if positive_fn is None else scale * positive_fn(float(scores[i, j]))
            terms.append(np.logaddexp(p, log_z) - p)
    return float(np.mean(terms))


# ---- pair and triplet losses ------------------------------------------------------------------------------


def contrastive(r, s, margin=1.0, balanced=False):
    d = np.sqrt(np.maximum(2 - 2 * s, 1e-12))
    pos = [0.5 * d[i, j] ** 2 for i, j in zip(*np.nonzero(r == 1), strict=True)]
    neg = [0.5 * max(margin - d[i, j], 0.0) ** 2 for i, j in zip(*np.nonzero(r == 0), strict=True)]
    if balanced:
        return (np.mean(pos) if pos else 0.0) + (np.mean(neg) if neg else 0.0)
    return float(np.mean(pos + neg))


def triplet(r, s, margin=0.2, mining="all", distance="squared_euclidean", positive_mining="all", average_nonzero=False):
    d = dist(s, distance)
    terms, per_pair = [], []
    for a in range(s.shape[0]):
        ns = negs(r, a)
        ps = [j for j in range(s.shape[1]) if r[a, j] == 1]
        if not ns or not ps:
            continue
        if positive_mining == "hard":
            ps = [max(ps, key=lambda j: (d[a, j], -j))]
        for p in ps:
            if mining == "all":
                losses = [max(margin + d[a, p] - d[a, n], 0.0) for n in ns]
                terms += losses
                per_pair.append(np.mean(losses))
                continue
            if mining == "hard":
                n = min(ns, key=lambda n: d[a, n])
            else:  # semi-hard: closest negative farther than p, else farthest negative
                farther = [n for n in ns if d[a, n] > d[a, p]]
                n = min(farther, key=lambda n: d[a, n]) if farther else max(ns, key=lambda n: d[a, n])
            per_pair.append(max(margin + d[a, p] - d[a, n], 0.0))
    if mining == "all" and average_nonzero:
        active = [t for t in terms if t > 0]
        return float(np.sum(active) / max(len(active), 1))
    return float(np.mean(per_pair)) if per_pair else 0.0


def lifted(r, s, margin=1.0):
    d = dist(s, "euclidean")
    out = []
    for i, j in pos_pairs(r):
        terms = [math.exp(margin - d[i, k]) for k in range(s.shape[1]) if r[i, k] == 0]
        terms += [math.exp(margin - d[q, j]) for q in range(s.shape[0]) if r[q, j] == 0]
        jij = math.log(sum(terms)) + d[i, j] if terms else -np.inf
        out.append(max(jij, 0.0) ** 2)
    return 0.5 * float(np.mean(out))


def npair(r, s, scale=1.0):
    out = []
    for i, j in pos_pairs(r):
        out.append(math.log(1.0 + sum(math.exp(scale * (s[i, k] - s[i, j])) for k in negs(r, i))))
    return float(np.mean(out))


def angular(r, s, alpha=40.0, with_npair=False, npair_weight=2.0):
    t2 = math.tan(math.radians(alpha)) ** 2
    out = []
    for a, p in pos_pairs(r):
        f = [4 * t2 * (s[a, n] + s[p, n]) - 2 * (1 + t2) * s[a, p] for n in negs(r, a)]
        out.append(math.log(1.0 + sum(math.exp(x) for x in f)))
    value = float(np.mean(out))
    return value * npair_weight + npair(r, s) if with_npair else value


def multi_similarity(r, s, alpha=2.0, beta=50.0, lam=0.5, eps=0.1, mining=True):
    out = []
    for i in range(s.shape[0]):
        ps = [j for j in range(s.shape[1]) if r[i, j] == 1]
        ns = negs(r, i)
        if not ps:
            continue
        if mining:
            if not ns:
                out.append(0.0)
                continue
            kp = [j for j in ps if s[i, j] - eps < max(s[i, n] for n in ns)]
            kn = [n for n in ns if s[i, n] + eps > min(s[i, j] for j in ps)]
            if not kp or not kn:
                out.append(0.0)
                continue
            ps, ns = kp, kn
        pos = math.log(1 + sum(math.exp(-alpha * (s[i, j] - lam)) for j in ps)) / alpha
        neg = math.log(1 + sum(math.exp(beta * (s[i, n] - lam)) for n in ns)) / beta
        out.append(pos + neg)
    return float(np.mean(out))


def circle(r, s, m=0.25, gamma=256.0, weights_from=None):
    """``weights_from``: the S at which the (detached) alphas are evaluated; default S itself."""
    w = s if weights_from is None else weights_from
    out = []
    for i in range(s.shape[0]):
        ps = [j for j in range(s.shape[1]) if r[i, j] == 1]
        ns = negs(r, i)
        if not ps or not ns:
            continue
        lp = [-gamma * max(1 + m - w[i, j], 0) * (s[i, j] - (1 - m)) for j in ps]
        ln = [gamma * max(w[i, n] + m, 0) * (s[i, n] - m) for n in ns]
        lse = np.logaddexp.reduce(lp) + np.logaddexp.reduce(ln)
        out.append(softplus(lse))
    return float(np.mean(out))


def binomial(r, s, alpha=2.0, beta=0.5, cost=25.0):
    pos = [softplus(-alpha * (s[i, j] - beta)) for i, j in zip(*np.nonzero(r == 1), strict=True)]
    neg = [softplus(alpha * cost * (s[i, j] - beta)) for i, j in zip(*np.nonzero(r == 0), strict=True)]
    return float(np.mean(pos) + np.mean(neg))


# ---- neighbourhood and proxy losses ------------------------------------------------------------------------


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
            block = s[i, c * k : (c + 1) * k]
            w = np.exp(block / gamma - _lse(block / gamma))
            cls_sim.append(np.sum(w * block))
        cls_sim = np.array(cls_sim)
        cls_rel = rel[i, ::k]
        for y in np.flatnonzero(cls_rel == 1):
            pos = la * (cls_sim[y] - delta)
            negs_ = la * cls_sim[cls_rel == 0]
            terms.append(-(pos - _lse(np.concatenate([[pos], negs_]))))
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


# ---- SigLIP (Zhai et al. 2023) and Threshold-Consistent Margin (Zhang et al. 2024) -----------------------------


def sigmoid(r, s, scale=10.0, bias=-10.0):
    """SigLIP: ``-1/N sum_{i,j: r != -1} log sigmoid(z_ij (scale s_ij + bias))``, z = +1 on positives, -1 on
    negatives, one pair at a time (``log sigmoid(x) = -log(1 + e^-x)``)."""
    total = 0.0
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            if r[i, j] == -1:
                continue
            z = 1.0 if r[i, j] == 1 else -1.0
            log_sigmoid = -np.logaddexp(0.0, -z * (scale * s[i, j] + bias))
            total -= log_sigmoid
    return total / r.shape[0]


def threshold_consistent_margin(r, s, margin_plus=0.9, margin_minus=0.5, weight_plus=1.0, weight_minus=1.0):
    """TCM: ``w+ mean_{pos, s <= m+} (m+ - s) + w- mean_{neg, s >= m-} (s - m-)`` (a part with no violating
    pair is 0), written with Python lists."""
    pos = [margin_plus - s[i, j] for i, j in pos_pairs(r) if s[i, j] <= margin_plus]
    neg = [s[i, j] - margin_minus for i in range(r.shape[0]) for j in negs(r, i) if s[i, j] >= margin_minus]
    pos_part = sum(pos) / len(pos) if pos else 0.0
    neg_part = sum(neg) / len(neg) if neg else 0.0
    return weight_plus * pos_part + weight_minus * neg_part


def mixed_softmax(relevance, scores, scale=20.0, cross_weight=0.5):
    """``(1 - α) · softmax(row negatives) + α · softmax(batch negatives)``, independently of the TF code."""
    row = softmax(relevance, scores, scale, cross_example=False)
    cross = softmax(relevance, scores, scale, cross_example=True)
    return (1.0 - cross_weight) * row + cross_weight * cross

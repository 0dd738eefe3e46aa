"""Independent NumPy (float64) transcriptions of the pair/triplet loss equations, written as explicit loops
over pairs and triplets straight from the papers, for the tests. Arguments: S [N, M], R in {-1, 0, 1}."""
import math

import numpy as np


def softplus(x):
    return np.logaddexp(0.0, x)


def pos_pairs(r):
    return [(i, j) for i in range(r.shape[0]) for j in range(r.shape[1]) if r[i, j] == 1]


def negs(r, i):
    return [k for k in range(r.shape[1]) if r[i, k] == 0]


def dist(s, kind):
    sq = np.maximum(2.0 - 2.0 * s, 0.0)
    return {"squared_euclidean": sq, "euclidean": np.sqrt(np.maximum(sq, 1e-12)), "cosine": 1.0 - s}[kind]


def contrastive(s, r, margin=1.0, balanced=False):
    d = np.sqrt(np.maximum(2 - 2 * s, 1e-12))
    pos = [0.5 * d[i, j] ** 2 for i, j in zip(*np.nonzero(r == 1), strict=True)]
    neg = [0.5 * max(margin - d[i, j], 0.0) ** 2 for i, j in zip(*np.nonzero(r == 0), strict=True)]
    if balanced:
        return (np.mean(pos) if pos else 0.0) + (np.mean(neg) if neg else 0.0)
    return float(np.mean(pos + neg))


def triplet(s, r, margin=0.2, mining="all", distance="squared_euclidean", positive_mining="all", average_nonzero=False):
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


def lifted(s, r, margin=1.0):
    d = dist(s, "euclidean")
    out = []
    for i, j in pos_pairs(r):
        terms = [math.exp(margin - d[i, k]) for k in range(s.shape[1]) if r[i, k] == 0]
        terms += [math.exp(margin - d[q, j]) for q in range(s.shape[0]) if r[q, j] == 0]
        jij = math.log(sum(terms)) + d[i, j] if terms else -np.inf
        out.append(max(jij, 0.0) ** 2)
    return 0.5 * float(np.mean(out))


def npair(s, r, scale=1.0):
    out = []
    for i, j in pos_pairs(r):
        out.append(math.log(1.0 + sum(math.exp(scale * (s[i, k] - s[i, j])) for k in negs(r, i))))
    return float(np.mean(out))


def angular(s, r, alpha=40.0, with_npair=False, npair_weight=2.0):
    t2 = math.tan(math.radians(alpha)) ** 2
    out = []
    for a, p in pos_pairs(r):
        f = [4 * t2 * (s[a, n] + s[p, n]) - 2 * (1 + t2) * s[a, p] for n in negs(r, a)]
        out.append(math.log(1.0 + sum(math.exp(x) for x in f)))
    value = float(np.mean(out))
    return value * npair_weight + npair(s, r) if with_npair else value


def multi_similarity(s, r, alpha=2.0, beta=50.0, lam=0.5, eps=0.1, mining=True):
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


def circle(s, r, m=0.25, gamma=256.0, weights_from=None):
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


def binomial(s, r, alpha=2.0, beta=0.5, cost=25.0):
    pos = [softplus(-alpha * (s[i, j] - beta)) for i, j in zip(*np.nonzero(r == 1), strict=True)]
    neg = [softplus(alpha * cost * (s[i, j] - beta)) for i, j in zip(*np.nonzero(r == 0), strict=True)]
    return float(np.mean(pos) + np.mean(neg))

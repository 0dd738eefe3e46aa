"""Class-labelled retrieval metrics for single-modality metric learning (leave-one-out).

Every example is a query against all the others (itself excluded), and the relevant items are the other
examples of its class (``R = class size − 1``). Scores are dot products of the given embeddings
(normalise first for cosine), exactly as in :mod:`ce_retrieval.evaluation` for two towers.

* ``recall@k``: 1 if one of the ``k`` best-scoring other examples shares the query's label (the DML
  literature's Recall@K), averaged over queries;
* ``precision@1``: the fraction of queries whose nearest neighbour shares their label;
* ``map@r`` (Musgrave et al. 2020, "A metric learning reality check"):
  ``MAP@R = mean_q 1/R Σ_{i=1}^{R} P(i)·rel(i)``, ``P(i)`` the precision at rank ``i``; and ``r_precision``;
* ``nmi``: normalised mutual information between the labels and k-means clusters (``k`` = number of
  classes, scikit-learn);
* ``pi_intra``, ``pi_inter``, ``pi_ratio`` (ProbML 16.2.5.3; Roth et al. 2020): the mean Euclidean
  distance over ordered same-class pairs ``i ≠ j``; the mean distance between class means ``μ_c, μ_c'`` over
  ``c ≠ c'``; and their ratio.

Queries whose class has a single example have nothing to retrieve and are left out of the retrieval
metrics (as pytorch-metric-learning's ``AccuracyCalculator`` does); ``num_queries`` says how many count.
Memory is bounded: queries are processed in blocks of ``chunk_size`` rows (``O(chunk_size · N)``).
"""

from __future__ import annotations

import numpy as np


def labelled_retrieval_metrics(
    embeddings, labels, ks=(1, 2, 4, 8), chunk_size: int = 1024, compute_nmi: bool = True, seed: int = 0
) -> dict:
    """All metrics of the module docstring as a flat dict of floats (``recall@k`` keys per ``k``)."""
    x = np.asarray(embeddings, dtype=np.float32)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(
            f"labelled_retrieval_metrics: need embeddings [N, D] and labels [N], got {x.shape} and {y.shape}"
        )
    if len(x) < 2:
        raise ValueError("labelled_retrieval_metrics: need at least two examples")
    if not np.all(np.isfinite(x)):
        raise ValueError("labelled_retrieval_metrics: embeddings contain NaN or Inf")
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"labelled_retrieval_metrics: ks must be positive integers, got {ks}")
    n = len(x)
    classes, y_idx, counts = np.unique(y, return_inverse=True, return_counts=True)
    relevant = counts[y_idx] - 1  # R per query
    k_max = int(min(n - 1, max(ks[-1], relevant.max())))
    sq_norm = np.sum(x.astype(np.float64) ** 2, axis=1)

    hits = {k: 0.0 for k in ks}
    ap_sum = r_prec_sum = 0.0
    intra_sum = 0.0
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = x[start:stop] @ x.T  # [B, N]
        rows = np.arange(stop - start)
        same = y_idx[start:stop, None] == y_idx[None, :]
        d2 = np.maximum(sq_norm[start:stop, None] + sq_norm[None, :] - 2.0 * scores.astype(np.float64), 0.0)
        same_other = same.copy()
        same_other[rows, rows + start] = False
        intra_sum += float(np.sum(np.sqrt(d2[same_other])))

        scores[rows, rows + start] = -np.inf  # leave one out
        top = np.argpartition(-scores, k_max - 1, axis=1)[:, :k_max] if k_max < n else np.argsort(-scores, 1)
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)[:, :k_max]
        match = np.take_along_axis(same, top, axis=1)  # [B, k_max] relevance of ranked results
        r = relevant[start:stop]
        keep = r > 0
        for k in ks:
            hits[k] += float(np.sum(np.any(match[keep, :k], axis=1)))
        within_r = np.arange(k_max)[None, :] < r[:, None]
        m = match & within_r
        precision_at_i = np.cumsum(m, axis=1) / np.arange(1, k_max + 1)[None, :]
        r_safe = np.maximum(r, 1)
        ap_sum += float(np.sum((np.sum(precision_at_i * m, axis=1) / r_safe)[keep]))
        r_prec_sum += float(np.sum((np.sum(m, axis=1) / r_safe)[keep]))

    num_queries = int(np.sum(relevant > 0))
    denom = max(num_queries, 1)
    out = {f"recall@{k}": hits[k] / denom for k in ks}
    out["precision@1"] = hits[1] / denom if 1 in ks else _precision_at_1(x, y_idx, relevant, chunk_size)
    out["map@r"] = ap_sum / denom
    out["r_precision"] = r_prec_sum / denom
    out["num_queries"] = num_queries

    num_intra_pairs = float(np.sum(counts * (counts - 1)))
    out["pi_intra"] = intra_sum / num_intra_pairs if num_intra_pairs else float("nan")
    out["pi_inter"] = _mean_inter_class_distance(x, y_idx, len(classes))
    out["pi_ratio"] = out["pi_intra"] / out["pi_inter"] if out["pi_inter"] > 0 else float("nan")
    if compute_nmi:
        out["nmi"] = kmeans_nmi(x, y_idx, len(classes), seed=seed)
    return out


def _precision_at_1(x, y_idx, relevant, chunk_size):
    correct = 0
    for start in range(0, len(x), chunk_size):
        stop = min(start + chunk_size, len(x))
        scores = x[start:stop] @ x.T
        rows = np.arange(stop - start)
        scores[rows, rows + start] = -np.inf
        nearest = np.argmax(scores, axis=1)
        keep = relevant[start:stop] > 0
        correct += int(np.sum((y_idx[nearest] == y_idx[start:stop])[keep]))
    return correct / max(int(np.sum(relevant > 0)), 1)


def _mean_inter_class_distance(x, y_idx, num_classes):
    if num_classes < 2:
        return float("nan")
    sums = np.zeros((num_classes, x.shape[1]))
    np.add.at(sums, y_idx, x.astype(np.float64))
    means = sums / np.bincount(y_idx, minlength=num_classes)[:, None]
    sq = np.sum(means**2, axis=1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * means @ means.T, 0.0))
    np.fill_diagonal(dist, 0.0)
    return float(dist.sum() / (num_classes * (num_classes - 1)))


def kmeans_nmi(embeddings, labels, num_clusters: int | None = None, seed: int = 0) -> float:
    """NMI between ``labels`` and k-means clusters of ``embeddings`` (``num_clusters`` = number of labels)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    labels = np.asarray(labels)
    k = int(num_clusters or len(np.unique(labels)))
    clusters = KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(np.asarray(embeddings, np.float64))
    return float(normalized_mutual_info_score(labels, clusters))


__all__ = ["kmeans_nmi", "labelled_retrieval_metrics"]

"""Relevance given as pairs (``positives=(rows, cols)``) in the rates, the probability map and ``calibrate_split``:
the same results as id equality where ids can express it, brute-force counts where they cannot (a caption
relevant to several images that other captions share only in part)."""

import numpy as np
import pytest

from ce_retrieval.evaluation._arrays import positive_pairs
from ce_retrieval.evaluation.guarantee import measure_rates
from ce_retrieval.evaluation.probability import fit_probability_map
from ce_retrieval.evaluation.split_calibration import calibrate_split


def unit_rows(rng, n, d=8):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def split():
    """90 captions of 30 images (3 each), each caption pulled towards its image."""
    rng = np.random.default_rng(0)
    docs = unit_rows(rng, 30)
    qids = np.repeat(np.arange(30), 3)
    q = docs[qids] + 0.6 * unit_rows(rng, 90)
    return q / np.linalg.norm(q, axis=1, keepdims=True), docs, qids, np.arange(30)


def test_pairs_from_ids_give_what_ids_give(split):
    q, docs, qids, dids = split
    rows, cols = positive_pairs(qids, dids)
    shuffled = np.random.default_rng(1).permutation(len(rows))  # any order: they are sorted on the way in
    by_ids = calibrate_split(q, docs, qids, dids, levels=(0.5, 0.8))
    by_pairs = calibrate_split(q, docs, qids, dids, levels=(0.5, 0.8), positives=(rows[shuffled], cols[shuffled]))
    assert by_pairs.to_json() == by_ids.to_json()
    assert by_pairs.for_gallery(1000) == by_ids.for_gallery(1000)


def test_several_relevant_documents_per_query_count_as_brute_force_does(split):
    q, docs, qids, dids = split
    relevant = qids[:, None] == dids[None, :]
    relevant[::4, 7] = True  # every fourth caption is also relevant to image 7 (shared in part)
    relevant[5, :] = False  # a caption with no relevant image: negatives only
    rows, cols = np.nonzero(relevant)
    units = np.arange(len(q))  # each caption its own unit
    rates = measure_rates(q, docs, units, dids, grid_size=16, positives=(rows, cols))
    s = q @ docs.T
    for t, tp, fp in zip(rates.thresholds, rates.tp, rates.fp, strict=True):
        assert tp == np.sum((s >= t) & relevant) and fp == np.sum((s >= t) & ~relevant)
    assert rates.num_positives == relevant.sum() and rates.num_queries == len(q)
    pmap = fit_probability_map(q, docs, units, dids, positives=(rows, cols))
    assert pmap.num_positives == relevant.sum() and pmap.num_pairs == relevant.size


def test_bad_positives_are_named(split):
    q, docs, qids, dids = split
    with pytest.raises(ValueError, match="out of range"):
        measure_rates(q, docs, qids, dids, positives=([0], [30]))
    with pytest.raises(ValueError, match="given twice"):
        measure_rates(q, docs, qids, dids, positives=([0, 0], [1, 1]))
    with pytest.raises(ValueError, match="no positive pairs"):
        fit_probability_map(q, docs, qids, dids, positives=(np.array([], int), np.array([], int)))
    with pytest.raises(ValueError, match="one length"):
        calibrate_split(q, docs, qids, dids, positives=([0, 1], [1]))


def test_an_item_relevant_across_query_units_clusters_its_pairs_by_item_too(split):
    """The design effect of the relevant pairs' rate: two-way clustered (units + documents) once a document's
    relevant pairs span several query units, as a direct computation of the two-way variance gives it."""
    q, docs, qids, dids = split
    relevant = qids[:, None] == dids[None, :]
    relevant[::4, 7] = True  # image 7 is relevant to captions of many units
    rows, cols = np.nonzero(relevant)
    rates = measure_rates(q, docs, qids, dids, grid_size=8, positives=(rows, cols))
    s, n = q @ docs.T, relevant.sum()

    def cluster_variance(x, size, p):
        x, size = x[size > 0], size[size > 0]
        return len(size) / (len(size) - 1) * np.sum((x - size * p) ** 2) / n**2

    checked = 0
    for t, deff in zip(rates.thresholds, rates.deff_tp, strict=True):
        hit = (s >= t) & relevant
        if min(hit.sum(), n - hit.sum()) < 10:
            continue  # too few events: the nearest grid point's design effect is used there
        p = hit.sum() / n
        by_unit = [(hit[qids == u].sum(), relevant[qids == u].sum()) for u in np.unique(qids)]
        v = cluster_variance(*np.array(by_unit, float).T, p) + cluster_variance(hit.sum(0), relevant.sum(0), p)
        v -= p * (1 - p) / n  # two-way (Cameron-Gelbach-Miller): the pairs' own variance, in both sums, once less
        assert deff == pytest.approx(max(v / (p * (1 - p) / n), 1.0))
        checked += 1
    assert checked >= 3

"""Miners: each selection against a brute-force NumPy loop, determinism, XLA, and the Wu et al. weights."""

import math

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval.losses import miners, relevance_from_ids


def batch(seed=0, n=10, m=10, square=True):
    rng = np.random.default_rng(seed)
    if square:
        e = rng.normal(size=(n, 5))
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        ids = np.arange(n) % 3
        return (e @ e.T).astype(np.float32), relevance_from_ids(ids, ids, exclude_self=True).numpy()
    s = rng.uniform(-1, 1, size=(n, m)).astype(np.float32)
    r = rng.choice([-1.0, 0.0, 1.0], size=(n, m)).astype(np.float32)
    r[0] = 0.0  # a row without positives
    r[1] = np.where(r[1] == 0, 1.0, r[1])  # a row without negatives
    return s, r


@pytest.mark.parametrize("square", [True, False])
def test_hardest_and_hard_masks_match_loops(square):
    s, r = batch(square=square)
    neg_idx, neg_ok = miners.hardest_negative_indices(r, s)
    pos_idx, pos_ok = miners.hardest_positive_indices(r, s)
    hard = miners.hard_negative_mask(r, s, margin=0.1).numpy()
    for a in range(s.shape[0]):
        ns = [j for j in range(s.shape[1]) if r[a, j] == 0]
        ps = [j for j in range(s.shape[1]) if r[a, j] == 1]
        assert bool(neg_ok[a]) == bool(ns) and bool(pos_ok[a]) == bool(ps)
        if ns:
            assert int(neg_idx[a]) == max(ns, key=lambda j: s[a, j])
        if ps:
            assert int(pos_idx[a]) == min(ps, key=lambda j: s[a, j])
        want = {n for n in ns if ps and s[a, n] + 0.1 > min(s[a, p] for p in ps)}
        assert set(np.flatnonzero(hard[a])) == want


@pytest.mark.parametrize("square", [True, False])
def test_semi_hard_matches_facenet_definition(square):
    s, r = batch(seed=3, square=square)
    idx, valid = miners.semi_hard_negative_indices(r, s)
    for a in range(s.shape[0]):
        ns = [j for j in range(s.shape[1]) if r[a, j] == 0]
        for p in range(s.shape[1]):
            assert bool(valid[a, p]) == (r[a, p] == 1 and bool(ns))
            if not valid[a, p]:
                continue
            farther = [n for n in ns if s[a, n] < s[a, p]]
            want = max(farther, key=lambda n: s[a, n]) if farther else min(ns, key=lambda n: s[a, n])
            assert int(idx[a, p]) == want


def test_semi_hard_ties_are_not_farther():
    s = np.array([[0.5, 0.5, 0.2, 0.9]], np.float32)
    r = np.array([[1, 0, 0, 0]], np.float32)
    idx, _ = miners.semi_hard_negative_indices(r, s)
    assert int(idx[0, 0]) == 2  # the tie at column 1 is not farther than the positive


@pytest.mark.parametrize("square", [True, False])
def test_multi_similarity_masks_match_reference_rule(square):
    s, r = batch(seed=5, square=square)
    keep_pos, keep_neg = (m.numpy() for m in miners.multi_similarity_masks(r, s, epsilon=0.1))
    for a in range(s.shape[0]):
        ns = [j for j in range(s.shape[1]) if r[a, j] == 0]
        ps = [j for j in range(s.shape[1]) if r[a, j] == 1]
        want_n = {n for n in ns if ps and s[a, n] + 0.1 > min(s[a, p] for p in ps)}
        want_p = {p for p in ps if ns and s[a, p] - 0.1 < max(s[a, n] for n in ns)}
        assert set(np.flatnonzero(keep_neg[a])) == want_n and set(np.flatnonzero(keep_pos[a])) == want_p


def test_distance_weighted_sampling_follows_inverse_sphere_density():
    dim = 8
    # one anchor, negatives at chosen distances; the far one (d = 1.6 > 1.4) must never be drawn
    d = np.array([0.0, 0.6, 0.9, 1.2, 1.6])
    s = (1.0 - d**2 / 2.0)[None, :].astype(np.float32)
    r = np.array([[1, 0, 0, 0, 0]], np.float32)
    idx, valid = miners.distance_weighted_negatives(r, s, embedding_dim=dim, num_samples=20000, seed=[1, 2])
    assert bool(valid[0])
    counts = np.bincount(idx.numpy().ravel(), minlength=5)
    assert counts[0] == 0 and counts[4] == 0
    logw = [-(dim - 2) * math.log(x) - (dim - 3) / 2 * math.log(1 - x * x / 4) for x in d[1:4]]
    want = np.exp(np.array(logw) - max(logw))
    want /= want.sum()
    np.testing.assert_allclose(counts[1:4] / counts.sum(), want, atol=0.015)
    again, _ = miners.distance_weighted_negatives(r, s, embedding_dim=dim, num_samples=20000, seed=[1, 2])
    np.testing.assert_array_equal(idx.numpy(), again.numpy())


def test_distance_weighted_falls_back_and_flags_rows_without_negatives():
    s = np.array([[1.0, -0.9, -0.95], [1.0, 0.2, 0.3]], np.float32)  # row 0: negatives all beyond the cutoff
    r = np.array([[1, 0, 0], [1, 1, -1]], np.float32)  # row 1: no negative
    idx, valid = miners.distance_weighted_negatives(r, s, embedding_dim=4, num_samples=50, seed=[0, 0])
    assert valid.numpy().tolist() == [True, False]
    assert set(idx.numpy()[0].tolist()) <= {1, 2}
    with pytest.raises(ValueError, match="embedding_dim"):
        miners.distance_weighted_negatives(r, s, embedding_dim=1)


def test_distance_weighted_sampling_compiles_with_xla():
    """The other miners are compiled inside the losses' XLA test (semi-hard, multi-similarity, hardest)."""
    s, r = batch(seed=9, square=False)
    run = tf.function(
        lambda x: miners.distance_weighted_negatives(r, x, embedding_dim=5, seed=[3, 4]), jit_compile=True
    )
    idx, valid = run(tf.constant(s))
    assert idx.shape == (s.shape[0], 1)
    for a in np.flatnonzero(valid.numpy()):
        assert r[a, int(idx[a, 0])] == 0  # always a negative of its row


def test_miner_input_errors():
    with pytest.raises(ValueError, match="rank-2"):
        miners.hardest_negative_indices(np.zeros(3), np.zeros(3))

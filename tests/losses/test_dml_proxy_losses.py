"""ProxyNCA, ProxyAnchor, SoftTriple, NCA, LMNN and the centroid bound: exact math against NumPy loops
(``reference.py``), pytorch-metric-learning and finite-difference gradients. Serialisation, XLA, mixed precision
and bad inputs of every loss: ``test_contract.py``."""

import numpy as np
import pytest
import reference as ref
import tensorflow as tf

import ce_retrieval.losses as L
from ce_retrieval.modeling.proxies import proxy_relevance


def _unit(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _proxy_case(rng, n=12, c=5, k=1, d=6):
    emb, prox = _unit(rng.normal(size=(n, d))), _unit(rng.normal(size=(c * k, d)))
    labels = rng.integers(0, c, n)
    rel = proxy_relevance(labels, c, k).numpy().astype(np.float64)
    return emb, prox, labels, rel, emb @ prox.T


def _pair_case(rng, n=12, d=6, classes=4):
    emb = _unit(rng.normal(size=(n, d)))
    labels = rng.integers(0, classes, n)
    rel = L.relevance_from_ids(labels, labels, exclude_self=True).numpy().astype(np.float64)
    return emb, labels, rel, emb @ emb.T


CASES = {
    "ProxyNCALoss": (lambda: L.ProxyNCALoss(scale=3.0), lambda r, s: ref.nca(r, s, 3.0), "proxy", 1),
    "ProxyNCA-original": (
        lambda: L.ProxyNCALoss(scale=1.0, include_positives_in_denominator=False),
        lambda r, s: ref.nca(r, s, 1.0, include_positives=False),
        "proxy",
        1,
    ),
    "ProxyAnchorLoss": (lambda: L.ProxyAnchorLoss(), lambda r, s: ref.proxy_anchor(r, s), "proxy", 1),
    "ProxyAnchor-K2": (
        lambda: L.ProxyAnchorLoss(alpha=16, delta=0.2),
        lambda r, s: ref.proxy_anchor(r, s, 16, 0.2),
        "proxy",
        2,
    ),
    "SoftTripleLoss": (
        lambda: L.SoftTripleLoss(proxies_per_class=3),
        lambda r, s: ref.soft_triple(r, s, 3),
        "proxy",
        3,
    ),
    "CentroidUpperBoundLoss": (lambda: L.CentroidUpperBoundLoss(), ref.centroid_bound, "proxy", 1),
    "NCALoss": (lambda: L.NCALoss(scale=2.0), lambda r, s: ref.nca(r, s, 2.0), "pair", 0),
    "NCA-expected": (
        lambda: L.NCALoss(objective="expected"),
        lambda r, s: ref.nca(r, s, objective="expected"),
        "pair",
        0,
    ),
    "LMNNLoss": (lambda: L.LMNNLoss(k=2, margin=0.5), lambda r, s: ref.lmnn(r, s, 2, 0.5), "pair", 0),
    "LMNN-all-targets": (
        lambda: L.LMNNLoss(k=None, push_weight=0.3),
        lambda r, s: ref.lmnn(r, s, None, 1.0, 0.3),
        "pair",
        0,
    ),
}


def _case(kind, k, rng):
    if kind == "proxy":
        *_, rel, s = _proxy_case(rng, k=k)
    else:
        *_, rel, s = _pair_case(rng)
    return rel, s


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_matches_numpy_reference(name, rng):
    make, reference, kind, k = CASES[name]
    rel, s = _case(kind, k, rng)
    value = float(make()(tf.constant(rel, tf.float32), tf.constant(s, tf.float32)))
    assert value == pytest.approx(reference(rel, s), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    make, reference, kind, k = CASES[name]
    rng = np.random.default_rng(7)
    if kind == "proxy":
        *_, rel, s = _proxy_case(rng, n=5, c=3, k=k, d=4)
    else:
        *_, rel, s = _pair_case(rng, n=6, d=4, classes=2)
    s = s * 0.9  # keep away from |cos| = 1 where the centroid distance has a kink
    loss = make()
    st = tf.Variable(s, dtype=tf.float32)
    with tf.GradientTape() as tape:
        value = loss(tf.constant(rel, tf.float32), st)
    grad = tape.gradient(value, st).numpy()
    eps, numeric = 1e-6, np.zeros_like(s)
    for idx in np.ndindex(*s.shape):
        up, down = s.copy(), s.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (reference(rel, up) - reference(rel, down)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=2e-3, atol=2e-4 * max(1.0, np.abs(numeric).max()))


def test_large_logits_stay_finite():
    rel = np.eye(4, 6)
    s = np.where(rel > 0, -1.0, 1.0)  # worst case: positives far, negatives close
    for loss in (
        L.ProxyAnchorLoss(alpha=200.0),
        L.ProxyNCALoss(scale=500.0),
        L.SoftTripleLoss(proxies_per_class=1, la=300.0),
    ):
        st = tf.Variable(s, dtype=tf.float32)
        with tf.GradientTape() as tape:
            value = loss(rel, st)
        assert np.isfinite(float(value)) and float(value) > 10
        assert np.all(np.isfinite(tape.gradient(value, st).numpy()))


def test_rows_without_positives_and_ignored_entries():
    s = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.5], [0.4, 0.4, 0.4]])
    rel = np.array([[1, 0, -1], [0, 1, 0], [0, 0, 0]], np.float64)
    for make, reference, *_ in (CASES["NCALoss"], CASES["ProxyNCALoss"], CASES["LMNNLoss"]):
        assert float(make()(rel, s)) == pytest.approx(reference(rel, s), rel=1e-5)
    # an ignored entry never influences the value
    a = float(L.NCALoss()(rel, s))
    s2 = s.copy()
    s2[0, 2] = -0.7
    assert float(L.NCALoss()(rel, s2)) == pytest.approx(a)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="similarity"):
        L.NCALoss(similarity="euclid")
    with pytest.raises(ValueError, match="objective"):
        L.NCALoss(objective="mean")
    with pytest.raises(ValueError, match="push_weight"):
        L.LMNNLoss(push_weight=2.0)
    with pytest.raises(ValueError, match="multiple of proxies_per_class"):
        L.SoftTripleLoss(proxies_per_class=4)(np.eye(2, 6), np.zeros([2, 6]))


def test_negative_squared_distance_reading(rng):
    """With S = −d² the losses see the same distances as with cosine S on the unit sphere."""
    emb, _, rel, s = _pair_case(rng)
    neg_d2 = -(2 - 2 * s)
    for cos_loss, dist_loss in (
        (L.NCALoss(scale=2.0), L.NCALoss(scale=2.0, similarity="negative_squared_distance")),
        (L.LMNNLoss(), L.LMNNLoss(similarity="negative_squared_distance")),
    ):
        assert float(dist_loss(rel, neg_d2)) == pytest.approx(float(cos_loss(rel, s)), rel=1e-5)


# --- pytorch-metric-learning: same definitions, conventions bridged explicitly ---------------------------


@pytest.fixture
def pml():
    """(torch, pytorch_metric_learning.losses): pinned references (requirements-dev.txt; tests/conftest.py fails
    the run when they are missing), imported here because torch is slow to import."""
    import torch
    from pytorch_metric_learning import losses

    return torch, losses


def _t(torch, a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def test_matches_pml_proxy_nca(rng, pml):
    torch, pml_losses = pml
    # pml: p ∝ exp(-softmax_scale·‖x̂ − p̂‖²), positives included, mean over queries == our scale.
    emb, prox, labels, rel, s = _proxy_case(rng, n=16, c=6)
    loss = pml_losses.ProxyNCALoss(num_classes=6, embedding_size=6, softmax_scale=5.0).double()
    loss.proxies.data = _t(torch, prox)
    expected = loss(_t(torch, emb), torch.tensor(labels)).item()
    assert float(L.ProxyNCALoss(scale=5.0)(rel, s)) == pytest.approx(expected, rel=1e-5)


def test_matches_pml_proxy_anchor(rng, pml):
    torch, pml_losses = pml
    emb, prox, labels, rel, s = _proxy_case(rng, n=16, c=6)
    loss = pml_losses.ProxyAnchorLoss(num_classes=6, embedding_size=6, margin=0.1, alpha=32).double()
    loss.proxies.data = _t(torch, prox)
    expected = loss(_t(torch, emb), torch.tensor(labels)).item()
    assert float(L.ProxyAnchorLoss(alpha=32, delta=0.1)(rel, s)) == pytest.approx(expected, rel=1e-5)


def test_matches_pml_soft_triple(rng, pml):
    torch, pml_losses = pml
    # pml keeps centres as fc [D, C·K], class-major like ProxySimilarity; it has no centre regulariser.
    emb, prox, labels, rel, s = _proxy_case(rng, n=16, c=4, k=3)
    loss = pml_losses.SoftTripleLoss(
        num_classes=4, embedding_size=6, centers_per_class=3, la=20, gamma=0.1, margin=0.01
    ).double()
    loss.fc.data = _t(torch, prox.T)
    expected = loss(_t(torch, emb), torch.tensor(labels)).item()
    assert float(L.SoftTripleLoss(proxies_per_class=3)(rel, s)) == pytest.approx(expected, rel=1e-5)


def test_matches_pml_nca(rng, pml):
    torch, pml_losses = pml
    # pml: LpDistance(power=2) on normalised embeddings, diagonal excluded == relevance_from_ids(exclude_self).
    emb, labels, rel, s = _pair_case(rng, n=16)
    expected = pml_losses.NCALoss(softmax_scale=3.0)(_t(torch, emb), torch.tensor(labels)).item()
    assert float(L.NCALoss(scale=3.0)(rel, s)) == pytest.approx(expected, rel=1e-5)


def test_lmnn_fixed_target_neighbours(rng):
    x = rng.normal(size=(10, 3))
    y = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 3])
    rel = L.lmnn_target_relevance(x, y, k=2)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    for i in range(10):
        same = [j for j in np.flatnonzero(y == y[i]) if j != i]
        nearest = sorted(same, key=lambda j: d[i, j])[:2]
        assert sorted(np.flatnonzero(rel[i] == 1)) == sorted(nearest)
        assert np.all(rel[i, y != y[i]] == 0) and np.all(rel[i, [j for j in same if j not in nearest] + [i]] == -1)
    s = _unit(rng.normal(size=(10, 4)))
    s = s @ s.T
    rel[9, 0] = 1  # class 3 is alone: give its row a target so every row is used
    assert float(L.LMNNLoss(k=None)(rel, s)) == pytest.approx(ref.lmnn(rel, s, k=None), rel=1e-5)

"""Pair/triplet losses: exact values against NumPy transcriptions of the papers (``reference.py``) and against
pytorch-metric-learning, gradients (finite differences of the float64 reference) and errors. Serialisation,
XLA, mixed precision and bad inputs of every loss: ``test_contract.py``; the per-slot / sorted speed paths:
``test_fast_paths.py``."""

import functools
import re

import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from ce_retrieval import losses
from ce_retrieval.losses import (
    AngularLoss,
    BinomialDevianceLoss,
    CircleLoss,
    ContrastiveLoss,
    InfoNCE,
    LiftedStructureLoss,
    MultiSimilarityLoss,
    NPairLoss,
    SymmetricInfoNCE,
    TripletLoss,
    relevance_from_ids,
)

P = functools.partial

# name -> (factory, reference, needs a square S)
CASES = {
    "contrastive": (lambda: ContrastiveLoss(), ref.contrastive, False),
    "contrastive_balanced": (
        lambda: ContrastiveLoss(margin=1.2, balanced=True),
        P(ref.contrastive, margin=1.2, balanced=True),
        False,
    ),
    "triplet_all": (lambda: TripletLoss(), ref.triplet, False),
    "triplet_all_nonzero_euclid": (
        lambda: TripletLoss(margin=0.3, distance="euclidean", average_nonzero=True),
        P(ref.triplet, margin=0.3, distance="euclidean", average_nonzero=True),
        False,
    ),
    "triplet_hard_cosine": (
        lambda: TripletLoss(max_violation=True, distance="cosine"),
        P(ref.triplet, mining="hard", distance="cosine"),
        False,
    ),
    "triplet_semi_hard": (
        lambda: TripletLoss(mining="semi-hard", margin=0.5),
        P(ref.triplet, mining="semi-hard", margin=0.5),
        False,
    ),
    # positive_slots=0: the general paths (per-row sorted merge / miner sort / angular matmul) instead of per-slot
    "triplet_all_sorted": (lambda: TripletLoss(positive_slots=0), ref.triplet, False),
    "triplet_semi_hard_sorted": (
        lambda: TripletLoss(mining="semi-hard", margin=0.5, positive_slots=0),
        P(ref.triplet, mining="semi-hard", margin=0.5),
        False,
    ),
    "triplet_batch_hard": (
        lambda: TripletLoss(mining="hard", positive_mining="hard", distance="euclidean"),
        P(ref.triplet, mining="hard", positive_mining="hard", distance="euclidean"),
        False,
    ),
    "triplet_semi_hard_hardest_positive": (
        lambda: TripletLoss(mining="semi-hard", positive_mining="hard", distance="cosine"),
        P(ref.triplet, mining="semi-hard", positive_mining="hard", distance="cosine"),
        False,
    ),
    "lifted": (lambda: LiftedStructureLoss(), ref.lifted, False),
    "npair": (lambda: NPairLoss(scale=5.0), P(ref.npair, scale=5.0), False),
    "infonce": (lambda: InfoNCE(temperature=0.1), P(ref.npair, scale=10.0), False),
    "symmetric_infonce": (
        lambda: SymmetricInfoNCE(temperature=0.2),
        lambda r, s: 0.5 * (ref.npair(r, s, scale=5.0) + ref.npair(r.T, s.T, scale=5.0)),
        False,
    ),
    "angular": (lambda: AngularLoss(alpha=45.0), P(ref.angular, alpha=45.0), True),
    "angular_npair": (lambda: AngularLoss(with_npair=True), P(ref.angular, with_npair=True), True),
    "angular_npair_matmul": (
        lambda: AngularLoss(with_npair=True, positive_slots=0),
        P(ref.angular, with_npair=True),
        True,
    ),
    "multi_similarity": (lambda: MultiSimilarityLoss(), ref.multi_similarity, False),
    "multi_similarity_no_mining": (
        lambda: MultiSimilarityLoss(mining=False, lambda_=1.0),
        P(ref.multi_similarity, mining=False, lam=1.0),
        False,
    ),
    "circle": (lambda: CircleLoss(), ref.circle, False),
    "circle_retrieval": (lambda: CircleLoss(margin=0.4, gamma=80.0), P(ref.circle, m=0.4, gamma=80.0), False),
    "binomial": (lambda: BinomialDevianceLoss(), ref.binomial, False),
}


def square_batch(seed=0, classes=4, per_class=3, dim=6):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim))
    e = np.repeat(centers, per_class, axis=0) + 0.8 * rng.normal(size=(classes * per_class, dim))
    e = (e / np.linalg.norm(e, axis=1, keepdims=True)).astype(np.float32)
    ids = np.repeat(np.arange(classes), per_class)
    r = relevance_from_ids(ids, ids, exclude_self=True).numpy()
    return e, ids, (e @ e.T).astype(np.float32), r


def rect_batch(seed=1, n=6, m=9):
    rng = np.random.default_rng(seed)
    s = rng.uniform(-0.9, 0.95, size=(n, m)).astype(np.float32)
    r = rng.choice([-1.0, 0.0, 0.0, 1.0], size=(n, m)).astype(np.float32)
    r[np.arange(n), rng.integers(0, m, n)] = 1.0
    r[:, -1] = np.where(r[:, -1] == 1.0, -1.0, 0.0)  # every row keeps a negative column...
    r[np.arange(n), 0] = np.where(np.arange(n) % 2 == 0, 1.0, r[:, 0])
    r[:, -2] = 0.0
    return s, r


def batches(square_only):
    out = [square_batch()[2:]]
    if not square_only:
        out.append(rect_batch())
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_matches_numpy_reference(name):
    factory, reference, square = CASES[name]
    for s, r in batches(square):
        got = float(factory()(r, s))
        want = reference(r, s.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences_of_reference(name):
    factory, reference, square = CASES[name]
    loss = factory()
    rng = np.random.default_rng(7)
    for s, r in batches(square):
        st = tf.constant(s)
        with tf.GradientTape() as tape:
            tape.watch(st)
            value = loss(r, st)
        grad = tape.gradient(value, st).numpy().astype(np.float64)
        s64 = s.astype(np.float64)
        if name.startswith("circle"):  # the paper's alphas carry no gradient: hold them at s
            reference = P(reference, weights_from=s64)
        for _ in range(2):
            v = rng.normal(size=s.shape)
            eps = 1e-6
            fd = (reference(r, s64 + eps * v) - reference(r, s64 - eps * v)) / (2 * eps)
            np.testing.assert_allclose(np.sum(grad * v), fd, rtol=2e-3, atol=2e-4, err_msg=name)


def test_npair_equals_infonce_and_symmetric_infonce_is_clip():
    s, r = rect_batch()
    np.testing.assert_allclose(
        float(NPairLoss(scale=1 / 0.05)(r, s)), float(InfoNCE(temperature=0.05)(r, s)), rtol=1e-6
    )
    # CLIP: one positive per row/column, cross-entropy both ways, averaged.
    rng = np.random.default_rng(3)
    logits_s = rng.uniform(-1, 1, size=(5, 5)).astype(np.float32)
    t = 0.07
    z = logits_s.astype(np.float64) / t
    ce_rows = np.mean(-np.diag(z) + np.log(np.exp(z).sum(1)))
    ce_cols = np.mean(-np.diag(z) + np.log(np.exp(z).sum(0)))
    got = float(SymmetricInfoNCE(temperature=t)(np.eye(5, dtype=np.float32), logits_s))
    np.testing.assert_allclose(got, 0.5 * (ce_rows + ce_cols), rtol=1e-5)
    assert "bidirectional" not in SymmetricInfoNCE().get_config()
    with pytest.raises(ValueError, match="always bidirectional"):
        SymmetricInfoNCE(bidirectional=False)


def test_vse_plus_plus_max_violation_bidirectional():
    """VSE++ (Faghri et al.): sum_i max_j [m - s_ii + s_ij]_+ + max_j [m - s_ii + s_ji]_+ (here averaged)."""
    rng = np.random.default_rng(4)
    s = rng.uniform(-1, 1, size=(6, 6)).astype(np.float32)
    m, sd = 0.2, np.diag(s).astype(np.float64)
    off = ~np.eye(6, dtype=bool)
    cost_s = np.where(off, np.maximum(m - sd[:, None] + s, 0), 0).max(1)
    cost_im = np.where(off, np.maximum(m - sd[None, :] + s, 0), 0).max(0)
    vsepp_sum = cost_s.sum() + cost_im.sum()
    loss = TripletLoss(margin=m, distance="cosine", max_violation=True, bidirectional=True)
    np.testing.assert_allclose(float(loss(np.eye(6, dtype=np.float32), s)) * 2 * 6, vsepp_sum, rtol=1e-5)


def _triplet_value(loss, relevance, scores):
    return loss(relevance, scores)


@pytest.mark.slow
def test_triplet_all_never_builds_cubic_tensor():
    """At N = M = 256 an [N, M, M] float32 tensor is 64 MiB; sort + binary search need O(N M)."""
    n = 256
    rng = np.random.default_rng(5)
    e = rng.normal(size=(n, 16)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    ids = np.arange(n) // 4
    r = relevance_from_ids(ids, ids, exclude_self=True)
    loss = TripletLoss(margin=0.2, positive_slots=0)  # the sorted-merge path at the graph's top level
    fn = tf.function(lambda s: loss(r, s), autograph=False).get_concrete_function(tf.TensorSpec([n, n], tf.float32))
    biggest = 0
    for op in fn.graph.get_operations():
        for out in op.outputs:
            if out.shape.is_fully_defined():
                biggest = max(biggest, out.shape.num_elements())
    assert biggest <= 8 * n * n, biggest  # O(N M): e.g. the [N, 2M, 2] scatter indices; N^3 would be 32x this
    # ... nor in XLA's lowering (tf.searchsorted, for one, becomes an [N, M, M] comparison there), which holds
    # the per-slot branch and the sorted one (tf.cond) in one program
    for mining in ("all", "semi-hard"):
        xla_fn = tf.function(functools.partial(_triplet_value, TripletLoss(mining=mining), r), jit_compile=True)
        hlo = xla_fn.experimental_get_compiler_ir(tf.TensorSpec([n, n], tf.float32))(stage="hlo")
        sizes = [int(np.prod([int(d) for d in dims.split(",")])) for dims in re.findall(r"\[(\d+(?:,\d+)+)\]", hlo)]
        assert max(sizes) <= 8 * n * n, (mining, max(sizes))
    # and the value agrees with a chunked dense evaluation of the same triplets
    s = e @ e.T
    d = 2 - 2 * s.astype(np.float64)
    rn = r.numpy()
    total, count = 0.0, 0
    for a in range(0, n, 64):
        blk = np.maximum(0.2 + d[a : a + 64, :, None] - d[a : a + 64, None, :], 0)
        mask = (rn[a : a + 64, :, None] == 1) & (rn[a : a + 64, None, :] == 0)
        total += blk[mask].sum()
        count += mask.sum()
    np.testing.assert_allclose(float(fn(tf.constant(s))), total / count, rtol=1e-4)


# ---- pytorch-metric-learning: same embeddings, same labels -------------------------------------------------


@pytest.fixture
def pml():
    """``(torch, pytorch_metric_learning.losses, pytorch_metric_learning.reducers)``: pinned references
    (requirements-dev.txt; tests/conftest.py fails the run when they are missing), imported here because torch is
    slow to import."""
    import torch
    from pytorch_metric_learning import losses, reducers

    return torch, losses, reducers


PML = {
    # our loss, pml loss (from its losses and reducers modules); conventions bridged in the comment
    "triplet_all_mean": (  # pml default AvgNonZeroReducer -> MeanReducer for our mean over triplets
        lambda: TripletLoss(margin=0.1, distance="euclidean"),
        lambda pl, pr: pl.TripletMarginLoss(margin=0.1, reducer=pr.MeanReducer()),
    ),
    "triplet_all_nonzero": (
        lambda: TripletLoss(margin=0.1, distance="euclidean", average_nonzero=True),
        lambda pl, pr: pl.TripletMarginLoss(margin=0.1),
    ),
    "lifted": (  # pml averages non-zero terms by default; the paper averages all positive pairs
        lambda: LiftedStructureLoss(margin=1.0),
        lambda pl, pr: pl.LiftedStructureLoss(neg_margin=1.0, reducer=pr.MeanReducer()),
    ),
    "ntxent": (lambda: InfoNCE(temperature=0.1), lambda pl, pr: pl.NTXentLoss(temperature=0.1)),
    "angular": (lambda: AngularLoss(alpha=40.0), lambda pl, pr: pl.AngularLoss(alpha=40)),
    "multi_similarity_no_mining": (
        lambda: MultiSimilarityLoss(alpha=2.0, beta=50.0, lambda_=0.5, mining=False),
        lambda pl, pr: pl.MultiSimilarityLoss(alpha=2, beta=50, base=0.5),
    ),
    "circle": (lambda: CircleLoss(margin=0.4, gamma=80.0), lambda pl, pr: pl.CircleLoss(m=0.4, gamma=80)),
}


@pytest.mark.parametrize("name", sorted(PML))
def test_matches_pytorch_metric_learning(name, pml):
    torch, pml_losses, pml_reducers = pml
    ours, theirs = PML[name]
    e, ids, s, r = square_batch(seed=11, classes=5, per_class=4, dim=8)
    emb = torch.tensor(e, dtype=torch.float64, requires_grad=True)
    value = theirs(pml_losses, pml_reducers)(emb, torch.tensor(ids))
    value.backward()
    et = tf.constant(e, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(et)
        unit = tf.math.l2_normalize(et, axis=1)  # pml normalises inside its distance; so do we here
        mine = ours()(r, tf.matmul(unit, unit, transpose_b=True))
    np.testing.assert_allclose(float(mine), value.item(), rtol=2e-5, err_msg=name)
    # Compare Riemannian gradients (tangent to the unit sphere): the radial part does not change S, and
    # pml's AngularLoss reads the negatives' raw (un-normalised) embeddings, so only it differs there.
    ours_grad, their_grad = tape.gradient(mine, et).numpy(), emb.grad.numpy()
    tangent = lambda g: g - np.sum(g * e, axis=1, keepdims=True) * e
    np.testing.assert_allclose(tangent(ours_grad), tangent(their_grad), rtol=2e-3, atol=2e-5, err_msg=name)


# ---- errors -----------------------------------------------------------------------------------------------


def test_clear_errors():
    with pytest.raises(ValueError, match="mining must be one of"):
        TripletLoss(mining="easy")
    with pytest.raises(ValueError, match="distance must be one of"):
        TripletLoss(distance="manhattan")
    with pytest.raises(ValueError, match="contradicts"):
        TripletLoss(mining="semi-hard", max_violation=True)
    with pytest.raises(ValueError, match="average_nonzero"):
        TripletLoss(mining="hard", average_nonzero=True)
    with pytest.raises(ValueError, match="degrees"):
        AngularLoss(alpha=75.0)
    with pytest.raises(ValueError, match="square similarity matrix"):
        AngularLoss()(np.eye(3, 4, dtype=np.float32), np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="does not support bidirectional"):
        AngularLoss(bidirectional=True)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        InfoNCE(temperature=0.0)
    with pytest.raises(ValueError, match="margin must be > 0"):
        ContrastiveLoss(margin=0.0)
    with pytest.raises(ValueError, match="positive_slots must be >= 0"):
        TripletLoss(positive_slots=-1)
    with pytest.raises(ValueError, match="positive_slots must be >= 0"):
        AngularLoss(positive_slots=-1)


def test_registered_by_name():
    for name in (
        "triplet_loss",
        "TripletLoss",
        "contrastive_loss",
        "multi_similarity_loss",
        "circle_loss",
        "binomial_deviance_loss",
        "lifted_structure_loss",
        "n_pair_loss",
        "infonce",
        "angular_loss",
    ):
        assert isinstance(losses.get(name), losses.RetrievalLoss), name
    assert losses.get("triplet_loss", mining="semi-hard").mining == "semi-hard"

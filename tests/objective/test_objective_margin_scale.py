"""A learned λ with the losses that ``needs_cosine``. The margin softmaxes (L-Softmax, A-Softmax, CosFace, ArcFace):
the margin acts on cosines and λ multiplies after it, ``p = λ·ψ(cos)``, on every path (dense, tiled, sharded,
sharded + tiled); a learned λ that starts at v gives the fixed-λ = v loss (value and embedding gradients), the value
is the float64 reference, and the gradient of ``log λ`` is the reference's finite difference. NCA and ProxyNCA
(clamped ``d² = 2 − 2s``, dense only) likewise. Which losses declare it: tests/losses/test_contract.py.
Multi-replica checks: objective_replicas.py."""

import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "losses"))  # the float64 references
import reference as ref  # noqa: E402
from objective_fixtures import IDS, close, embeddings, value_and_grads  # noqa: E402

from ce_retrieval.configs.experiment import LossConfig  # noqa: E402
from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.modeling.config import ModelConfig  # noqa: E402
from ce_retrieval.objective import LogitScale, RetrievalObjective  # noqa: E402
from ce_retrieval.tasks import build_loss  # noqa: E402

PATHS = [("replicated", 0), ("replicated", 3), ("sharded", 0), ("sharded", 3)]  # dense, tiled, sharded, both
MARGIN_LOSSES = ["LargeMarginSoftmax", "AngularSoftmax", "AdditiveMarginSoftmax", "ArcMarginSoftmax"]


def margin_loss(name, learn, value=20.0, **kwargs):
    """The loss as the task builds it (λ₀ in the loss, learned or not); A-Softmax annealed to its floor λ_a = 5, so
    that its margin is not the softmax's."""
    loss = build_loss(LossConfig(name=name, kwargs=kwargs), ModelConfig(logit_scale=value, learn_logit_scale=learn))
    if loss.annealed:
        loss.step.assign(100_000)
    return loss


def reference_margin(loss):
    """The loss's ψ(c) in float64 (tests/losses/reference.py)."""
    m = loss.margin
    return {
        "LargeMarginSoftmax": lambda c: ref.psi(c, m),
        "AngularSoftmax": lambda c: ref.sphereface(c, m, float(loss.annealing_lambda())),
        "AdditiveMarginSoftmax": lambda c: c - m,
        "ArcMarginSoftmax": lambda c: ref.arcface(c, m),
    }[type(loss).__name__]


@pytest.mark.parametrize("partition, tile", PATHS)
@pytest.mark.parametrize("name", MARGIN_LOSSES)
@pytest.mark.parametrize("value", [20.0, 4.0])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_learned_lambda_equals_the_fixed_lambda_it_starts_at(name, partition, tile, value, bidirectional):
    fixed_loss = margin_loss(name, False, value, bidirectional=bidirectional)
    learned_loss = margin_loss(name, True, value, bidirectional=bidirectional)
    scale = LogitScale(value, learn=True)
    fixed = RetrievalObjective(fixed_loss, value, partition=partition, tile_size=tile)
    learned = RetrievalObjective(learned_loss, scale, partition=partition, tile_size=tile)
    text, image = embeddings(1)
    want, want_grads = value_and_grads(fixed, text, image)
    got, got_grads = value_and_grads(learned, text, image, scale.trainable_variables)
    close(got, want)
    for g, w in zip(got_grads[:2], want_grads, strict=True):
        close(g, w, rtol=1e-4)
    assert np.isfinite(float(got_grads[2])) and abs(float(got_grads[2])) > 1e-4  # λ is learned


@pytest.mark.parametrize("partition, tile", PATHS)
@pytest.mark.parametrize("name", MARGIN_LOSSES)
@pytest.mark.parametrize("cross_example", [False, True])
def test_log_lambda_gradient_is_the_finite_difference_of_the_reference(name, partition, tile, cross_example):
    loss = margin_loss(name, True, cross_example=cross_example)
    scale = LogitScale(20.0, learn=True)
    scale.variable.assign(math.log(12.0))
    objective = RetrievalObjective(loss, scale, partition=partition, tile_size=tile)
    text, image = embeddings(2)
    value, grads = value_and_grads(objective, text, image, scale.trainable_variables)
    cosine = text.numpy().astype(np.float64) @ image.numpy().astype(np.float64).T
    relevance = relevance_from_ids(IDS, IDS).numpy()
    margin = reference_margin(loss)

    def reference(log_scale):
        return ref.softmax(relevance, cosine, math.exp(log_scale), cross_example, positive_fn=margin)

    close(value, reference(math.log(12.0)))
    h = 1e-5
    finite_difference = (reference(math.log(12.0) + h) - reference(math.log(12.0) - h)) / (2 * h)
    assert abs(finite_difference) > 1e-3
    close(grads[2], finite_difference, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("partition, tile", PATHS)
def test_arcface_with_learned_lambda_20_is_finite(partition, tile):
    """ArcFace's margin on λ·cos (> 1) was meaningless; on cos it is the fixed-λ loss, finite with finite gradients."""
    scale = LogitScale(20.0, learn=True)
    objective = RetrievalObjective(margin_loss("ArcMarginSoftmax", True), scale, partition=partition, tile_size=tile)
    text, image = embeddings(3)
    value, grads = value_and_grads(objective, text, image, scale.trainable_variables)
    assert np.isfinite(float(value))
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    fixed = RetrievalObjective(margin_loss("ArcMarginSoftmax", False), 20.0, partition=partition, tile_size=tile)
    close(value, value_and_grads(fixed, text, image)[0])


@pytest.mark.parametrize("name", ["NCALoss", "ProxyNCALoss"])
def test_nca_with_learned_lambda_equals_fixed_lambda_and_learns_it(name):
    """NCA's ``d² = max(2 − 2s, 0)`` on ``λ·S`` clamped every pair with ``λs > 1`` to d² = 0; on cosines it is the
    fixed-λ loss, and ``log λ`` gets the reference's finite-difference gradient."""
    scale = LogitScale(20.0, learn=True)
    learned = RetrievalObjective(build_loss(LossConfig(name), ModelConfig(learn_logit_scale=True)), scale)
    fixed = RetrievalObjective(build_loss(LossConfig(name), ModelConfig(logit_scale=20.0)), 20.0)
    text, image = embeddings(4)
    got, got_grads = value_and_grads(learned, text, image, scale.trainable_variables)
    want, want_grads = value_and_grads(fixed, text, image)
    close(got, want)
    for g, w in zip(got_grads[:2], want_grads, strict=True):
        close(g, w, rtol=1e-4)
    cosine = text.numpy().astype(np.float64) @ image.numpy().astype(np.float64).T
    relevance = relevance_from_ids(IDS, IDS).numpy()
    h = 1e-5
    reference = lambda s: ref.nca(relevance, cosine, scale=math.exp(s) / 2.0)  # noqa: E731
    close(got, reference(math.log(20.0)))
    finite_difference = (reference(math.log(20.0) + h) - reference(math.log(20.0) - h)) / (2 * h)
    close(got_grads[2], finite_difference, rtol=1e-3, atol=1e-5)

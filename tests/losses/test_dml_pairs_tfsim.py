"""TensorFlow Similarity defines batch-hard / semi-hard triplet losses and the multi-similarity loss with its
mining: same embeddings and labels, same values and gradients. (Its package import pulls umap and torch:
about 10-25 s, hence a file of its own.)"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_similarity.losses as tfsim  # pinned (requirements.txt): tests/conftest.py fails the run without it

from ce_retrieval.losses import MultiSimilarityLoss, TripletLoss, relevance_from_ids


def embeddings(seed=21, classes=6, per_class=4, dim=8):
    rng = np.random.default_rng(seed)
    e = np.repeat(rng.normal(size=(classes, dim)), per_class, axis=0) + 0.9 * rng.normal(
        size=(classes * per_class, dim)
    )
    return (e / np.linalg.norm(e, axis=1, keepdims=True)).astype(np.float32), np.repeat(np.arange(classes), per_class)


CASES = {
    # TF-Similarity's cosine distance is 1 - s, its mining 'hard' positive = farthest positive per anchor
    "batch_hard": (
        lambda: TripletLoss(margin=0.2, distance="cosine", mining="hard", positive_mining="hard"),
        lambda: tfsim.TripletLoss(
            distance="cosine", positive_mining_strategy="hard", negative_mining_strategy="hard", margin=0.2
        ),
    ),
    "semi_hard": (
        lambda: TripletLoss(margin=0.2, distance="cosine", mining="semi-hard", positive_mining="hard"),
        lambda: tfsim.TripletLoss(
            distance="cosine", positive_mining_strategy="hard", negative_mining_strategy="semi-hard", margin=0.2
        ),
    ),
    "multi_similarity": (  # TF-Sim's default beta is 40; the paper's 50 here on both sides
        lambda: MultiSimilarityLoss(alpha=2.0, beta=50.0, lambda_=0.5, epsilon=0.1),
        lambda: tfsim.MultiSimilarityLoss(distance="cosine", alpha=2.0, beta=50.0, epsilon=0.1, lmda=0.5),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_tensorflow_similarity(name):
    ours, theirs = (f() for f in CASES[name])
    e, ids = embeddings()
    relevance = relevance_from_ids(ids, ids, exclude_self=True)
    et = tf.constant(e)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(et)
        mine = ours(relevance, tf.matmul(et, et, transpose_b=True))
        reference = theirs(tf.constant(ids), et)
    np.testing.assert_allclose(float(mine), float(reference), rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(
        tape.gradient(mine, et).numpy(), tape.gradient(reference, et).numpy(), rtol=1e-3, atol=1e-5, err_msg=name
    )

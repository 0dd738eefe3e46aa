"""End to end: every pair/triplet loss trains a tiny MLP on generated class data fed by the P x K sampler,
and recall@1 of held-out examples improves well beyond the untrained network.

Data: 10 classes; an 8-d class signal plus 24-d nuisance noise, rotated by a random orthogonal matrix, so
nearest neighbours of the raw (or randomly projected) inputs are dominated by the nuisance and a learned
projection is needed. All models (same initialisation, one per loss) train inside one ``tf.function`` so
that graph tracing, the dominant cost on a shared CPU, happens once.
"""

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval.data.pk_sampler import pk_sample
from ce_retrieval.losses import (
    AngularLoss,
    BinomialDevianceLoss,
    CircleLoss,
    ContrastiveLoss,
    InfoNCE,
    LiftedStructureLoss,
    MultiSimilarityLoss,
    TripletLoss,
    relevance_from_ids,
)

LOSSES = {
    "contrastive": lambda: ContrastiveLoss(margin=1.0),
    "triplet_all": lambda: TripletLoss(margin=0.2),
    "triplet_semi_hard": lambda: TripletLoss(mining="semi-hard", margin=0.2),
    "triplet_batch_hard": lambda: TripletLoss(mining="hard", positive_mining="hard", distance="euclidean"),
    "lifted": lambda: LiftedStructureLoss(),
    "infonce": lambda: InfoNCE(temperature=0.1),
    # NPairLoss(scale=10) and SymmetricInfoNCE on a symmetric S give exactly InfoNCE(0.1)'s values and
    # gradients (tested in test_dml_pairs.py), so they would repeat this run.
    "angular": lambda: AngularLoss(with_npair=True),
    "multi_similarity": lambda: MultiSimilarityLoss(),
    "circle": lambda: CircleLoss(margin=0.4, gamma=80.0),
    "binomial": lambda: BinomialDevianceLoss(),
}
NAMES = sorted(LOSSES)
STEPS, LEARNING_RATE = 100, 1e-2


def make_data(rng, per_class, centers, rotation):
    labels = np.repeat(np.arange(len(centers)), per_class)
    signal = centers[labels] + 0.35 * rng.normal(size=(len(labels), centers.shape[1]))
    nuisance = 1.5 * rng.normal(size=(len(labels), 24))
    return (np.concatenate([signal, nuisance], axis=1) @ rotation).astype(np.float32), labels


def init_params(seed=1):
    rng = np.random.default_rng(seed)
    shapes = [(32, 32), (32,), (32, 16)]
    return [(rng.normal(size=s) / np.sqrt(32) if len(s) == 2 else np.zeros(s)).astype(np.float32) for s in shapes]


def embed(params, x):
    hidden = tf.nn.relu(tf.matmul(x, params[0]) + params[1])
    return tf.math.l2_normalize(tf.matmul(hidden, params[2]), axis=-1)


def recall_at_1(params, x, y):
    e = embed(params, x).numpy()
    s = e @ e.T
    np.fill_diagonal(s, -np.inf)
    return float(np.mean(y[np.argmax(s, axis=1)] == y))


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 8))
    rotation = np.linalg.qr(rng.normal(size=(32, 32)))[0]
    train = make_data(rng, 20, centers, rotation)
    x_test, y_test = make_data(rng, 10, centers, rotation)
    batches = pk_sample(tf.data.Dataset.from_tensor_slices(train), 8, 4, seed=0, num_batches=STEPS)

    losses = [LOSSES[n]() for n in NAMES]
    params = [[tf.Variable(p) for p in init_params()] for _ in NAMES]
    moments = [[(tf.Variable(tf.zeros_like(p)), tf.Variable(tf.zeros_like(p))) for p in ps] for ps in params]
    before = recall_at_1(params[0], x_test, y_test)

    @tf.function(autograph=False)  # the losses have no tensor-dependent Python control flow
    def step(x, y, t):
        relevance = relevance_from_ids(y, y, exclude_self=True)
        values = []
        for loss, ps, ms in zip(losses, params, moments, strict=True):
            with tf.GradientTape() as tape:
                e = embed(ps, x)
                value = loss(relevance, tf.matmul(e, e, transpose_b=True))
            for p, g, (m, v) in zip(ps, tape.gradient(value, ps), ms, strict=True):  # Adam
                m.assign(0.9 * m + 0.1 * g)
                v.assign(0.999 * v + 0.001 * tf.square(g))
                p.assign_sub(LEARNING_RATE * (m / (1 - 0.9**t)) / (tf.sqrt(v / (1 - 0.999**t)) + 1e-8))
            values.append(value)
        return tf.stack(values)

    history = np.stack([step(x, y, tf.constant(t + 1.0)).numpy() for t, (x, y) in enumerate(batches)])
    after = {n: recall_at_1(ps, x_test, y_test) for n, ps in zip(NAMES, params, strict=True)}
    return before, after, dict(zip(NAMES, history.T, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_training_improves_recall_at_1(name, trained):
    before, after, history = trained
    values = history[name]
    print(f"{name}: recall@1 {before:.2f} -> {after[name]:.2f}, loss {values[0]:.3f} -> {np.mean(values[-5:]):.3f}")
    assert np.all(np.isfinite(values))
    assert np.mean(values[-10:]) < np.mean(values[:10])
    assert after[name] >= before + 0.3 and after[name] >= 0.7, (before, after[name])

"""ProxySimilarity (training, checkpoints, SavedModel), proxy_relevance, fixed centroids, the SoftTriple centre
regulariser, and linear metric learning with MahalanobisProjection + LMNN / NCA under model.fit."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from benchmarks.losses.toy_data import make_labelled_data  # the benchmark harnesses' labelled toy data
from ce_retrieval.data.pk_sampler import pk_sample
from ce_retrieval.losses import LMNNLoss, NCALoss, ProxyAnchorLoss, SoftTripleLoss, relevance_from_ids
from ce_retrieval.modeling.mahalanobis import MahalanobisProjection, PairwiseNegativeSquaredDistance
from ce_retrieval.modeling.proxies import ProxySimilarity, SoftTripleCenterRegularizer, fixed_centroids, proxy_relevance


def test_proxy_similarity_is_cosine_and_float32_under_mixed_precision(rng):
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    layer = ProxySimilarity(3, proxies_per_class=2)
    e = rng.normal(size=(5, 4)).astype(np.float32)
    s = layer(tf.constant(e, tf.float16))
    assert s.shape == (5, 6) and s.dtype == tf.float32
    p = layer.proxies.numpy()
    expected = (e / np.linalg.norm(e, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
    np.testing.assert_allclose(s.numpy(), expected, atol=2e-3)


def test_proxy_relevance():
    np.testing.assert_array_equal(proxy_relevance([2, 0], 3, 2).numpy(), [[0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 3\)"):
        proxy_relevance([3], 3)
    with pytest.raises(ValueError, match="integer"):
        proxy_relevance([0.5], 3)


def test_fixed_centroids():
    np.testing.assert_array_equal(fixed_centroids(3, 5), np.eye(3, 5))
    with pytest.raises(ValueError, match="dim >= num_classes"):
        fixed_centroids(6, 4)
    c = fixed_centroids(10, 3, method="kmeans", samples_per_class=20)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
    cos = c @ c.T - 2 * np.eye(10)
    assert cos.max() < 0.95  # distinct, spread centroids


def test_soft_triple_center_regularizer_matches_definition(rng):
    c, k = 3, 4
    w = rng.normal(size=(c * k, 5))
    wn = w / np.linalg.norm(w, axis=1, keepdims=True)
    total = sum(
        np.sqrt(2 + 1e-5 - 2 * wn[a * k + i] @ wn[a * k + j])
        for a in range(c)
        for i in range(k)
        for j in range(i + 1, k)
    )
    reg = SoftTripleCenterRegularizer(c, k, weight=0.2)
    assert float(reg(tf.constant(w, tf.float32))) == pytest.approx(0.2 * total / (c * k * (k - 1)), rel=1e-5)
    assert float(SoftTripleCenterRegularizer(c, 1)(tf.constant(w[:c], tf.float32))) == 0.0


def _proxy_model(num_classes, k=1, regularizer=None):
    inputs = tf_keras.Input([6])
    emb = tf_keras.layers.Dense(4, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=1))(inputs)
    sim = ProxySimilarity(
        num_classes,
        k,
        proxy_regularizer=regularizer,
        proxy_initializer=tf_keras.initializers.HeNormal(seed=2),
        name="proxies",
    )(emb)
    return tf_keras.Model(inputs, sim)


def _proxy_data(rng, num_classes, k, n=48):
    y = np.arange(n) % num_classes
    x = (rng.normal(size=(num_classes, 6))[y] + 0.3 * rng.normal(size=(n, 6))).astype(np.float32)
    return x, proxy_relevance(y, num_classes, k).numpy()


def test_fit_trains_proxies_and_checkpoint_restores_them(rng, tmp_path):
    x, rel = _proxy_data(rng, 4, 1)
    model = _proxy_model(4)
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss=ProxyAnchorLoss())
    start = model.get_layer("proxies").proxies.numpy().copy()
    first = model.evaluate(x, rel, batch_size=16, verbose=0)
    model.fit(x, rel, batch_size=16, epochs=5, shuffle=False, verbose=0)
    trained = model.get_layer("proxies").proxies.numpy()
    assert not np.allclose(start, trained)
    after = model.evaluate(x, rel, batch_size=16, verbose=0)
    assert after < 0.7 * first

    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh = _proxy_model(4)
    fresh.compile(loss=ProxyAnchorLoss())
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh.get_layer("proxies").proxies.numpy(), trained)
    assert fresh.evaluate(x, rel, batch_size=16, verbose=0) == pytest.approx(after, rel=1e-6)


def test_saved_model_keeps_proxies_regulariser_and_loss(rng, tmp_path):
    c, k = 3, 2
    x, rel = _proxy_data(rng, c, k)
    model = _proxy_model(c, k, SoftTripleCenterRegularizer(c, k))
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss=SoftTripleLoss(proxies_per_class=k))
    model.fit(x, rel, batch_size=16, epochs=2, verbose=0)
    assert len(model.losses) == 1 and float(model.losses[0]) > 0  # the centre regulariser is trained
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = tf_keras.models.load_model(path)
    np.testing.assert_array_equal(
        loaded.get_layer("proxies").proxies.numpy(), model.get_layer("proxies").proxies.numpy()
    )
    assert isinstance(loaded.loss, SoftTripleLoss) and loaded.loss.proxies_per_class == k
    assert loaded.evaluate(x, rel, verbose=0) == pytest.approx(model.evaluate(x, rel, verbose=0), rel=1e-6)


def test_mahalanobis_projection_metric_and_pairwise_distance(rng):
    layer = MahalanobisProjection(2, kernel_initializer="glorot_uniform")
    x, y = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    d2 = layer.squared_distance(x, y).numpy()
    m = layer.metric().numpy()
    assert np.all(np.linalg.eigvalsh(m) > -1e-6) and np.linalg.matrix_rank(m, tol=1e-6) == 2
    np.testing.assert_allclose(d2, np.einsum("nd,de,ne->n", x - y, m, x - y), rtol=1e-4)
    z = layer(x).numpy()
    s = PairwiseNegativeSquaredDistance()(layer(x)).numpy()
    np.testing.assert_allclose(s, -np.sum((z[:, None] - z[None]) ** 2, -1), atol=1e-5)
    assert np.all(np.diag(s) == 0)
    cfg = MahalanobisProjection.from_config(layer.get_config()).get_config()
    assert cfg["rank"] == 2


def _pk_batches(x, y, steps, classes=5, per_class=4, seed=0):
    xs, rels = [], []
    for xb, yb in pk_sample(
        tf.data.Dataset.from_tensor_slices((x, y)), classes, per_class, seed=seed, num_batches=steps
    ):
        xs.append(xb.numpy())
        rels.append(relevance_from_ids(yb, yb, exclude_self=True).numpy())
    return tf.data.Dataset.from_tensor_slices((np.stack(xs), np.stack(rels)))


@pytest.mark.parametrize(
    "loss",
    [
        LMNNLoss(margin=1.0, similarity="negative_squared_distance"),
        NCALoss(scale=0.1, similarity="negative_squared_distance"),
    ],
    ids=["lmnn", "nca"],
)
@pytest.mark.slow
def test_linear_metric_learning_with_fit_improves_knn(loss):
    x, y = make_labelled_data(num_classes=10, per_class=24, signal_dim=3, nuisance_dim=9, seed=3)
    train = (np.arange(len(y)) % 24) < 16
    inputs = tf_keras.Input([x.shape[1]])
    projection = MahalanobisProjection(4)
    model = tf_keras.Model(inputs, PairwiseNegativeSquaredDistance()(projection(inputs)))
    model.compile(optimizer=tf_keras.optimizers.Adam(0.02), loss=loss)
    r0 = _euclidean_recall_at_1(projection(x[~train]).numpy(), y[~train])  # identity init: Euclidean 1-NN
    model.fit(_pk_batches(x[train], y[train], 150), epochs=1, verbose=0)
    r1 = _euclidean_recall_at_1(projection(x[~train]).numpy(), y[~train])
    assert r1 > r0 + 0.15, (r0, r1)


def _euclidean_recall_at_1(z, y):
    d2 = np.sum((z[:, None] - z[None]) ** 2, -1)
    np.fill_diagonal(d2, np.inf)
    return float(np.mean(y[np.argmin(d2, 1)] == y))


def test_fit_in_mixed_precision_with_xla(rng):
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    x, rel = _proxy_data(rng, 4, 1)
    model = _proxy_model(4)
    assert model.layers[1].compute_dtype == "float16" and model.output.dtype == tf.float32
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss=ProxyAnchorLoss(), jit_compile=True)
    history = model.fit(x, rel, batch_size=16, epochs=3, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)) and history[-1] < history[0]

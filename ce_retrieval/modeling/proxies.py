"""Learned class proxies as a Keras layer: ``S = normalize(E) · normalize(P)ᵀ`` of shape ``[N, C·K]``.

Proxy-based metric learning (ProxyNCA, ProxyAnchor, SoftTriple; ProbML 16.2.5.2) compares each embedding
with ``K`` learned vectors per class instead of with other examples, which makes a step ``O(N·C·K)`` instead
of ``O(N²)`` or ``O(N³)``. Keeping the proxies in a layer (not in the loss) leaves the loss contract of
``ce_retrieval.losses`` untouched: the layer outputs the cosine-similarity matrix, :func:`proxy_relevance`
turns labels into the matching relevance matrix, and any ``RetrievalLoss`` consumes the pair. Because the
proxies are ordinary layer weights, ``model.fit`` trains them, and checkpoints / SavedModels store them.

Layout: column ``c·K + k`` is proxy ``k`` of class ``c`` (class-major), so ``S.reshape(N, C, K)`` groups a
class's proxies (SoftTriple relies on this).

Fixed centroids (ProbML 16.2.5.3, :class:`~ce_retrieval.losses.CentroidUpperBoundLoss`) are the same layer
with ``trainable=False`` and an initial value from :func:`fixed_centroids` (one-hot vectors, or k-means
centres of points sampled on the unit sphere).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras


def proxy_relevance(labels, num_classes: int, proxies_per_class: int = 1, dtype=tf.float32) -> tf.Tensor:
    """``[N, C·K]`` relevance: 1 for every proxy of the example's class, 0 for the others.

    ``labels`` are integer class ids in ``[0, num_classes)``; out-of-range labels raise
    ``InvalidArgumentError`` (a silent all-zero row would hide a data bug).
    """
    labels = tf.convert_to_tensor(labels)
    if labels.shape.rank == 2 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, -1)
    if labels.shape.rank != 1:
        raise ValueError(f"proxy_relevance: labels must be a rank-1 vector of class ids, got shape {labels.shape}")
    if not labels.dtype.is_integer:
        raise ValueError(f"proxy_relevance: labels must be integer class ids, got dtype {labels.dtype.name}")
    labels = tf.cast(labels, tf.int32)
    check = tf.debugging.assert_equal(
        tf.reduce_all((labels >= 0) & (labels < num_classes)),
        True,
        message=f"proxy_relevance: labels must lie in [0, {num_classes})",
    )
    with tf.control_dependencies([check]):
        one_hot = tf.one_hot(labels, num_classes, dtype=dtype)
    return tf.repeat(one_hot, proxies_per_class, axis=1)


def fixed_centroids(
    num_classes: int, dim: int, method: str = "one_hot", seed: int = 0, samples_per_class: int = 64
) -> np.ndarray:
    """Unit-norm class centroids ``[num_classes, dim]`` for the centroid upper bound (ProbML 16.2.5.3).

    ``'one_hot'``: ``c_m = e_m`` (needs ``dim >= num_classes``): orthogonal, pairwise distance √2 — the
    tightest bound. ``'kmeans'``: k-means (scikit-learn) with ``K = num_classes`` on
    ``samples_per_class · num_classes`` points drawn uniformly on the unit sphere (normalised Gaussians), then
    renormalised: well spread centroids for any ``dim``.
    """
    if method == "one_hot":
        if dim < num_classes:
            raise ValueError(f"fixed_centroids: 'one_hot' needs dim >= num_classes, got dim={dim} < {num_classes}")
        return np.eye(num_classes, dim, dtype=np.float32)
    if method == "kmeans":
        from sklearn.cluster import KMeans

        rng = np.random.default_rng(seed)
        points = rng.standard_normal((samples_per_class * num_classes, dim))
        points /= np.linalg.norm(points, axis=1, keepdims=True)
        centres = KMeans(n_clusters=num_classes, n_init=4, random_state=seed).fit(points).cluster_centers_
        return (centres / np.linalg.norm(centres, axis=1, keepdims=True)).astype(np.float32)
    raise ValueError(f"fixed_centroids: method must be 'one_hot' or 'kmeans', got {method!r}")


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class ProxySimilarity(tf_keras.layers.Layer):
    """Cosine similarity of embeddings ``[N, D]`` to ``num_classes · proxies_per_class`` learned proxies.

    Args:
      num_classes: ``C``.
      proxies_per_class: ``K`` (SoftTriple centres; 1 for ProxyNCA / ProxyAnchor).
      proxy_initializer: Keras initializer of the ``[C·K, D]`` proxy matrix. The default (He normal, fan-out)
        follows ProxyAnchor's official code.
      proxy_regularizer: Keras regularizer on the proxies, e.g. :class:`SoftTripleCenterRegularizer`; its value
        is part of ``model.losses`` and therefore of what ``model.fit`` minimises.
      trainable: ``False`` freezes the proxies (fixed centroids).
      normalize_embeddings: L2-normalise the inputs (default True: S is cosine similarity).

    The output is float32 whatever the mixed-precision policy: cosines feed large logit scales (α = 32,
    λ = 20), where float16 rounding of ``S`` would be amplified.
    """

    def __init__(
        self,
        num_classes: int,
        proxies_per_class: int = 1,
        proxy_initializer="he_normal",
        proxy_regularizer=None,
        normalize_embeddings: bool = True,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if int(num_classes) < 1 or int(proxies_per_class) < 1:
            raise ValueError(
                "ProxySimilarity: num_classes and proxies_per_class must be >= 1, "
                f"got {num_classes}, {proxies_per_class}"
            )
        self.num_classes = int(num_classes)
        self.proxies_per_class = int(proxies_per_class)
        self.proxy_initializer = tf_keras.initializers.get(proxy_initializer)
        self.proxy_regularizer = tf_keras.regularizers.get(proxy_regularizer)
        self.normalize_embeddings = bool(normalize_embeddings)

    @property
    def num_proxies(self) -> int:
        return self.num_classes * self.proxies_per_class

    def build(self, input_shape) -> None:
        dim = tf.TensorShape(input_shape)[-1]
        if dim is None:
            raise ValueError("ProxySimilarity: the embedding dimension (last input axis) must be known")
        self.proxies = self.add_weight(
            name="proxies",
            shape=(self.num_proxies, int(dim)),
            initializer=self.proxy_initializer,
            regularizer=self.proxy_regularizer,
            trainable=self.trainable,
            dtype=tf.float32,
        )
        super().build(input_shape)

    def call(self, embeddings) -> tf.Tensor:
        embeddings = tf.cast(embeddings, tf.float32)
        if self.normalize_embeddings:
            embeddings = tf.math.l2_normalize(embeddings, axis=-1)
        return tf.matmul(embeddings, self.normalized_proxies(), transpose_b=True)

    def normalized_proxies(self) -> tf.Tensor:
        """``[C·K, D]`` unit-norm proxies."""
        return tf.math.l2_normalize(self.proxies, axis=-1)

    def compute_output_shape(self, input_shape) -> tf.TensorShape:
        return tf.TensorShape(input_shape)[:-1].concatenate([self.num_proxies])

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            proxies_per_class=self.proxies_per_class,
            proxy_initializer=tf_keras.initializers.serialize(self.proxy_initializer),
            proxy_regularizer=tf_keras.regularizers.serialize(self.proxy_regularizer)
            if self.proxy_regularizer is not None
            else None,
            normalize_embeddings=self.normalize_embeddings,
        )
        return config


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class SoftTripleCenterRegularizer(tf_keras.regularizers.Regularizer):
    """SoftTriple's centre regulariser (Qian et al. 2019, eq. 13), on a ``[C·K, D]`` proxy matrix:

        R = τ · Σ_c Σ_{k<k'} sqrt(2 + ε − 2 ŵ_{c,k}·ŵ_{c,k'}) / (C·K·(K−1))

    with unit-norm centres ŵ (so the root is the distance ‖ŵ_{c,k} − ŵ_{c,k'}‖). Minimising it merges
    redundant centres of a class, which lets a generous ``K`` adapt. It lives on the proxy weights (not in
    the loss) because the loss only sees similarities; as a weight regulariser Keras adds it to
    ``model.losses``. τ = 0.2 and ε = 1e-5 as in the official code. Zero when ``K == 1``.
    """

    def __init__(self, num_classes: int, proxies_per_class: int, weight: float = 0.2, epsilon: float = 1e-5):
        self.num_classes = int(num_classes)
        self.proxies_per_class = int(proxies_per_class)
        self.weight = float(weight)
        self.epsilon = float(epsilon)

    def __call__(self, proxies):
        k = self.proxies_per_class
        if k < 2 or self.weight == 0.0:
            return tf.constant(0.0, tf.float32)
        centres = tf.math.l2_normalize(tf.cast(proxies, tf.float32), axis=-1)
        centres = tf.reshape(centres, [self.num_classes, k, -1])
        cos = tf.matmul(centres, centres, transpose_b=True)  # [C, K, K]
        upper = tf.linalg.band_part(tf.ones([k, k]), 0, -1) - tf.eye(k)  # k < k'
        dist = tf.sqrt(tf.maximum(2.0 + self.epsilon - 2.0 * cos, 0.0))
        total = tf.reduce_sum(dist * upper[None])
        return self.weight * total / (self.num_classes * k * (k - 1))

    def get_config(self) -> dict:
        return dict(
            num_classes=self.num_classes,
            proxies_per_class=self.proxies_per_class,
            weight=self.weight,
            epsilon=self.epsilon,
        )


__all__ = ["ProxySimilarity", "SoftTripleCenterRegularizer", "fixed_centroids", "proxy_relevance"]

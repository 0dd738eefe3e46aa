"""Train one small embedding per loss on generated class data and compare labelled retrieval metrics.

The protocol is the deep-metric-learning one (Musgrave et al. 2020): train on the first half of the
classes, evaluate on the unseen second half with :func:`ce_retrieval.evaluation.labelled.labelled_retrieval_metrics`
(Recall@K, MAP@R, NMI, π_intra/π_inter). Every loss starts from the same initial weights and sees the same
P×K batches (``classes_per_batch`` classes × ``samples_per_class`` examples, so in-batch positives exist).

* Pair-based losses (NCA, LMNN, triplet, ...) get ``S = E Eᵀ`` and ``relevance_from_ids(y, y, exclude_self=True)``.
* Proxy losses (class attribute ``needs_proxies``) get ``S`` from a
  :class:`~ce_retrieval.modeling.proxies.ProxySimilarity` head and ``proxy_relevance(y)``; SoftTriple gets its
  ``K`` centres and centre regulariser; the centroid bound gets frozen centroids (one-hot if the embedding
  has at least as many dimensions as classes, else k-means on the sphere). Proxies learn ``proxy_lr_multiplier``
  times faster (ProxyAnchor's recipe).

Data (:func:`toy_data.make_labelled_data`): class means in a ``signal_dim`` subspace, isotropic within-class noise,
and ``nuisance_dim`` high-variance nuisance coordinates, randomly rotated: raw Euclidean retrieval is poor, a
learned metric that discounts the nuisance directions is good.

Formerly ``ce-retrieval dml-compare`` (same flags and output):

    python -m benchmarks.losses.dml_comparison --losses ProxyNCALoss NCALoss --steps 300
"""

from __future__ import annotations

import argparse
import sys
import time

# isort: off
import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from benchmarks.losses.toy_data import make_labelled_data  # noqa: E402
from ce_retrieval.data.pk_sampler import pk_sample  # noqa: E402
from ce_retrieval.evaluation.labelled import labelled_retrieval_metrics  # noqa: E402
from ce_retrieval.losses import get as get_loss  # noqa: E402
from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.modeling.proxies import (  # noqa: E402
    ProxySimilarity,
    SoftTripleCenterRegularizer,
    fixed_centroids,
    proxy_relevance,
)
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402

# isort: on

DEFAULT_LOSSES = ("ProxyNCALoss", "ProxyAnchorLoss", "SoftTripleLoss", "NCALoss", "LMNNLoss", "CentroidUpperBoundLoss")


def _embedding_model(input_dim: int, embedding_dim: int, hidden: int, seed: int) -> tf_keras.Model:
    init = lambda i: tf_keras.initializers.GlorotUniform(seed=seed + i)
    inputs = tf_keras.Input([input_dim])
    h = tf_keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(0))(inputs)
    e = tf_keras.layers.Dense(embedding_dim, kernel_initializer=init(1))(h)
    return tf_keras.Model(inputs, tf.math.l2_normalize(e, axis=-1))


def _proxy_head(loss, num_classes: int, embedding_dim: int, seed: int) -> ProxySimilarity:
    name = type(loss).__name__
    if name == "CentroidUpperBoundLoss":
        method = "one_hot" if embedding_dim >= num_classes else "kmeans"
        centroids = fixed_centroids(num_classes, embedding_dim, method=method, seed=seed)
        head = ProxySimilarity(
            num_classes, proxy_initializer=tf_keras.initializers.Constant(centroids), trainable=False
        )
    elif name == "SoftTripleLoss":
        k = loss.proxies_per_class
        head = ProxySimilarity(
            num_classes,
            k,
            proxy_initializer=tf_keras.initializers.HeNormal(seed=seed),
            proxy_regularizer=SoftTripleCenterRegularizer(num_classes, k),
        )
    else:
        head = ProxySimilarity(num_classes, proxy_initializer=tf_keras.initializers.HeNormal(seed=seed))
    head.build([None, embedding_dim])
    return head


def _pk_batches(y: np.ndarray, classes_per_batch: int, samples_per_class: int, steps: int, seed: int):
    """Row indices of ``steps`` P x K batches, drawn by :func:`ce_retrieval.data.pk_sample`."""
    rows = tf.data.Dataset.from_tensor_slices((np.arange(len(y)), y))
    p = min(classes_per_batch, len(np.unique(y)))
    for idx, _ in pk_sample(rows, p, samples_per_class, seed=seed, num_batches=steps):
        yield idx.numpy()


def train_embedding(
    loss,
    x: np.ndarray,
    y: np.ndarray,
    embedding_dim: int = 16,
    hidden: int = 64,
    steps: int = 300,
    classes_per_batch: int = 8,
    samples_per_class: int = 4,
    learning_rate: float = 3e-3,
    proxy_lr_multiplier: float = 10.0,
    seed: int = 0,
) -> tf_keras.Model:
    """Trains and returns the embedding model (``x -> unit-norm embedding``) with ``loss`` on labels ``y``."""
    seed_everything(seed, deterministic=False)
    model = _embedding_model(x.shape[1], embedding_dim, hidden, seed)
    classes, y_idx = np.unique(y, return_inverse=True)
    head = _proxy_head(loss, len(classes), embedding_dim, seed) if loss.needs_proxies else None
    opt = tf_keras.optimizers.Adam(learning_rate)
    proxy_vars = head.trainable_variables if head is not None else []
    proxy_opt = tf_keras.optimizers.Adam(learning_rate * proxy_lr_multiplier) if proxy_vars else None

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            emb = model(xb, training=True)
            if head is not None:
                value = loss(proxy_relevance(yb, head.num_classes, head.proxies_per_class), head(emb))
                value += tf.add_n(head.losses) if head.losses else 0.0
            else:
                value = loss(relevance_from_ids(yb, yb, exclude_self=True), tf.matmul(emb, emb, transpose_b=True))
        grads = tape.gradient(value, model.trainable_variables + proxy_vars)
        n = len(model.trainable_variables)
        opt.apply_gradients(zip(grads[:n], model.trainable_variables, strict=True))
        if proxy_opt is not None:
            proxy_opt.apply_gradients(zip(grads[n:], proxy_vars, strict=True))
        return value

    for idx in _pk_batches(y_idx, classes_per_batch, samples_per_class, steps, seed):
        step(tf.constant(x[idx]), tf.constant(y_idx[idx].astype(np.int32)))
    return model


def compare_losses(
    loss_names=DEFAULT_LOSSES,
    data=None,
    steps: int = 300,
    embedding_dim: int = 16,
    ks=(1, 2, 4, 8),
    split: str = "classes",
    seed: int = 0,
    **train_kwargs,
) -> dict:
    """``{name: metrics}`` for each loss (a registered name, a config dict or an instance) on held-out data,
    plus ``'untrained'`` (the shared initial model) and ``'raw features'``. ``data = (x, y)`` defaults to
    :func:`make_labelled_data`. ``split='classes'``: train on the first half of the classes, test on the rest
    (the DML protocol); ``split='samples'``: test on every fourth example of each class, train on the others
    (seen classes). Each entry also has ``train_seconds``."""
    x, y = data if data is not None else make_labelled_data(seed=seed)
    if split == "classes":
        classes = np.unique(y)
        train = np.isin(y, classes[: len(classes) // 2])
    elif split == "samples":
        rank_in_class = np.zeros(len(y), int)
        for c in np.unique(y):
            rank_in_class[y == c] = np.arange(np.sum(y == c))
        train = rank_in_class % 4 != 0
    else:
        raise ValueError(f"compare_losses: split must be 'classes' or 'samples', got {split!r}")
    x_train, y_train, x_test, y_test = x[train], y[train], x[~train], y[~train]
    results = {
        "raw features": labelled_retrieval_metrics(
            x_test / np.linalg.norm(x_test, axis=1, keepdims=True), y_test, ks=ks, seed=seed
        )
    }
    seed_everything(seed, deterministic=False)
    untrained = _embedding_model(x.shape[1], embedding_dim, train_kwargs.get("hidden", 64), seed)
    results["untrained"] = labelled_retrieval_metrics(
        untrained(x_test, training=False).numpy(), y_test, ks=ks, seed=seed
    )
    for name in loss_names:
        loss = get_loss(name)
        name = name if isinstance(name, str) else type(loss).__name__
        start = time.perf_counter()
        model = train_embedding(
            loss, x_train, y_train, embedding_dim=embedding_dim, steps=steps, seed=seed, **train_kwargs
        )
        seconds = time.perf_counter() - start
        results[name] = labelled_retrieval_metrics(model(x_test, training=False).numpy(), y_test, ks=ks, seed=seed)
        results[name]["train_seconds"] = seconds
    return results


def format_table(results: dict, columns=("recall@1", "recall@4", "map@r", "nmi", "pi_ratio")) -> str:
    """A plain-text table, one row per loss."""
    width = max(len(name) for name in results) + 2
    col = [max(11, len(c) + 2) for c in columns]
    lines = [f"{'loss':<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, col, strict=True))]
    for name, metrics in results.items():
        cells = "".join(f"{metrics.get(c, float('nan')):>{w}.4f}" for c, w in zip(columns, col, strict=True))
        lines.append(f"{name:<{width}}" + cells)
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--losses", nargs="+", default=list(DEFAULT_LOSSES), help="registered loss class names")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--classes", type=int, default=40, help="generated classes (half train, half test)")
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument(
        "--split",
        choices=["classes", "samples"],
        default="classes",
        help="test on unseen classes (DML protocol) or on held-out samples of the training classes",
    )
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    data = make_labelled_data(num_classes=args.classes, per_class=args.per_class, seed=args.seed)
    results = compare_losses(
        args.losses, data=data, steps=args.steps, embedding_dim=args.embedding_dim, split=args.split, seed=args.seed
    )
    print(format_table(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="train small embeddings with several metric-learning losses and compare labelled retrieval metrics"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

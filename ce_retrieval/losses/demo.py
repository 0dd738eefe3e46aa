"""A few-second check that a loss trains an embedding: Gaussian class data, an MLP tower, ``model.fit``.

Data: C class means in ``signal_dim`` dimensions; every sample is its class mean plus noise, followed by
``nuisance_dim`` dimensions of large class-independent noise. Raw (or randomly projected) inputs therefore
retrieve poorly, and a tower that learns to ignore the nuisance retrieves well. A training batch is B
labels drawn at random with two independent samples each (query view, document view); the relevance
matrix marks every same-class pair as positive, so rows have several positives, as with 5 captions per
image. Recall@1: a held-out query is a hit when its nearest gallery sample (cosine) has its class.

Used by the ``ce-retrieval losses`` command and by the behaviour tests (training improves recall@1).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from ce_retrieval.losses.margin_softmax import AnnealingStepCallback
from ce_retrieval.losses.registry import get


@dataclasses.dataclass
class DemoConfig:
    num_classes: int = 16
    signal_dim: int = 8
    nuisance_dim: int = 24
    noise: float = 0.6
    nuisance_noise: float = 2.0
    embed_dim: int = 16
    hidden_dim: int = 64
    batch_size: int = 48
    steps: int = 150
    learning_rate: float = 3e-3
    eval_queries: int = 256
    gallery_per_class: int = 4
    seed: int = 0


class GaussianClasses:
    """Sampler of the synthetic class data described in the module docstring."""

    def __init__(self, config: DemoConfig):
        self.config = config
        rng = np.random.default_rng(config.seed)
        self.means = rng.normal(size=(config.num_classes, config.signal_dim)).astype(np.float32)

    def sample(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = self.config
        signal = self.means[labels] + c.noise * rng.normal(size=(len(labels), c.signal_dim))
        nuisance = c.nuisance_noise * rng.normal(size=(len(labels), c.nuisance_dim))
        return np.concatenate([signal, nuisance], axis=1).astype(np.float32)

    def training_batches(self, steps: int, rng: np.random.Generator) -> tf.data.Dataset:
        """``steps`` batches of ``((queries, documents), relevance)``; relevance is ``[B, B]``."""
        c = self.config
        labels = rng.integers(0, c.num_classes, size=(steps, c.batch_size))
        queries = np.stack([self.sample(row, rng) for row in labels])
        documents = np.stack([self.sample(row, rng) for row in labels])
        relevance = (labels[:, :, None] == labels[:, None, :]).astype(np.float32)  # relevance_from_ids per batch
        return tf.data.Dataset.from_tensor_slices(((queries, documents), relevance))


def build_model(config: DemoConfig) -> tuple[tf.keras.Model, tf.keras.Model]:
    """(two-tower training model returning S = cos(q, d) ``[B, B]``, the shared tower alone)."""
    tf.keras.utils.set_random_seed(config.seed)
    input_dim = config.signal_dim + config.nuisance_dim
    tower = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(config.hidden_dim, activation="relu", input_shape=(input_dim,)),
            tf.keras.layers.Dense(config.embed_dim),
            tf.keras.layers.UnitNormalization(),
        ],
        name="tower",
    )
    queries = tf.keras.Input((input_dim,), name="queries")
    documents = tf.keras.Input((input_dim,), name="documents")
    similarity = tf.keras.layers.Lambda(lambda t: tf.matmul(t[0], t[1], transpose_b=True), name="similarity")(
        [tower(queries), tower(documents)]
    )
    return tf.keras.Model([queries, documents], similarity), tower


def recall_at_1(tower: tf.keras.Model, data: GaussianClasses, rng: np.random.Generator) -> float:
    c = data.config
    query_labels = rng.integers(0, c.num_classes, size=c.eval_queries)
    gallery_labels = np.repeat(np.arange(c.num_classes), c.gallery_per_class)
    queries = tower(data.sample(query_labels, rng), training=False).numpy()
    gallery = tower(data.sample(gallery_labels, rng), training=False).numpy()
    nearest = np.argmax(queries @ gallery.T, axis=1)
    return float(np.mean(gallery_labels[nearest] == query_labels))


def train_and_evaluate(loss, config: DemoConfig | None = None, **overrides) -> dict:
    """Train the demo tower with ``loss`` (name, config dict or instance); recall@1 before and after."""
    config = dataclasses.replace(config or DemoConfig(), **overrides)
    loss = get(loss)
    data = GaussianClasses(config)
    model, tower = build_model(config)
    before = recall_at_1(tower, data, np.random.default_rng(config.seed + 1))
    model.compile(optimizer=tf.keras.optimizers.Adam(config.learning_rate), loss=loss)
    history = model.fit(
        data.training_batches(config.steps, np.random.default_rng(config.seed + 2)),
        epochs=1,
        verbose=0,
        callbacks=[AnnealingStepCallback(loss)] if isinstance(getattr(loss, "step", None), tf.Variable) else [],
    )
    after = recall_at_1(tower, data, np.random.default_rng(config.seed + 1))
    return {
        "loss": type(loss).__name__,
        "recall_at_1_before": before,
        "recall_at_1_after": after,
        "final_loss": float(history.history["loss"][-1]),
    }


__all__: list[str] = []

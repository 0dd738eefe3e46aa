"""A few-second check that a loss trains an embedding: Gaussian class data, an MLP tower, ``model.fit``.

Data (``toy_data.GaussianClasses``): C class means in ``signal_dim`` dimensions; every sample is its class mean
plus noise, followed by ``nuisance_dim`` dimensions of large class-independent noise. Raw (or randomly projected)
inputs therefore retrieve poorly, and a tower that learns to ignore the nuisance retrieves well. A training batch
is B labels drawn at random with two independent samples each (query view, document view); the relevance
matrix marks every same-class pair as positive, so rows have several positives, as with 5 captions per
image. Recall@1: a held-out query is a hit when its nearest gallery sample (cosine) has its class.

Trains the embedding with each chosen loss and prints recall@1 before and after, so a loss can be sanity-checked
in seconds on CPU (formerly ``ce-retrieval losses``; same flags and output). The behaviour tests
(``tests/benchmarks/test_toy_losses.py``: training improves recall@1) use :func:`train_and_evaluate`.

    python -m benchmarks.losses.toy_losses --loss SampledSoftmax CrossExampleSoftmax --steps 200 --seed 0
    python -m benchmarks.losses.toy_losses --list
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

# isort: off
import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from benchmarks.losses.toy_data import GaussianClasses  # noqa: E402
from ce_retrieval import losses  # noqa: E402
from ce_retrieval.losses.margin_softmax import AnnealingStepCallback  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402

# isort: on

PAPER_LOSSES = ["SampledSoftmax", "StochasticNegativeMining", "CrossExampleSoftmax", "CrossExampleNegativeMining"]


@dataclasses.dataclass
class ToyConfig:
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


def make_classes(config: ToyConfig) -> GaussianClasses:
    """The class data of ``config`` (means drawn from ``config.seed``, kept in float32)."""
    return GaussianClasses.draw(
        config.num_classes,
        config.signal_dim,
        config.nuisance_dim,
        noise=config.noise,
        nuisance_scale=config.nuisance_noise,
        seed=config.seed,
        dtype=np.float32,
    )


def training_batches(
    classes: GaussianClasses, batch_size: int, steps: int, rng: np.random.Generator
) -> tf.data.Dataset:
    """``steps`` batches of ``((queries, documents), relevance)``; relevance is ``[B, B]``."""
    labels = rng.integers(0, classes.num_classes, size=(steps, batch_size))
    queries = np.stack([classes.sample(row, rng) for row in labels]).astype(np.float32)
    documents = np.stack([classes.sample(row, rng) for row in labels]).astype(np.float32)
    relevance = (labels[:, :, None] == labels[:, None, :]).astype(np.float32)  # relevance_from_ids per batch
    return tf.data.Dataset.from_tensor_slices(((queries, documents), relevance))


def build_model(config: ToyConfig) -> tuple[tf_keras.Model, tf_keras.Model]:
    """(two-tower training model returning S = cos(q, d) ``[B, B]``, the shared tower alone)."""
    seed_everything(config.seed, deterministic=False)
    input_dim = config.signal_dim + config.nuisance_dim
    tower = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(config.hidden_dim, activation="relu", input_shape=(input_dim,)),
            tf_keras.layers.Dense(config.embed_dim),
            tf_keras.layers.UnitNormalization(),
        ],
        name="tower",
    )
    queries = tf_keras.Input((input_dim,), name="queries")
    documents = tf_keras.Input((input_dim,), name="documents")
    similarity = tf_keras.layers.Lambda(lambda t: tf.matmul(t[0], t[1], transpose_b=True), name="similarity")(
        [tower(queries), tower(documents)]
    )
    return tf_keras.Model([queries, documents], similarity), tower


def recall_at_1(tower: tf_keras.Model, classes: GaussianClasses, config: ToyConfig, rng: np.random.Generator) -> float:
    query_labels = rng.integers(0, classes.num_classes, size=config.eval_queries)
    gallery_labels = np.repeat(np.arange(classes.num_classes), config.gallery_per_class)
    queries = tower(classes.sample(query_labels, rng).astype(np.float32), training=False).numpy()
    gallery = tower(classes.sample(gallery_labels, rng).astype(np.float32), training=False).numpy()
    nearest = np.argmax(queries @ gallery.T, axis=1)
    return float(np.mean(gallery_labels[nearest] == query_labels))


def train_and_evaluate(loss, config: ToyConfig | None = None, **overrides) -> dict:
    """Train the toy tower with ``loss`` (name, config dict or instance); recall@1 before and after."""
    config = dataclasses.replace(config or ToyConfig(), **overrides)
    loss = losses.get(loss)
    classes = make_classes(config)
    model, tower = build_model(config)
    before = recall_at_1(tower, classes, config, np.random.default_rng(config.seed + 1))
    model.compile(optimizer=tf_keras.optimizers.Adam(config.learning_rate), loss=loss)
    history = model.fit(
        training_batches(classes, config.batch_size, config.steps, np.random.default_rng(config.seed + 2)),
        epochs=1,
        verbose=0,
        callbacks=[AnnealingStepCallback(loss)] if loss.annealed else [],
    )
    after = recall_at_1(tower, classes, config, np.random.default_rng(config.seed + 1))
    return {
        "loss": type(loss).__name__,
        "recall_at_1_before": before,
        "recall_at_1_after": after,
        "final_loss": float(history.history["loss"][-1]),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loss",
        nargs="+",
        default=PAPER_LOSSES,
        metavar="NAME",
        help="loss class names (see --list); default: the paper's four",
    )
    parser.add_argument("--steps", type=int, default=150, help="training steps (batches)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--list", action="store_true", help="list the available losses and exit")


def run(args) -> int:
    if args.list:
        print("\n".join(losses.available()))
        return 0
    unknown = [name for name in args.loss if name not in losses.available()]
    if unknown:
        print(f"unknown loss(es) {', '.join(unknown)}; available: {', '.join(losses.available())}")
        return 2
    if args.steps < 1 or args.batch_size < 2:
        print("--steps must be >= 1 and --batch-size >= 2")
        return 2
    config = ToyConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size)
    print("| loss | recall@1 before | recall@1 after | final loss |")
    print("|---|---:|---:|---:|")
    for name in args.loss:
        result = train_and_evaluate(name, config)
        print(
            f"| {name} | {result['recall_at_1_before']:.3f} | {result['recall_at_1_after']:.3f} "
            f"| {result['final_loss']:.4f} |",
            flush=True,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train a small embedding on generated data with a chosen loss")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

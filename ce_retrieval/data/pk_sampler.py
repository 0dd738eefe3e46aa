"""P x K class-balanced batches for deep metric learning: P classes, K examples of each (e.g. 16 x 2).

Pair and triplet losses need positives *and* negatives in every batch; uniform batches over many classes
hold almost no positive pair. The standard remedy (Hermans et al. 2017; ProbML 16.2.6: "picking B/Nc classes
and Nc = 2 samples per class works well") draws, for every batch, P distinct classes uniformly and K distinct
examples of each, so a batch of B = P K examples has P K (K - 1) ordered positive pairs.

``pk_sample(dataset, P, K, seed=...)`` (or ``dataset.apply(pk_sampler(P, K, seed=...))``) turns any finite
``tf.data`` dataset of ``(example, label)`` elements (or any structure, with ``label_fn``) into an endless
(or ``num_batches`` long) dataset of batches of P K elements, ordered class by class. Batch ``b`` is a pure
function of ``(seed, b)`` (stateless random ops), so a seed makes the stream reproducible across runs,
iterators and ``tf.data`` parallelism. Classes with fewer than K examples raise a ``ValueError`` naming them,
unless ``replacement=True``, which samples those classes' examples with replacement (every class with at
least K examples is always sampled without replacement).

The source is read once and held in memory (like ``dataset.cache()``): elements must have fully defined
shapes (scalars such as encoded image bytes and captions, ids, fixed-size features). Decode and augment
*after* sampling (``pk_sample(...).map(decode)``), which is also where that work belongs.
"""

from __future__ import annotations

import random
from typing import Callable

import numpy as np
import tensorflow as tf


def pk_sampler(
    classes_per_batch: int,
    examples_per_class: int,
    seed: int | None = None,
    replacement: bool = False,
    num_batches: int | None = None,
    label_fn: Callable | None = None,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """The transformation for ``dataset.apply(...)``; arguments as :func:`pk_sample`."""
    return lambda dataset: pk_sample(
        dataset, classes_per_batch, examples_per_class, seed, replacement, num_batches, label_fn
    )


def pk_sample(
    dataset: tf.data.Dataset,
    classes_per_batch: int,
    examples_per_class: int,
    seed: int | None = None,
    replacement: bool = False,
    num_batches: int | None = None,
    label_fn: Callable | None = None,
) -> tf.data.Dataset:
    """Batches of ``classes_per_batch`` (P) classes x ``examples_per_class`` (K) examples from ``dataset``.

    Args:
      dataset: finite dataset; elements ``(example, label)``, or any structure with ``label_fn``.
      seed: makes the stream deterministic; None draws a fresh seed.
      replacement: sample classes with fewer than K examples with replacement instead of raising.
      num_batches: length of the output; None repeats forever.
      label_fn: element -> label (integer or string scalar); applied to the batched (stacked) elements,
        so indexing such as ``lambda e: e["image_id"]`` works. Default: the second item of a pair.
    Returns:
      A dataset of batched elements (leading dimension P K), class-major: classes c_1..c_P, K each.
    """
    p, k = int(classes_per_batch), int(examples_per_class)
    if p < 1 or k < 1:
        raise ValueError(f"pk_sample: classes_per_batch and examples_per_class must be >= 1, got {p} and {k}")
    if num_batches is not None and num_batches < 1:
        raise ValueError(f"pk_sample: num_batches must be >= 1 or None, got {num_batches}")
    data = _materialise(dataset)
    labels = _labels(data, label_fn, dataset.element_spec)
    classes, class_of = np.unique(labels, return_inverse=True)
    counts = np.bincount(class_of, minlength=len(classes))
    if len(classes) < p:
        raise ValueError(f"pk_sample: {p} classes per batch requested but the dataset has only {len(classes)} classes")
    short = np.flatnonzero(counts < k)
    if len(short) and not replacement:
        shown = ", ".join(f"{_show(classes[c])} ({counts[c]})" for c in short[:10])
        more = f" and {len(short) - 10} more" if len(short) > 10 else ""
        raise ValueError(
            f"pk_sample: {len(short)} classes have fewer than examples_per_class={k} examples: {shown}{more}. "
            "Drop them, lower K, or pass replacement=True to sample them with replacement."
        )
    width = max(int(counts.max()), k)
    table = np.full((len(classes), width), 0, dtype=np.int64)
    order = np.argsort(class_of, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for c in range(len(classes)):  # builds the lookup table once, outside the graph
        table[c, : counts[c]] = order[starts[c] : starts[c] + counts[c]]
    table = tf.constant(table)
    counts_t = tf.constant(counts, tf.int64)
    base = int(seed) if seed is not None else random.SystemRandom().randrange(2**31)

    def batch(step):
        seed_classes = tf.stack([tf.constant(base, tf.int64), 2 * step])
        seed_members = tf.stack([tf.constant(base, tf.int64), 2 * step + 1])
        class_keys = tf.random.stateless_uniform([len(classes)], seed=seed_classes)
        chosen = tf.math.top_k(class_keys, k=p).indices  # P distinct classes, uniformly
        rows = tf.gather(table, chosen)  # [P, width]
        size = tf.gather(counts_t, chosen)[:, None]  # [P, 1]
        member_keys = tf.random.stateless_uniform([p, width], seed=seed_members)
        valid = tf.range(width, dtype=tf.int64)[None, :] < size
        distinct = tf.math.top_k(tf.where(valid, member_keys, -tf.ones_like(member_keys)), k=k).indices
        # Classes with fewer than K examples (replacement=True only): uniform draws with replacement.
        with_replacement = tf.cast(tf.floor(member_keys[:, :k] * tf.cast(size, tf.float32)), tf.int32)
        position = tf.where(size >= k, distinct, tf.minimum(with_replacement, tf.cast(size, tf.int32) - 1))
        index = tf.reshape(tf.gather(rows, position, batch_dims=1), [-1])
        return tf.nest.map_structure(lambda t: tf.gather(t, index), data)

    steps = tf.data.Dataset.counter() if num_batches is None else tf.data.Dataset.range(num_batches)
    return steps.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _materialise(dataset: tf.data.Dataset):
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(
                "pk_sample needs elements of fully defined shape (it holds them in memory as stacked tensors); "
                f"got {spec}. Sample encoded bytes / ids and decode after sampling."
            )
    if tf.data.experimental.cardinality(dataset) == tf.data.experimental.INFINITE_CARDINALITY:
        raise ValueError("pk_sample needs a finite dataset (it reads every label once); remove .repeat()")
    parts = list(dataset.batch(65536))
    if not parts:
        raise ValueError("pk_sample: the dataset is empty")
    return tf.nest.map_structure(lambda *t: tf.concat(t, axis=0), *parts)


def _labels(data, label_fn, element_spec) -> np.ndarray:
    if label_fn is None:
        if not (isinstance(element_spec, tuple) and len(element_spec) == 2):
            raise ValueError(
                "pk_sample: elements must be (example, label) pairs, or pass label_fn to find the label "
                f"(element_spec: {element_spec})"
            )
        label_fn = lambda element: element[1]
    labels = tf.convert_to_tensor(label_fn(data))
    if labels.shape.rank != 1:
        raise ValueError(f"pk_sample: labels must be scalars per element, got batched label shape {labels.shape}")
    if not (labels.dtype.is_integer or labels.dtype == tf.string):
        raise ValueError(f"pk_sample: labels must be integers or strings, got {labels.dtype.name}")
    return labels.numpy()


def _show(label) -> str:
    return label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)


__all__ = ["pk_sample", "pk_sampler"]

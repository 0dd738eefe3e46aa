"""P x K sampler: batch composition, determinism, uniformity, errors, replacement, dict elements."""

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval.data.pk_sampler import pk_sample, pk_sampler


def labelled(counts):
    labels = np.concatenate([np.full(c, i) for i, c in enumerate(counts)]).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((np.arange(len(labels), dtype=np.float32), labels)), labels


def test_batches_are_p_classes_times_k_distinct_examples():
    ds, labels = labelled([5, 4, 6, 3, 4, 7])
    for x, y in ds.apply(pk_sampler(3, 2, seed=0, num_batches=20)):
        x, y = x.numpy().astype(int), y.numpy()
        assert x.shape == (6,) and len(set(x)) == 6  # no example twice
        np.testing.assert_array_equal(labels[x], y)  # labels travel with their examples
        assert len(set(y)) == 3 and all(np.sum(y == c) == 2 for c in set(y))
        assert np.all(y[0::2] == y[1::2])  # class-major order


def test_deterministic_with_seed_and_different_across_seeds():
    ds, _ = labelled([4] * 8)
    first = [x.numpy() for x, _ in pk_sample(ds, 4, 2, seed=7, num_batches=5)]
    second = [x.numpy() for x, _ in pk_sample(ds, 4, 2, seed=7, num_batches=5)]
    other = [x.numpy() for x, _ in pk_sample(ds, 4, 2, seed=8, num_batches=5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    endless = pk_sample(ds, 4, 2, seed=7)
    assert tf.data.experimental.cardinality(endless) == tf.data.experimental.INFINITE_CARDINALITY


def test_classes_and_examples_are_drawn_uniformly():
    ds, labels = labelled([3] * 6)
    seen = np.concatenate([x.numpy().astype(int) for x, _ in pk_sample(ds, 2, 2, seed=1, num_batches=600)])
    counts = np.bincount(seen, minlength=18)
    # each class is picked with probability 2/6, each of its 3 examples with 2/3 -> 600 * 2/9 draws each
    np.testing.assert_allclose(counts, 600 * 2 / 9, rtol=0.2)


def test_short_classes_raise_or_use_replacement():
    ds, labels = labelled([4, 1, 4, 2])
    with pytest.raises(ValueError, match=r"2 classes have fewer than examples_per_class=3 examples: 1 \(1\), 3 \(2\)"):
        pk_sample(ds, 2, 3, seed=0)
    for x, y in pk_sample(ds, 4, 3, seed=0, replacement=True, num_batches=5):
        x, y = x.numpy().astype(int), y.numpy()
        np.testing.assert_array_equal(labels[x], y)
        for c in (0, 2):  # classes with >= K examples stay without replacement
            assert len(set(x[y == c])) == 3
        assert set(x[y == 1]) == {4}


def test_dict_elements_with_label_fn_and_string_labels():
    images = tf.constant([b"a", b"b", b"c", b"d", b"e", b"f"])
    captions = tf.constant(["x", "y", "z", "u", "v", "w"])
    owner = tf.constant(["cat", "cat", "dog", "dog", "emu", "emu"])
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "caption": captions, "owner": owner})
    (batch,) = list(pk_sample(ds, 2, 2, seed=3, num_batches=1, label_fn=lambda e: e["owner"]))
    assert set(batch) == {"image", "caption", "owner"} and batch["image"].shape == (4,)
    pairs = {(i.decode(), o.decode()) for i, o in zip(batch["image"].numpy(), batch["owner"].numpy(), strict=True)}
    assert pairs <= {("a", "cat"), ("b", "cat"), ("c", "dog"), ("d", "dog"), ("e", "emu"), ("f", "emu")}


def test_clear_errors():
    ds, _ = labelled([2, 2])
    with pytest.raises(ValueError, match="only 2 classes"):
        pk_sample(ds, 3, 2)
    with pytest.raises(ValueError, match="must be >= 1"):
        pk_sample(ds, 0, 2)
    with pytest.raises(ValueError, match="finite dataset"):
        pk_sample(ds.repeat(), 2, 2)
    with pytest.raises(ValueError, match=r"\(example, label\) pairs"):
        pk_sample(ds.map(lambda x, y: {"x": x, "y": y}), 2, 2)
    ragged = tf.data.Dataset.from_generator(lambda: iter([[1.0], [1.0, 2.0]]), output_signature=tf.TensorSpec([None]))
    with pytest.raises(ValueError, match="fully defined shape"):
        pk_sample(tf.data.Dataset.zip((ragged, tf.data.Dataset.range(2))), 1, 1)
    with pytest.raises(ValueError, match="integers or strings"):
        pk_sample(tf.data.Dataset.from_tensor_slices((np.zeros(4), np.zeros(4, np.float32))), 1, 1)

"""The threshold partitions' build (``partitions.build_partitions``): leaf sums by sorting equal to one-row-at-a-time
sums, the leaf-ordered copy it hands back equal to ``x[order]``, and leaves that describe their members (offsets,
means, radii bounding every member)."""

import numpy as np
from export_fixtures import clustered_unit_vectors

from ce_retrieval.search.partitions import _assign, _leaf_sums, build_partitions, leaf_of_rows


def test_leaf_sums_equal_one_row_at_a_time():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 6)).astype(np.float32)
    assign = rng.integers(0, 40, size=500)
    assign[assign == 7] = 8  # an empty leaf
    sums, counts = _leaf_sums(x, assign, 41)
    want = np.zeros((41, 6))
    np.add.at(want, assign, x.astype(np.float64))
    np.testing.assert_allclose(sums, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(counts, np.bincount(assign, minlength=41))
    assert counts[7] == 0 and not sums[7].any() and counts[40] == 0


def test_assign_in_chunks_is_the_nearest_centre():
    x = clustered_unit_vectors(3000, 16, num_clusters=20, spread=0.6, seed=1)
    centres = x[:50] / np.linalg.norm(x[:50], axis=1, keepdims=True)
    np.testing.assert_array_equal(_assign(x, centres, chunk=128), np.argmax(x @ centres.T, axis=1))


def test_build_hands_back_the_leaf_ordered_copy_and_leaves_bound_their_members():
    x = clustered_unit_vectors(4000, 16, num_clusters=30, spread=0.6, seed=2)
    order, parts = build_partitions(x, 40, seed=3)
    order2, parts2, xs = build_partitions(x, 40, seed=3, ordered=True)
    np.testing.assert_array_equal(order, order2)
    np.testing.assert_array_equal(xs, x[order])
    np.testing.assert_array_equal(parts.centers, parts2.centers)
    assert sorted(order.tolist()) == list(range(len(x))) and parts.offsets[-1] == len(x)
    assert np.all(np.diff(parts.offsets) > 0)  # empty leaves dropped
    leaf = leaf_of_rows(parts, np.arange(len(x)))
    for v in range(parts.num_leaves):
        members = xs[leaf == v]
        np.testing.assert_allclose(parts.centers[v], members.mean(axis=0), atol=1e-5)
        assert np.linalg.norm(members - parts.centers[v], axis=1).max() <= parts.radii[v] + 1e-6

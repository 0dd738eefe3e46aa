"""``benchmarks/common/galleries.py``: the one clustered-gallery generator draws what the generators it replaced drew
(same random calls in the same order: the recorded galleries reproduce), any chunk of a keyed gallery can be drawn
alone, and its labels are the clusters the rows were drawn from."""

import numpy as np
import pytest

from benchmarks.common.galleries import cluster_labels, clustered


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_keyed_draws_are_the_sharded_index_benchmarks_chunks():
    """The former ``sharded_index._gallery_chunks``: centres from ``default_rng(seed)``, each chunk from
    ``default_rng([seed, start])``, float32 noise."""
    n, dim, clusters, seed, chunk = 700, 16, 30, 4, 300
    centres = np.random.default_rng(seed).normal(size=(clusters, dim)).astype(np.float32)
    want = []
    for start in range(0, n, chunk):
        rng = np.random.default_rng([seed, start])
        rows = min(chunk, n - start)
        want.append(_unit(centres[rng.integers(0, clusters, rows)] + rng.standard_normal((rows, dim), np.float32)))
    np.testing.assert_array_equal(clustered(n, dim, clusters, seed, chunk=chunk), np.concatenate(want))


def test_shared_draws_are_the_ann_benchmarks_gallery():
    """The former ``ann.clustered``: one generator for the centres and the rows, scaled by sqrt(d), in chunks."""
    n, dim, clusters, seed, spread, chunk = 500, 8, 12, 3, 0.4, 200
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32) / np.sqrt(dim)
    want = []
    for s in range(0, n, chunk):
        m = min(n, s + chunk) - s
        want.append(
            _unit(
                centres[rng.integers(0, clusters, m)]
                + spread * rng.normal(size=(m, dim)).astype(np.float32) / np.sqrt(dim)
            )
        )
    got = clustered(n, dim, clusters, seed, spread=spread, draws="shared", scaled=True, chunk=chunk)
    np.testing.assert_array_equal(got, np.concatenate(want).astype(np.float32))  # it wrote into a float32 array


@pytest.mark.parametrize("rank", [0, 4])
def test_a_chunk_of_a_keyed_gallery_can_be_drawn_alone(rank):
    whole = clustered(600, 16, 20, 5, rank=rank, chunk=200)
    np.testing.assert_array_equal(clustered(200, 16, 20, 5, rank=rank, chunk=200, start=400), whole[400:])
    other = clustered(200, 16, 20, 5, rank=rank, chunk=200, stream=1)  # another sample of the same clusters
    assert not np.isin(other.view("V64"), whole.view("V64")).any()


def test_labels_are_the_clusters_the_rows_were_drawn_from():
    x = clustered(500, 32, 10, 2, spread=0.01, chunk=128)
    centres = np.random.default_rng(2).normal(size=(10, 32))
    np.testing.assert_array_equal(cluster_labels(500, 10, 2, chunk=128), np.argmax(x @ centres.T, axis=1))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"rank": 4, "noise": 1.0}, {"draws": "shared"}, {"draws": "shared", "scaled": True, "float64": True}],
)
def test_every_variant_gives_float32_unit_vectors(kwargs):
    x = clustered(100, 16, 5, 0, **kwargs)
    assert x.dtype == np.float32 and x.shape == (100, 16)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="draws"):
        clustered(10, 4, 2, draws="other")

"""The scan's cut at tau (``partitions.cut_at``): the same entries, in the same order, as ``np.nonzero`` of the
whole block, on each of its paths (few hit columns: column maxima first; many, or a block of at most 4,096 scores:
the plain cut), with NaN entries and empty blocks."""

import numpy as np
import pytest

from ce_retrieval.search.partitions import cut_at


def reference(block, tau):
    bi, ri = np.nonzero(block >= tau)
    return bi, ri, block[bi, ri]


@pytest.mark.parametrize("tau", [3.0, 2.0, 0.5, -10.0])  # a few hit columns ... every entry
@pytest.mark.parametrize("shape", [(1, 50), (7, 300), (64, 4096)])
def test_cut_equals_nonzero(shape, tau):
    block = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
    got, want = cut_at(block, tau), reference(block, tau)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_cut_takes_the_column_path_and_keeps_ties_and_ignores_nan():
    block = np.zeros((5, 1000), np.float32)  # 5,000 scores: past the small-block cut
    block[3, 10] = 0.5  # a tie at tau
    block[0, 700] = 0.9
    block[1, 700] = np.nan  # a NaN beside a hit in its column must not hide the hit
    block[2, 20] = np.nan
    bi, ri, s = cut_at(block, 0.5)
    np.testing.assert_array_equal(bi, [0, 3])
    np.testing.assert_array_equal(ri, [700, 10])
    np.testing.assert_array_equal(s, np.float32([0.9, 0.5]))


@pytest.mark.parametrize("shape", [(0, 10), (4, 0)])
def test_cut_of_an_empty_block(shape):
    bi, ri, s = cut_at(np.zeros(shape, np.float32), 0.0)
    assert len(bi) == len(ri) == len(s) == 0

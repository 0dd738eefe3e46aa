"""``benchmarks/common/ab.py``: the alternating order of same-process A/B benchmarks."""

import pytest

from benchmarks.common.ab import abba


def test_abba_alternates_in_pairs_and_runs_each_kind_equally():
    assert abba(("a", "b"), 1) == ["a", "b"]
    assert abba(("a", "b"), 3) == ["a", "b", "b", "a", "a", "b"]
    order = abba(("a", "b"), 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"] and order.count("a") == order.count("b") == 4


def test_abba_refuses_other_than_two_kinds_or_no_runs():
    with pytest.raises(ValueError, match="two kinds"):
        abba(("a", "b", "c"), 2)
    with pytest.raises(ValueError, match="repeats >= 1"):
        abba(("a", "b"), 0)

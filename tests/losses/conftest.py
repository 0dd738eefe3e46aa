"""Fixtures of the loss tests: a toy loss registered for one test only (never at import time)."""

import pytest

from ce_retrieval.losses import RetrievalLoss, mean_over_positives, register
from ce_retrieval.losses.registry import unregister


@pytest.fixture
def toy_loss():
    """A registered toy loss class (minus the mean positive score), unregistered again after the test."""

    class ToyMeanPositiveScore(RetrievalLoss):
        """Toy loss for registry tests: minus the mean positive score, with one hyper-parameter."""

        def __init__(self, weight: float = 1.0, **kwargs):
            super().__init__(**kwargs)
            self.weight = float(weight)

        def compute(self, relevance, scores):
            return -self.weight * mean_over_positives(scores, relevance)

    register(ToyMeanPositiveScore)
    yield ToyMeanPositiveScore
    unregister(ToyMeanPositiveScore)

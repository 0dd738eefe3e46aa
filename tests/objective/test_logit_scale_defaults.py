"""λ's default (the paper's 20) and a learned λ's cap (CLIP's 100) are written once: every entry that takes λ
(the config, the model, the objective, the softmax losses and kernels) defaults to the same constants."""

import inspect

import pytest

from ce_retrieval import losses
from ce_retrieval.losses.kernels import sharded, softmax, tiled
from ce_retrieval.modeling.config import ModelConfig
from ce_retrieval.modeling.two_tower import TwoTowerModel
from ce_retrieval.objective import LogitScale, RetrievalObjective
from ce_retrieval.objective.logit_scale import DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE


def _default(callable_, name):
    return inspect.signature(callable_).parameters[name].default


def test_the_objective_side_reads_the_constants():
    assert DEFAULT_LOGIT_SCALE == softmax.DEFAULT_LOGIT_SCALE == 20.0
    config = ModelConfig()
    assert (config.logit_scale, config.max_logit_scale) == (DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE)
    for entry in (TwoTowerModel.__init__, RetrievalObjective.__init__):
        assert _default(entry, "logit_scale") == DEFAULT_LOGIT_SCALE
        assert _default(entry, "max_logit_scale") == DEFAULT_MAX_LOGIT_SCALE
    scale = LogitScale()
    assert (scale.initial, scale.maximum) == (DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE)


@pytest.mark.parametrize(
    "name", [n for n in losses.available() if issubclass(losses.lookup(n), losses.SoftmaxFamilyLoss)]
)
def test_the_softmax_family_defaults_to_the_same_scale(name):
    assert _default(losses.lookup(name), "scale") == DEFAULT_LOGIT_SCALE
    for kernel in (softmax.softmax_loss, tiled.tiled_softmax_loss, sharded.sharded_softmax_loss):
        assert _default(kernel, "scale") == DEFAULT_LOGIT_SCALE

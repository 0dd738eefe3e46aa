"""``ce-retrieval demo --baseline``: each baseline optionally at its own λ ("SampledSoftmax@10"), the configured
loss left out, bad entries named; the baseline's config differs from the configured one only in the loss and λ."""

import pytest

from ce_retrieval import configs
from ce_retrieval.cli import demo
from ce_retrieval.cli.train import resolve_config


def test_baselines_with_and_without_their_own_scale():
    assert demo.parse_baselines("SampledSoftmax@10,SigmoidLoss", "CrossExampleSoftmax") == [
        ("SampledSoftmax", 10.0),
        ("SigmoidLoss", None),
    ]
    assert demo.parse_baselines(" CrossExampleSoftmax@5 , SampledSoftmax ,", "CrossExampleSoftmax") == [
        ("SampledSoftmax", None)
    ]
    assert demo.parse_baselines("none", "CrossExampleSoftmax") == []
    assert demo.parse_baselines("SampledSoftmax@10,SampledSoftmax@20", "X") == [("SampledSoftmax", 10.0)]


@pytest.mark.parametrize(
    ("spec", "named"),
    [("SampledSoftmax@ten", "must be a number"), ("SampledSoftmax@0", "positive"), ("@10", "no loss")],
)
def test_a_bad_entry_is_named(spec, named):
    with pytest.raises(ValueError, match=named):
        demo.parse_baselines(spec, "CrossExampleSoftmax")


def test_the_baseline_differs_only_in_its_loss_and_scale():
    cfg = configs.load_experiment(resolve_config("synthetic_demo"))
    base = demo.baseline_config(cfg, "SampledSoftmax", 10.0)
    assert base.loss.name == "SampledSoftmax" and base.model.logit_scale == 10.0
    assert base.train == cfg.train and base.data == cfg.data and base.model.text == cfg.model.text
    assert demo.baseline_config(cfg, "SampledSoftmax").model.logit_scale == cfg.model.logit_scale
    siglip = demo.baseline_config(cfg, "SigmoidLoss")
    assert siglip.model.learn_logit_scale and siglip.model.logit_bias == -10.0
    # the shipped default: Sampled Softmax at the λ chosen for it on the validation split, SigLIP learning its own
    assert demo.parse_baselines(demo.DEFAULT_BASELINES, cfg.loss.name) == [
        ("SampledSoftmax", 10.0),
        ("SigmoidLoss", None),
    ]

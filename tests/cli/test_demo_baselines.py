"""``ce-retrieval demo --baseline``: each baseline optionally at its own λ ("SampledSoftmax@10"), the configured
loss left out, bad entries named; the baseline's config differs from the configured one only in the loss and λ."""

import json

import pytest

from benchmarks import ROOT
from ce_retrieval import configs
from ce_retrieval.cli import demo
from ce_retrieval.cli.train import resolve_config


def test_baselines_with_and_without_their_own_scale():
    assert demo.parse_baselines("SampledSoftmax@10,SigmoidLoss", "CrossExampleSoftmax") == [
        ("SampledSoftmax", 10.0, None),
        ("SigmoidLoss", None, None),
    ]
    assert demo.parse_baselines(" CrossExampleSoftmax@5 , SampledSoftmax ,", "CrossExampleSoftmax") == [
        ("SampledSoftmax", None, None)
    ]
    assert demo.parse_baselines("none", "CrossExampleSoftmax") == []
    assert demo.parse_baselines("SampledSoftmax@10,SampledSoftmax@20", "X") == [("SampledSoftmax", 10.0, None)]
    assert demo.parse_baselines("SigmoidLoss@b=-5, SigmoidLoss", "X") == [("SigmoidLoss", None, -5.0)]
    assert demo.parse_baselines("SigmoidLoss@5/b=-2.5", "X") == [("SigmoidLoss", 5.0, -2.5)]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("SampledSoftmax@ten", "must be a number"),
        ("SampledSoftmax@0", "positive"),
        ("@10", "no loss"),
        ("SampledSoftmax@b=-5", "no logit bias"),
        ("SigmoidLoss@b=inf", "finite"),
        ("SigmoidLoss@t=3", "neither"),
    ],
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
    started = demo.baseline_config(cfg, "SigmoidLoss", None, -5.0)
    assert started.model.learn_logit_bias and started.model.logit_bias == -5.0 and started.model.logit_scale == 10.0
    # the shipped default: Sampled Softmax and symmetric InfoNCE at the λ chosen for each on the validation split,
    # SigLIP learning its t and b from the initial b chosen the same way (benchmarks/results/demo_scale_warmup_goal.md)
    assert demo.parse_baselines(demo.DEFAULT_BASELINES, cfg.loss.name) == [
        ("SampledSoftmax", 20.0, None),
        ("SigmoidLoss", None, -5.0),
        ("SymmetricInfoNCE", 5.0, None),
    ]


def test_the_default_is_the_recorded_choice_within_the_spread_goal():
    """The configured objective's λ and every default baseline's λ (SigLIP: initial b) are the ones the validation
    sweep's record chose within the spread goal, so the config, the CLI and the record cannot drift apart."""
    record = ROOT / "benchmarks" / "results" / "demo_scale_warmup_goal.json"
    choice = {loss: c["chosen_within_goal"] for loss, c in json.loads(record.read_text())["choice"].items()}
    cfg = configs.load_experiment(resolve_config("synthetic_demo"))
    shipped = {cfg.loss.name: cfg.model.logit_scale}
    shipped |= {
        name: scale if bias is None else bias
        for name, scale, bias in demo.parse_baselines(demo.DEFAULT_BASELINES, cfg.loss.name)
    }
    assert shipped == choice
    assert cfg.train.optimizer.image_warmup_steps == 50  # the sweep's setting

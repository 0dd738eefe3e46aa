"""The retrieval objective as a Keras 3 layer (``ce_retrieval.keras.RetrievalObjectiveLayer``), in a fresh plain
Keras 3 process (keras3_objective.py): the same value as the objective's dense path, trains, learns λ (and
SigLIP's b), serialises."""

import json

import pytest
from test_keras3_process import HERE, run_keras3

pytestmark = pytest.mark.slow


def test_objective_layer_trains_a_keras3_two_tower_model():
    report = json.loads(run_keras3([str(HERE / "keras3_objective.py")]).stdout.strip().splitlines()[-1])
    assert report["layer_loss"] == pytest.approx(report["dense_loss"], rel=1e-5)  # tiled (T = 3) == dense
    assert report["history"][-1] < 0.8 * report["history"][0], report["history"]
    assert report["logit_scale"] != pytest.approx(10.0, abs=1e-3)  # λ is a trained weight of the layer
    assert any("log_logit_scale" in path for path in report["weights"])
    assert report["config_round_trip"]
    # SigLIP: learned t and b are the layer's weights; sharded + tiled (T = 3) == the dense objective
    assert report["siglip_layer_loss"] == pytest.approx(report["siglip_dense_loss"], rel=1e-5)
    assert report["siglip_bias"] != pytest.approx(-10.0, abs=1e-3)
    assert any("logit_bias" in path for path in report["siglip_weights"])
    assert report["siglip_round_trip"]

"""SigLIP's t and b and the cosine regularisers (TCM) are the objective's: the dense value is the float64
reference on ``t·cos + b`` (plus ``w·TCM(cos)``), the gradients of the learned t' and b are the closed form, every
path (tiled, sharded, sharded + tiled) gives the dense value and gradients, and a regulariser on a path it does
not have is refused with the alternatives named. Multi-replica checks: objective_replicas.py."""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "losses"))  # the float64 references
import reference as ref  # noqa: E402
from objective_fixtures import IDS, close, embeddings, value_and_grads  # noqa: E402

from ce_retrieval import losses  # noqa: E402
from ce_retrieval.configs.experiment import LossConfig  # noqa: E402
from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.modeling.config import ModelConfig  # noqa: E402
from ce_retrieval.objective import LogitBias, LogitScale, RetrievalObjective  # noqa: E402
from ce_retrieval.tasks import build_loss  # noqa: E402

PATHS = [("replicated", 3), ("sharded", 0), ("sharded", 3), ("replicated", 1)]


def siglip(learn: bool):
    """(loss, λ, b) as the task builds them: learned t and b leave the loss t = 1, b = 0."""
    model = ModelConfig(logit_scale=10.0, learn_logit_scale=learn, logit_bias=-10.0, learn_logit_bias=learn)
    return build_loss(LossConfig("SigmoidLoss"), model), LogitScale(10.0, learn=learn), LogitBias(-10.0, learn=learn)


def test_dense_siglip_is_the_reference_on_t_cos_plus_b_and_learns_t_and_b():
    loss, scale, bias = siglip(learn=True)
    scale.variable.assign(np.log(12.0))
    bias.variable.assign(-7.5)
    objective = RetrievalObjective(loss, scale, logit_bias=bias)
    assert [id(v) for v in objective.trainable_variables] == [id(scale.variable), id(bias.variable)]
    text, image = embeddings()
    value, grads = value_and_grads(objective, text, image, objective.trainable_variables)
    cosine = (text.numpy() @ image.numpy().T).astype(np.float64)
    relevance = relevance_from_ids(IDS, IDS).numpy()
    close(value, ref.sigmoid(relevance, cosine, 12.0, -7.5))
    # closed form: dL/dl = -z σ(-z l) / N; dL/db = Σ dL/dl, dL/dt' = t Σ dL/dl · cos
    z = np.where(relevance > 0, 1.0, -1.0)
    d_logits = -z / (1.0 + np.exp(z * (12.0 * cosine - 7.5))) / cosine.shape[0]
    close(grads[3], d_logits.sum(), rtol=1e-4)
    close(grads[2], 12.0 * (d_logits * cosine).sum(), rtol=1e-4)


@pytest.mark.parametrize("partition, tile", PATHS)
@pytest.mark.parametrize("learn", [False, True])
def test_every_siglip_path_equals_the_dense_path(partition, tile, learn):
    """T = 3 does not divide 8; T = 1 is one document per tile. Gradients of the embeddings and of t', b."""
    loss, scale, bias = siglip(learn)
    dense = RetrievalObjective(loss, scale, logit_bias=bias)
    other = RetrievalObjective(loss, scale, logit_bias=bias, partition=partition, tile_size=tile)
    text, image = embeddings(2)
    want, want_grads = value_and_grads(dense, text, image, dense.trainable_variables)
    got, got_grads = value_and_grads(other, text, image, other.trainable_variables)
    close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        close(g, w, rtol=1e-4)


def test_tiled_siglip_traces_under_xla_and_keeps_half_precision_gradients():
    loss, scale, bias = siglip(learn=True)
    dense = RetrievalObjective(loss, scale, logit_bias=bias)
    tiled = RetrievalObjective(loss, scale, logit_bias=bias, partition="sharded", tile_size=3)
    text, image = embeddings(3)
    step = tf.function(lambda t, v: value_and_grads(tiled, t, v, tiled.trainable_variables), jit_compile=True)
    got, got_grads = step(text, image)
    want, want_grads = value_and_grads(dense, text, image, dense.trainable_variables)
    close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        close(g, w, rtol=1e-4)
    half = [tf.cast(x, tf.bfloat16) for x in (text, image)]
    _, half_grads = value_and_grads(tiled, *half, [])
    assert [g.dtype for g in half_grads] == [tf.bfloat16, tf.bfloat16]


def test_regularisers_are_added_on_cosines_before_t_and_b():
    loss, scale, bias = siglip(learn=True)
    tcm = losses.ThresholdConsistentMargin()
    objective = RetrievalObjective(loss, scale, logit_bias=bias, regularizers=[(0.7, tcm)])
    text, image = embeddings(4)
    cosine = (text.numpy() @ image.numpy().T).astype(np.float64)
    relevance = relevance_from_ids(IDS, IDS).numpy()
    want_tcm = ref.threshold_consistent_margin(relevance, cosine)
    assert want_tcm > 0.05
    close(objective(text, image, IDS).loss, ref.sigmoid(relevance, cosine, 10.0, -10.0) + 0.7 * want_tcm)


def test_a_regulariser_without_the_path_is_refused_with_the_alternatives():
    loss = losses.CrossExampleSoftmax(scale=20.0)
    regularizers = [(1.0, losses.ThresholdConsistentMargin())]
    with pytest.raises(ValueError, match=r"ThresholdConsistentMargin .* use loss_partition='replicated'"):
        RetrievalObjective(loss, partition="sharded", regularizers=regularizers)
    with pytest.raises(ValueError, match=r"ThresholdConsistentMargin .* no tiled path; use loss_tile_size=0"):
        RetrievalObjective(loss, tile_size=512, regularizers=regularizers)
    assert RetrievalObjective(loss, tile_size="auto", regularizers=regularizers).tile_for(65536) == 0  # dense
    assert RetrievalObjective(loss, tile_size="auto").tile_for(65536) > 0
    with pytest.raises(TypeError, match="weight >= 0"):
        RetrievalObjective(loss, regularizers=[(-1.0, losses.ThresholdConsistentMargin())])


def test_the_objective_refuses_a_bias_that_does_not_fit():
    with pytest.raises(ValueError, match="the model has none: give the model logit_bias"):
        RetrievalObjective(losses.SigmoidLoss(scale=20.0), logit_scale=20.0)
    with pytest.raises(ValueError, match="logit bias mismatch"):
        RetrievalObjective(losses.SigmoidLoss(scale=10.0, bias=-5.0), logit_scale=10.0, logit_bias=-10.0)
    with pytest.raises(ValueError, match="only for a loss that declares one"):
        RetrievalObjective(losses.SampledSoftmax(scale=10.0), logit_scale=10.0, logit_bias=-10.0)
    with pytest.raises(ValueError, match="learn_logit_bias=True needs logit_bias"):
        RetrievalObjective(losses.SampledSoftmax(scale=10.0), logit_scale=10.0, learn_logit_bias=True)

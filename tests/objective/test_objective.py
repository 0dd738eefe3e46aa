"""The retrieval objective (``ce_retrieval.objective``) on one device: the dense path equals the model's former
dense path for every registered loss (values and gradients), every other path equals the dense one, and
impossible combinations are refused with the alternatives named. Multi-replica checks: test_objective_replicas.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval import losses
from ce_retrieval.configs.experiment import LossConfig
from ce_retrieval.losses import relevance_from_ids
from ce_retrieval.modeling.config import ModelConfig
from ce_retrieval.objective import LogitScale, RetrievalObjective
from ce_retrieval.objective.batch_metrics import has_positive, recall_at_1_dense, recall_at_1_tiled
from ce_retrieval.tasks import build_loss

IDS = tf.constant([0, 0, 1, 2, 3, 4, 5, 5], tf.int64)  # two captions of images 0 and 5: several positives per row
# the softmax losses with every path (MixedSoftmax is dense only: its refusals are in tests/losses)
SOFTMAX_FAMILY = [
    n
    for n in losses.available()
    if issubclass(losses.lookup(n), losses.SoftmaxFamilyLoss)
    and losses.lookup(n).supports_tiled
    and losses.lookup(n).supports_sharded
]


def embeddings(seed=0, n=8, d=6):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    return tf.constant(unit(rng.normal(size=(n, d))), tf.float32), tf.constant(
        unit(rng.normal(size=(n, d))), tf.float32
    )


def former_dense_path(loss, text, image, ids, scale=None):
    """The two-tower model's loss before the objective existed (one replica): S, relevance, joint Gram, λ."""
    cosine = tf.matmul(text, image, transpose_b=True)
    relevance = relevance_from_ids(ids, ids)
    if loss.needs_gram:
        joint, joint_ids = tf.concat([text, image], 0), tf.concat([ids, ids], 0)
        relevance = relevance_from_ids(joint_ids, joint_ids, exclude_self=True)
        cosine = tf.matmul(joint, joint, transpose_b=True)
    if scale is not None:
        cosine = cosine * scale
    return loss.call(relevance, cosine)


def value_and_grads(fn, text, image, extra=()):
    with tf.GradientTape() as tape:
        tape.watch([text, image])
        value = fn(text, image)
    return value, tape.gradient(value, [text, image, *extra])


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", losses.available())
def test_dense_objective_is_the_former_dense_path_for_every_loss(name):
    bias = -10.0 if losses.lookup(name).has_logit_bias else None  # SigLIP's b: the objective's, like λ
    loss = build_loss(LossConfig(name=name), ModelConfig(logit_scale=20.0, logit_bias=bias))
    objective = RetrievalObjective(loss, logit_scale=20.0, logit_bias=bias)
    text, image = embeddings()
    got, got_grads = value_and_grads(lambda t, v: objective(t, v, IDS).share, text, image)
    want, want_grads = value_and_grads(lambda t, v: former_dense_path(loss, t, v, IDS), text, image)
    assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        if w is None:
            assert g is None
        else:
            assert_close(g, w)


def test_learned_lambda_is_the_objectives_variable():
    loss = losses.CrossExampleSoftmax(scale=1.0)
    objective = RetrievalObjective(loss, logit_scale=10.0, learn_logit_scale=True)
    (variable,) = objective.trainable_variables
    assert variable.name.startswith("log_logit_scale")
    text, image = embeddings(1)
    got, got_grads = value_and_grads(lambda t, v: objective(t, v, IDS).share, text, image, [variable])
    want, want_grads = value_and_grads(
        lambda t, v: former_dense_path(loss, t, v, IDS, tf.minimum(tf.exp(variable), 100.0)), text, image, [variable]
    )
    assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert_close(g, w)
    assert abs(float(want_grads[2])) > 1e-4  # λ really is learned


PATHS = [("replicated", 3), ("sharded", 0), ("sharded", 3), ("replicated", "auto")]


@pytest.mark.parametrize("partition, tile", PATHS)
@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("learn", [False, True])
def test_every_path_equals_the_dense_path(name, partition, tile, bidirectional, learn):
    """One device: tiled (T = 3 does not divide 8), sharded and sharded + tiled give the dense value and gradients
    (embeddings and learned λ)."""
    loss = build_loss(
        LossConfig(name=name, kwargs={"bidirectional": bidirectional}), ModelConfig(learn_logit_scale=learn)
    )
    scale = LogitScale(20.0, learn=learn)
    dense = RetrievalObjective(loss, scale)
    other = RetrievalObjective(loss, scale, partition=partition, tile_size=tile)
    text, image = embeddings(2)
    extra = scale.trainable_variables
    want, want_grads = value_and_grads(lambda t, v: dense(t, v, IDS).share, text, image, extra)
    got, got_grads = value_and_grads(lambda t, v: other(t, v, IDS).share, text, image, extra)
    assert_close(got, want, rtol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert_close(g, w, rtol=1e-4, atol=1e-6)
    result, reference = other(text, image, IDS), dense(text, image, IDS)
    assert_close(result.recall_at_1, reference.recall_at_1)
    assert bool(result.has_positive)


@pytest.mark.slow
@pytest.mark.parametrize("partition", ["replicated", "sharded"])
def test_tiled_path_traces_under_xla(partition):
    loss = losses.CrossExampleNegativeMining(scale=20.0)
    dense, tiled = RetrievalObjective(loss), RetrievalObjective(loss, partition=partition, tile_size=3)
    text, image = embeddings(3)

    @tf.function(jit_compile=True)
    def step(t, v):
        return value_and_grads(lambda a, b: tiled(a, b, IDS).share, t, v)

    got, got_grads = step(text, image)
    want, want_grads = value_and_grads(lambda a, b: dense(a, b, IDS).share, text, image)
    assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_auto_tiles_only_above_the_threshold():
    objective = RetrievalObjective(losses.CrossExampleSoftmax(), tile_size="auto")
    assert objective.tile_for(64) == 0 and objective.tile_for(8192) == 0
    assert objective.tile_for(65536) == 512
    assert RetrievalObjective(losses.NPairLoss(scale=20.0), tile_size="auto").tile_for(65536) == 0  # no tiled path


def test_path_names_what_a_call_takes():
    objective = RetrievalObjective(losses.CrossExampleSoftmax(), tile_size="auto")
    assert objective.last_path is None
    assert objective.path(65536).name == "tiled" and str(objective.path(65536)) == "replicated, tiled (T = 512)"
    assert str(objective.path(64)) == "replicated, dense"
    text, image = embeddings()
    objective(text, image, IDS)
    assert objective.last_path == ("replicated", 0, 8) and objective.last_path.name == "dense"
    sharded = RetrievalObjective(losses.CrossExampleSoftmax(), partition="sharded", tile_size=3)
    sharded(text, image, IDS)
    assert sharded.last_path.name == "sharded + tiled" and sharded.last_path.tile == 3


def test_impossible_combinations_name_the_alternatives():
    with pytest.raises(ValueError, match=r"loss_tile_size=64 needs a loss with a tiled path; TripletLoss has none"):
        RetrievalObjective(losses.TripletLoss(), tile_size=64)
    with pytest.raises(ValueError, match=r"AngularLoss cannot \(losses that can: .*SampledSoftmax.*replicated"):
        RetrievalObjective(losses.AngularLoss(), partition="sharded")
    with pytest.raises(ValueError, match="loss_tile_size must be 0"):
        RetrievalObjective(losses.CrossExampleSoftmax(), tile_size=-1)
    with pytest.raises(ValueError, match="loss_partition must be one of"):
        RetrievalObjective(losses.CrossExampleSoftmax(), partition="local")
    with pytest.raises(ValueError, match="logit scale mismatch"):
        RetrievalObjective(losses.CrossExampleSoftmax(scale=10.0), logit_scale=20.0)
    with pytest.raises(ValueError, match="TripletLoss has none"):
        RetrievalObjective(losses.TripletLoss(), learn_logit_scale=True)


def test_batch_metrics_tiled_equal_dense():
    rng = np.random.default_rng(4)
    queries = tf.constant(np.round(rng.normal(size=(9, 4)) * 2) / 2, tf.float32)  # ties: the first maximum wins
    docs = tf.constant(np.round(rng.normal(size=(7, 4)) * 2) / 2, tf.float32)
    q_ids = tf.constant([0, 1, 2, 3, 4, 5, 6, 0, 9], tf.int64)
    d_ids = tf.constant([0, 1, 2, 3, 4, 5, 6], tf.int64)
    relevance = relevance_from_ids(q_ids, d_ids)
    want = recall_at_1_dense(tf.matmul(queries, docs, transpose_b=True), relevance)
    for tile in (1, 3, 7, 16):
        assert_close(recall_at_1_tiled(queries, docs, q_ids, d_ids, tile), want)
    assert bool(has_positive(q_ids, d_ids))
    assert not bool(has_positive(tf.constant([7, 8], tf.int64), d_ids))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("partition, tile", PATHS)
def test_half_precision_embeddings_on_every_path(dtype, partition, tile):
    """Mixed precision: half-precision embeddings are computed in float32 on every path (the dense path's value and
    gradients); gradients come back in the embeddings' dtype."""
    loss = losses.CrossExampleNegativeMining(scale=20.0, bidirectional=True)
    dense, other = RetrievalObjective(loss), RetrievalObjective(loss, partition=partition, tile_size=tile)
    text, image = (tf.cast(x, dtype) for x in embeddings(5))
    want, want_grads = value_and_grads(lambda t, v: dense(t, v, IDS).share, text, image)
    got, got_grads = value_and_grads(lambda t, v: other(t, v, IDS).share, text, image)
    assert got.dtype == tf.float32
    assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == dtype
        assert_close(tf.cast(g, tf.float32), tf.cast(w, tf.float32), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("learn", [False, True])
@pytest.mark.parametrize("partition, tile", [("replicated", 0), ("replicated", 3), ("sharded", 0), ("sharded", 3)])
def test_lambda_and_b_reach_the_loss_one_way(partition, tile, learn):
    """On every path the objective gives the loss the cosines (or the embeddings) as they are and λ and b as
    ``logit_scale=`` / ``logit_bias=``: the number λ₀ when fixed, the tensor when learned; it never scales S itself."""
    seen = []

    class Spy(losses.SigmoidLoss):
        def call(self, y_true, y_pred, **given):
            seen.append(("call", y_pred, given))
            return super().call(y_true, y_pred, **given)

        def sharded_share(self, relevance, scores, **given):
            seen.append(("sharded_share", scores, given))
            return super().sharded_share(relevance, scores, **given)

        def tiled_loss(self, queries, docs, *args, **given):
            seen.append(("tiled_loss", queries, {k: v for k, v in given.items() if k.startswith("logit_")}))
            return super().tiled_loss(queries, docs, *args, **given)

    text, image = embeddings()
    scale = LogitScale(10.0, learn=learn)
    objective = RetrievalObjective(
        Spy(scale=10.0, bias=-10.0),
        scale,
        partition=partition,
        tile_size=tile,
        logit_bias=-10.0,
        learn_logit_bias=learn,
    )
    objective(text, image, IDS)
    want = "tiled_loss" if tile else ("sharded_share" if partition == "sharded" else "call")
    assert [name for name, _, _ in seen] == [want]
    _, given_input, given = seen[0]
    assert set(given) == {"logit_scale", "logit_bias"}
    if learn:
        assert all(tf.is_tensor(v) for v in given.values())
        np.testing.assert_allclose([float(given["logit_scale"]), float(given["logit_bias"])], [10.0, -10.0], rtol=1e-6)
    else:
        assert given == {"logit_scale": 10.0, "logit_bias": -10.0}
    expected = text if tile else tf.matmul(text, image, transpose_b=True)  # unscaled: the loss applies λ and b
    np.testing.assert_allclose(given_input.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)

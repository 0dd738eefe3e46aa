"""The tiled softmax family (``ce_retrieval/losses/kernels/tiled.py``, issue #12) equals the dense path and a NumPy
reference.

Dense path: ``kernels.softmax.softmax_loss`` on ``S = Q Dᵀ`` with ``R`` from the ids. Reference: float64 NumPy, top-k by
a sort. Integer-valued embeddings with a power-of-two scale make every logit exact in both paths, so the cases
have many exact ties at the mining threshold.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from ce_retrieval import losses
from ce_retrieval.losses import functional
from ce_retrieval.losses.kernels.softmax import softmax_loss
from ce_retrieval.losses.kernels.tiled import default_tile_size, tiled_softmax_loss
from ce_retrieval.losses.relevance import relevance_from_ids

MINING = {"all": {}, "fraction": {"negative_fraction": 0.3}, "top_k": {"top_k": 4}}


def reference(q, d, qid, did, scale, cross_example, negative_fraction=None, top_k=None, ignore=False):
    """float64 NumPy: the loss of Veit & Wilber (2020) eqs. 2, 3, 5, 6 by explicit sets and sorts."""
    logits = scale * (q.astype(np.float64) @ d.astype(np.float64).T)
    positive = qid[:, None] == did[None, :]
    negative = ~positive
    if ignore:
        kept = (qid[:, None] >= 0) & (did[None, :] >= 0)
        positive, negative = positive & kept, negative & kept

    def log_z(values):
        if values.size == 0:
            return -np.inf
        values = np.sort(values)[::-1]
        if negative_fraction is not None:
            values = values[: int(np.ceil(negative_fraction * values.size))]
        elif top_k is not None:
            values = values[:top_k]
        peak = values.max()
        return peak + np.log(np.exp(values - peak).sum())

    if cross_example:
        rows = np.full(len(q), log_z(logits[negative]))
    else:
        rows = np.array([log_z(logits[i][negative[i]]) for i in range(len(q))])
    terms = [np.logaddexp(0.0, rows[i] - logits[i, j]) for i, j in zip(*np.nonzero(positive), strict=True)]
    return float(np.mean(terms)) if terms else 0.0


def make_case(n, m, dim=4, num_ids=None, seed=0, integer=True):
    """Embeddings in {-1, 0, 1} (exact logits, many ties) or normal; ids from a small range (duplicates)."""
    rng = np.random.default_rng(seed)
    if integer:
        q, d = (rng.integers(-1, 2, size=(rows, dim)).astype(np.float32) for rows in (n, m))
    else:
        q, d = (rng.normal(size=(rows, dim)).astype(np.float32) for rows in (n, m))
    num_ids = num_ids or max(n, m) // 2
    return q, d, rng.integers(0, num_ids, n), rng.integers(0, num_ids, m)


def dense(q, d, qid, did, scale, cross_example, ignore=False, **mining):
    relevance = relevance_from_ids(qid, did)
    if ignore:
        relevance = tf.where((qid[:, None] < 0) | (did[None, :] < 0), -1.0, relevance)
    return softmax_loss(relevance, tf.matmul(q, d, transpose_b=True), scale, cross_example, **mining)


def value_and_grads(fn, q, d):
    q, d = tf.constant(q), tf.constant(d)
    with tf.GradientTape() as tape:
        tape.watch([q, d])
        value = fn(q, d)
    return value, tape.gradient(value, [q, d])


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("cross_example", [False, True], ids=["sampled", "cross_example"])
@pytest.mark.parametrize("mining", sorted(MINING))
@pytest.mark.parametrize(
    "n,m,tile",
    [(24, 24, 5), (17, 29, 8), (29, 13, 64), (20, 31, 1)],
    ids=["square_uneven_tile", "n_lt_m", "tile_larger_than_m", "tile_1"],
)
def test_equals_dense_path_and_reference(cross_example, mining, n, m, tile):
    """Values and both gradients, with ties, multi-positive rows and duplicate ids on both sides."""
    q, d, qid, did = make_case(n, m, seed=n + m)
    kwargs = MINING[mining]
    scale = 0.5
    tiled_value, tiled_grads = value_and_grads(
        lambda a, b: tiled_softmax_loss(a, b, qid, did, scale, cross_example, tile_size=tile, **kwargs), q, d
    )
    dense_value, dense_grads = value_and_grads(lambda a, b: dense(a, b, qid, did, scale, cross_example, **kwargs), q, d)
    assert_close(tiled_value, dense_value)
    assert_close(tiled_value, reference(q, d, qid, did, scale, cross_example, **kwargs))
    for got, want in zip(tiled_grads, dense_grads, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("cross_example", [False, True], ids=["sampled", "cross_example"])
@pytest.mark.parametrize("mining", ["all", "fraction"])
def test_ignored_ids(cross_example, mining):
    """``ignore_negative_ids``: a negative id on either side removes the pair (padding rows and columns)."""
    q, d, qid, did = make_case(19, 23, seed=3)
    qid[[0, 5, 6]] = -1
    did[[2, 3, 22]] = -1
    kwargs = MINING[mining]
    fn = lambda a, b: tiled_softmax_loss(
        a, b, qid, did, 0.5, cross_example, tile_size=6, ignore_negative_ids=True, **kwargs
    )  # noqa: E731,E501
    tiled_value, tiled_grads = value_and_grads(fn, q, d)
    dense_value, dense_grads = value_and_grads(
        lambda a, b: dense(a, b, qid, did, 0.5, cross_example, ignore=True, **kwargs), q, d
    )
    assert_close(tiled_value, dense_value)
    assert_close(tiled_value, reference(q, d, qid, did, 0.5, cross_example, ignore=True, **kwargs))
    for got, want in zip(tiled_grads, dense_grads, strict=True):
        assert_close(got, want)
    assert float(tf.reduce_max(tf.abs(tiled_grads[0][0]))) == 0.0  # an ignored query gets no gradient


@pytest.mark.parametrize("cross_example", [False, True], ids=["sampled", "cross_example"])
def test_real_valued_embeddings_and_two_captions_per_image(cross_example):
    """Normal embeddings, cosine logits at λ = 20; two captions per image (each image is a positive of 2 rows)."""
    rng = np.random.default_rng(7)
    images = rng.normal(size=(33, 16)).astype(np.float32)
    captions = np.repeat(images, 2, axis=0) + 0.5 * rng.normal(size=(66, 16)).astype(np.float32)
    images, captions = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (images, captions))
    qid, did = np.repeat(np.arange(33), 2), np.arange(33)
    for kwargs in MINING.values():
        got_value, got_grads = value_and_grads(
            lambda a, b, kw=kwargs: tiled_softmax_loss(a, b, qid, did, 20.0, cross_example, tile_size=10, **kw),
            captions,
            images,
        )
        want_value, want_grads = value_and_grads(
            lambda a, b, kw=kwargs: dense(a, b, qid, did, 20.0, cross_example, **kw), captions, images
        )
        assert_close(got_value, want_value)
        assert_close(got_value, reference(captions, images, qid, did, 20.0, cross_example, **kwargs))
        for got, want in zip(got_grads, want_grads, strict=True):
            assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_edge_cases_without_negatives_or_positives():
    q, d, _, _ = make_case(6, 5, seed=1)
    same = np.zeros(6, np.int64), np.zeros(5, np.int64)  # every pair positive: Z = 0, loss 0
    for cross_example in (False, True):
        value, grads = value_and_grads(
            lambda a, b, ce=cross_example: tiled_softmax_loss(a, b, *same, 0.5, ce, tile_size=2), q, d
        )
        assert float(value) == 0.0 and all(float(tf.reduce_max(tf.abs(g))) == 0.0 for g in grads)
    # no positive pair at all: 0 (the dense classes refuse such a batch; the function returns the empty mean)
    value = tiled_softmax_loss(q, d, np.arange(6), np.arange(10, 15), 0.5, tile_size=2)
    assert float(value) == 0.0


def test_gradient_check():
    """Central differences of the value (one traced function, float32, loose tolerance) against the gradient."""
    q, d, qid, did = make_case(4, 5, dim=2, seed=2, integer=False)
    delta = 1e-2
    for cross_example in (False, True):
        loss = tf.function(lambda a, b, ce=cross_example: tiled_softmax_loss(a, b, qid, did, 2.0, ce, tile_size=3))
        _, grads = value_and_grads(loss, q, d)
        for which, (x, grad) in enumerate(zip((q, d), grads, strict=True)):
            numerical = np.zeros_like(x)
            for index in np.ndindex(x.shape):
                step = np.zeros_like(x)
                step[index] = delta
                args = [q, d]
                args[which] = x + step
                up = float(loss(*args))
                args[which] = x - step
                numerical[index] = (up - float(loss(*args))) / (2 * delta)
            np.testing.assert_allclose(grad.numpy(), numerical, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize(
    "cross_example,mining", [(True, "all"), (False, "fraction"), (True, "top_k")], ids=["ces", "snm", "cenm"]
)
def test_traces_under_xla(cross_example, mining):
    """Per-row and batch-wide selection, and the plain path, compiled with ``jit_compile=True``."""
    q, d, qid, did = make_case(21, 26, seed=4)
    kwargs = MINING[mining]

    @tf.function(jit_compile=True)
    def step(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            value = tiled_softmax_loss(a, b, qid, did, 0.5, cross_example, tile_size=8, **kwargs)
        return value, tape.gradient(value, [a, b])

    got_value, got_grads = step(tf.constant(q), tf.constant(d))
    want_value, want_grads = value_and_grads(lambda a, b: dense(a, b, qid, did, 0.5, cross_example, **kwargs), q, d)
    assert_close(got_value, want_value)
    for got, want in zip(got_grads, want_grads, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_embeddings_are_computed_in_float32(dtype):
    q, d, qid, did = make_case(12, 14, seed=5, integer=False)
    low_q, low_d = tf.cast(q, dtype), tf.cast(d, dtype)
    with tf.GradientTape() as tape:
        tape.watch([low_q, low_d])
        value = tiled_softmax_loss(low_q, low_d, qid, did, 4.0, True, tile_size=5)
    grads = tape.gradient(value, [low_q, low_d])
    assert value.dtype == tf.float32 and all(g.dtype == dtype for g in grads)
    want = dense(tf.cast(low_q, tf.float32), tf.cast(low_d, tf.float32), qid, did, 4.0, True)
    assert_close(value, want)


def test_class_api_from_embeddings():
    """``loss.from_embeddings``: tiled with ``tile_size`` (in ``get_config``), the same as the dense call."""
    q, d, qid, did = make_case(18, 18, seed=6, integer=False)
    relevance = relevance_from_ids(qid, did)
    scores = tf.matmul(q, d, transpose_b=True)
    for cls, kwargs in [
        (losses.SampledSoftmax, {}),
        (losses.StochasticNegativeMining, {"top_k": 3}),
        (losses.CrossExampleSoftmax, {"bidirectional": True}),
        (losses.CrossExampleNegativeMining, {}),
    ]:
        loss = cls(tile_size=4, scale=5.0, **kwargs)
        config = loss.get_config()
        assert config["tile_size"] == 4 and "tile_size" not in cls(**kwargs).get_config()
        clone = cls.from_config(json.loads(json.dumps(config)))
        assert clone.tile_size == 4
        want = cls(scale=5.0, **kwargs)(relevance, scores)
        assert_close(loss.from_embeddings(q, d, qid, did), want)
        assert_close(cls(scale=5.0, **kwargs).from_embeddings(q, d, qid, did), want)  # small: dense path
        assert_close(loss(relevance, scores), want)  # the Keras call on S is unchanged
    assert losses.ArcMarginSoftmax(tile_size=4).get_config()["tile_size"] == 4  # margins have the tiled path too
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        losses.SampledSoftmax(tile_size=0)
    assert functional.tiled_softmax_loss is tiled_softmax_loss


#: Each margin class with NumPy's margined cosine psi(c) of a positive pair (float64, written from the papers).
MARGINS = {
    "l_softmax": (lambda: losses.LargeMarginSoftmax(margin=2), lambda c: ref.psi(c, 2)),
    "a_softmax": (
        lambda: losses.AngularSoftmax(margin=4, lambda_base=5.0, lambda_min=5.0),
        lambda c: ref.sphereface(c, 4, 5.0),
    ),
    "cosface": (lambda: losses.AdditiveMarginSoftmax(margin=0.35), lambda c: c - 0.35),
    "arcface": (lambda: losses.ArcMarginSoftmax(margin=0.5), lambda c: ref.arcface(c, 0.5)),
}


def margin_reference(q, d, qid, did, scale, cross_example, psi, ignore=False):
    """float64 NumPy: softplus(log Z - scale psi(c_ij)) over positive pairs, Z over the row's or batch's negatives."""
    cos = q.astype(np.float64) @ d.astype(np.float64).T
    positive = qid[:, None] == did[None, :]
    kept = (qid[:, None] >= 0) & (did[None, :] >= 0) if ignore else np.ones_like(positive)
    positive, negative = positive & kept, ~positive & kept
    logits = scale * cos

    def log_z(values):
        return -np.inf if values.size == 0 else np.logaddexp.reduce(values)

    rows = (
        np.full(len(q), log_z(logits[negative]))
        if cross_example
        else np.array([log_z(logits[i][negative[i]]) for i in range(len(q))])
    )
    terms = [np.logaddexp(0.0, rows[i] - scale * psi(cos[i, j])) for i, j in zip(*np.nonzero(positive), strict=True)]
    return float(np.mean(terms))


@pytest.mark.parametrize("cross_example", [False, True], ids=["sampled", "cross_example"])
@pytest.mark.parametrize("name", sorted(MARGINS))
def test_margin_softmaxes_equal_dense_path_and_reference(name, cross_example):
    """The margin losses on the tiled path: unit embeddings (cosines), two captions per image, ignored ids, an
    uneven tile; value and both gradients equal the dense path, the value equals NumPy's."""
    make, psi = MARGINS[name]
    rng = np.random.default_rng(11)
    q = rng.normal(size=(22, 6)).astype(np.float32)
    d = rng.normal(size=(13, 6)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    did = np.arange(13)
    qid = np.repeat(np.arange(11), 2)  # two captions per image; images 11 and 12 are distractors
    qid[3], did[7] = -1, -1  # ignored: a padding caption and a padding image
    loss = make()
    loss.scale = 8.0
    loss.cross_example = cross_example
    loss.tile_size = 4
    relevance = tf.where((qid[:, None] < 0) | (did[None, :] < 0), -1.0, relevance_from_ids(qid, did))
    tiled_value, tiled_grads = value_and_grads(
        lambda a, b: loss.from_embeddings(a, b, qid, did, ignore_negative_ids=True), q, d
    )
    dense_value, dense_grads = value_and_grads(lambda a, b: loss(relevance, tf.matmul(a, b, transpose_b=True)), q, d)
    assert_close(tiled_value, dense_value)
    assert_close(tiled_value, margin_reference(q, d, qid, did, 8.0, cross_example, psi, ignore=True), rtol=2e-5)
    for got, want in zip(tiled_grads, dense_grads, strict=True):
        assert_close(got, want, atol=2e-6)


def test_margin_softmax_tiled_under_xla_with_annealed_lambda():
    """A-Softmax's lambda comes from its step variable at call time; compiled with XLA, as the train step runs it."""
    rng = np.random.default_rng(12)
    q, d = (tf.math.l2_normalize(rng.normal(size=(16, 5)).astype(np.float32), axis=1) for _ in range(2))
    ids = np.arange(16)
    loss = losses.AngularSoftmax(cross_example=True, tile_size=6)
    dense_loss = losses.AngularSoftmax(cross_example=True)

    @tf.function(jit_compile=True)
    def step(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            value = loss.from_embeddings(a, b, ids, ids)
        return value, tape.gradient(value, [a, b])

    for step_value in (0, 50):
        loss.step.assign(step_value)
        dense_loss.step.assign(step_value)
        got_value, got_grads = step(q, d)
        want_value, want_grads = value_and_grads(
            lambda a, b: dense_loss(relevance_from_ids(ids, ids), tf.matmul(a, b, transpose_b=True)), q, d
        )
        assert_close(got_value, want_value)
        for got, want in zip(got_grads, want_grads, strict=True):
            assert_close(got, want, atol=2e-6)


def test_bad_inputs_name_the_problem():
    q, d, qid, did = make_case(4, 5, seed=0)
    with pytest.raises(ValueError, match="integer ids"):
        tiled_softmax_loss(q, d, qid.astype(np.float32), did)
    with pytest.raises(ValueError, match="dims differ"):
        tiled_softmax_loss(q, d[:, :3], qid, did)
    with pytest.raises(ValueError, match="tile_size"):
        tiled_softmax_loss(q, d, qid, did, tile_size=0)
    with pytest.raises(ValueError, match="either negative_fraction or top_k"):
        tiled_softmax_loss(q, d, qid, did, negative_fraction=0.5, top_k=2)
    assert default_tile_size(65536) * 65536 <= 2**26


@pytest.mark.parametrize(
    "cross_example,mining", [(True, "all"), (False, "fraction"), (True, "top_k")], ids=["ces", "snm", "cenm"]
)
def test_no_n_by_m_tensor_in_the_compiled_program(cross_example, mining):
    """The XLA program of value + both gradients holds no ``[N, M]`` (or ``[M, N]``) array, nor any array of half
    N·M elements or more: the largest are the ``[N, T]`` tiles and, for per-row mining, the ``[N, 2048]`` digit
    histograms, neither growing with M. (The dense path's program, checked the same way, has one.)"""
    n, m, tile = 96, 8192, 16
    q, d, qid, did = make_case(n, m, dim=8, seed=9, integer=False)
    kwargs = MINING[mining]

    def program(loss_fn):
        @tf.function(jit_compile=True)
        def step(a, b):
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                value = loss_fn(a, b)
            return value, tape.gradient(value, [a, b])

        return step.experimental_get_compiler_ir(tf.constant(q), tf.constant(d))(stage="hlo")

    def shapes(hlo):
        found = set()
        for dims in re.findall(r"(?:f32|f16|bf16|s32|s64|u32|pred)\[([\d,]*)\]", hlo):
            found.add(tuple(int(x) for x in dims.split(",") if x))
        return found

    tiled = shapes(
        program(lambda a, b: tiled_softmax_loss(a, b, qid, did, 4.0, cross_example, tile_size=tile, **kwargs))
    )
    dense_path = shapes(program(lambda a, b: dense(a, b, qid, did, 4.0, cross_example, **kwargs)))
    assert (n, m) in dense_path  # the check can see an [N, M] array when there is one
    assert (n, m) not in tiled and (m, n) not in tiled
    assert max(int(np.prod(s)) for s in tiled) < n * m // 2, sorted(tiled, key=np.prod)[-3:]
    assert (n, tile) in tiled  # the tiles themselves

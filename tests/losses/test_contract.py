"""The loss contract, for every registered loss class (``losses.available()``) and every variant of its options.

Per (class, options): ``get_config`` / ``from_config`` / JSON / Keras serialisation round trips (the config is
exactly the constructor's arguments), the registry's names, XLA (``jit_compile=True``) equals eager (value and
gradient), float16 / bfloat16 inputs give a float32 value equal to the float32 loss on the rounded inputs, the
functional API equals the class, bad inputs raise an error that names the problem (eagerly and in a graph), and
the declared capabilities (logit scale λ, proxies, annealing, Gram matrix) hold. The family tests
(``test_paper_losses.py``, ``test_dml_pairs.py``, ...) keep the mathematics: values against NumPy references,
gradients, papers' special cases.

Inputs are built per capability: proxies (``needs_proxies``: ``S = cos(E, P)``), a Gram matrix
(``needs_gram``: ``S = E Eᵀ``), GOAL's paired image × text layout, and otherwise a rectangular text × image
matrix with several positives per row and an ignored pair.
"""

import inspect
import json
import math

import numpy as np
import pytest
import reference as ref
import tensorflow as tf
import tf_keras

from ce_retrieval import losses
from ce_retrieval.losses import functional, registry

CLASSES = {name: losses.lookup(name) for name in losses.available()}
# only the package's losses (a toy loss another test module registered is not part of the contract)
CLASSES = {name: cls for name, cls in CLASSES.items() if cls.__module__.startswith("ce_retrieval.losses.")}

#: Option variants per class, after the defaults ({}): together they give every constructor argument a value
#: other than its default (checked below) and reach every code path (mining kinds, sorted / per-slot paths).
VARIANTS = {
    "SampledSoftmax": [dict(scale=15.0, bidirectional=True)],
    "StochasticNegativeMining": [dict(scale=15.0, negative_fraction=0.3, bidirectional=True), dict(top_k=3)],
    "CrossExampleSoftmax": [dict(scale=15.0, bidirectional=True)],
    "CrossExampleNegativeMining": [dict(scale=15.0, top_k=5, bidirectional=True), dict(negative_fraction=0.15)],
    "MixedSoftmax": [dict(cross_weight=0.3, warmup_steps=100, scale=15.0, bidirectional=True)],
    "LargeMarginSoftmax": [dict(margin=3, scale=30.0, cross_example=True, bidirectional=True)],
    "AngularSoftmax": [
        dict(
            margin=2,
            lambda_base=500.0,
            lambda_gamma=0.2,
            lambda_power=2.0,
            lambda_min=3.0,
            scale=30.0,
            cross_example=True,
            bidirectional=True,
        )
    ],
    "AdditiveMarginSoftmax": [dict(margin=0.2, scale=30.0, cross_example=True, bidirectional=True)],
    "ArcMarginSoftmax": [dict(margin=0.3, scale=30.0, cross_example=True, bidirectional=True)],
    "NPairLoss": [dict(scale=5.0, bidirectional=True)],
    "InfoNCE": [dict(temperature=0.1, bidirectional=True)],
    "SymmetricInfoNCE": [dict(temperature=0.2)],
    "SigmoidLoss": [dict(scale=5.0, bias=-3.0)],
    "ThresholdConsistentMargin": [dict(margin_plus=0.7, margin_minus=0.2, weight_plus=0.5, weight_minus=2.0)],
    "ContrastiveLoss": [dict(margin=1.2, balanced=True, bidirectional=True)],
    "TripletLoss": [
        dict(margin=0.3, distance="euclidean", average_nonzero=True, positive_slots=4, bidirectional=True),
        dict(positive_slots=0),  # the sorted-merge path
        dict(mining="semi-hard", margin=0.5),
        dict(mining="semi-hard", margin=0.5, positive_slots=0),  # the miner's sort
        dict(max_violation=True, distance="cosine"),
        dict(mining="hard", positive_mining="hard", distance="euclidean"),
        dict(mining="semi-hard", positive_mining="hard", distance="cosine"),
    ],
    "LiftedStructureLoss": [dict(margin=0.8, bidirectional=True)],
    "AngularLoss": [
        dict(alpha=45.0, with_npair=True, npair_weight=1.5, positive_slots=4),
        dict(with_npair=True, positive_slots=0),
    ],
    "MultiSimilarityLoss": [dict(alpha=3.0, beta=40.0, lambda_=1.0, epsilon=0.2, mining=False, bidirectional=True)],
    "CircleLoss": [dict(margin=0.4, gamma=80.0, bidirectional=True)],
    "BinomialDevianceLoss": [dict(alpha=3.0, beta=0.4, negative_cost=10.0, bidirectional=True)],
    "NCALoss": [
        dict(scale=2.0, objective="expected", bidirectional=True),
        dict(similarity="negative_squared_distance"),
    ],
    "LMNNLoss": [
        dict(k=2, margin=0.5, push_weight=0.3, bidirectional=True),
        dict(k=None, similarity="negative_squared_distance"),
    ],
    "ProxyNCALoss": [
        dict(scale=3.0, include_positives_in_denominator=False, objective="expected"),
        dict(similarity="negative_squared_distance"),
    ],
    "ProxyAnchorLoss": [dict(alpha=16.0, delta=0.2)],
    "SoftTripleLoss": [dict(proxies_per_class=3, la=10.0, gamma=0.2, delta=0.05)],
    "CentroidUpperBoundLoss": [dict(similarity="negative_squared_distance", epsilon=1e-6)],
    "GradientObjective": [
        dict(
            triplet_weight="nca",
            pair_weight="linear-ms",
            tau=5.0,
            ms_alpha=3.0,
            ms_beta=5.0,
            ms_lambda=0.4,
            ms_margin=0.2,
            average_over_pairs=False,
        )
    ],
}

#: The declared capabilities: (has_logit_scale, needs_proxies, annealed, needs_gram).
CAPABILITIES = {
    "SampledSoftmax": (True, False, False, False),
    "StochasticNegativeMining": (True, False, False, False),
    "CrossExampleSoftmax": (True, False, False, False),
    "CrossExampleNegativeMining": (True, False, False, False),
    "MixedSoftmax": (True, False, True, False),
    "LargeMarginSoftmax": (True, False, False, False),
    "AngularSoftmax": (True, False, True, False),
    "AdditiveMarginSoftmax": (True, False, False, False),
    "ArcMarginSoftmax": (True, False, False, False),
    "NPairLoss": (True, False, False, False),
    "InfoNCE": (True, False, False, False),
    "SymmetricInfoNCE": (True, False, False, False),
    "SigmoidLoss": (True, False, False, False),
    "ThresholdConsistentMargin": (False, False, False, False),
    "ContrastiveLoss": (False, False, False, False),
    "TripletLoss": (False, False, False, False),
    "LiftedStructureLoss": (False, False, False, False),
    "AngularLoss": (False, False, False, True),
    "MultiSimilarityLoss": (False, False, False, False),
    "CircleLoss": (False, False, False, False),
    "BinomialDevianceLoss": (False, False, False, False),
    "NCALoss": (True, False, False, False),
    "LMNNLoss": (False, False, False, False),
    "ProxyNCALoss": (True, True, False, False),
    "ProxyAnchorLoss": (False, True, False, False),
    "SoftTripleLoss": (False, True, False, False),
    "CentroidUpperBoundLoss": (False, True, False, False),
    "GradientObjective": (False, False, False, False),
}

CASES = [(name, kwargs) for name in sorted(CLASSES) for kwargs in [{}] + VARIANTS.get(name, [])]
CASE_IDS = [f"{name}-{i}" for name in sorted(CLASSES) for i in range(1 + len(VARIANTS.get(name, [])))]


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def inputs_for(loss):
    """``(relevance, scores)`` float32 suitable for ``loss``, from its declared capabilities."""
    rng = np.random.default_rng(0)
    dim = 6
    if loss.needs_proxies:  # S = cos(E, P): 9 examples of 3 classes against K proxies per class
        k = loss.proxies_per_class if isinstance(loss, losses.SoftTripleLoss) else 1
        labels = np.arange(9) % 3
        centres = rng.normal(size=(3, dim))
        e = _unit(centres[labels] + 0.8 * rng.normal(size=(9, dim)))
        p = _unit(np.repeat(centres, k, axis=0) + 0.5 * rng.normal(size=(3 * k, dim)))
        relevance = (labels[:, None] == (np.arange(3 * k) // k)[None, :]).astype(np.float32)
        return relevance, e @ p.T
    if isinstance(loss, losses.GradientObjective):  # matched image/text pairs on the diagonal
        x = _unit(rng.normal(size=(8, dim)))
        y = _unit(x + 0.6 * rng.normal(size=(8, dim)))
        return np.eye(8, dtype=np.float32), x @ y.T
    ids = np.array([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    centres = rng.normal(size=(5, dim))
    if loss.needs_gram:  # S = E Eᵀ of one embedding set, self-pairs ignored
        e = _unit(centres[ids] + 0.9 * rng.normal(size=(len(ids), dim)))
        relevance = losses.relevance_from_ids(ids, ids, exclude_self=True).numpy()
        relevance[1, 3] = relevance[3, 1] = -1.0  # an ignored pair
        return relevance, e @ e.T
    # text x image: captions share an image, two images share ids 0 and 2 (rows with two positives), 5 unmatched
    image_ids = np.array([0, 0, 1, 2, 2, 3, 4, 5])
    texts = _unit(centres[ids] + 0.9 * rng.normal(size=(len(ids), dim)))
    images = _unit(np.concatenate([centres, rng.normal(size=(1, dim))])[image_ids] + 0.5 * rng.normal(size=(8, dim)))
    relevance = losses.relevance_from_ids(ids, image_ids).numpy()
    relevance[5, 3] = -1.0  # an ignored pair
    return relevance, texts @ images.T


def _value_and_grad(loss, relevance, scores):
    with tf.GradientTape() as tape:
        tape.watch(scores)
        value = loss(relevance, scores)
    return value, tape.gradient(value, scores)


def _case(name, kwargs):
    loss = CLASSES[name](**kwargs)
    return loss, inputs_for(loss)


# ---- configuration and registry -----------------------------------------------------------------------------


@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_config_round_trip(name, kwargs):
    cls = CLASSES[name]
    loss, (relevance, scores) = _case(name, kwargs)
    config = loss.get_config()
    expected = {"name"} | ({"bidirectional"} if cls.supports_bidirectional else set()) | set(cls.hyperparameter_names())
    assert set(config) == expected  # the constructor's arguments, nothing else
    for key, value in kwargs.items():
        assert config[key] == value, key
    again = cls.from_config(json.loads(json.dumps(config)))  # a JSON-safe config
    keras = tf_keras.losses.deserialize(tf_keras.losses.serialize(loss))
    by_dict = losses.get({"class_name": cls.__name__, "config": config})
    for other in (again, keras, by_dict):
        assert type(other) is cls and other.get_config() == config
        np.testing.assert_allclose(float(other(relevance, scores)), float(loss(relevance, scores)), rtol=1e-6)
    renamed = cls(name="renamed", **kwargs)
    assert type(renamed).from_config(renamed.get_config()).name == "renamed"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_variants_cover_every_constructor_argument(name):
    cls = CLASSES[name]
    defaults = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()}
    changed = {key for kwargs in VARIANTS.get(name, []) for key, value in kwargs.items() if value != defaults.get(key)}
    wanted = set(cls.hyperparameter_names()) | ({"bidirectional"} if cls.supports_bidirectional else set())
    assert wanted <= changed, f"VARIANTS[{name!r}] leaves {sorted(wanted - changed)} at their defaults"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_registry_names_round_trip(name):
    cls = CLASSES[name]
    assert type(losses.get(cls().name)) is cls  # the default Keras name is a registered name
    for alias in registry.aliases(cls):
        assert losses.lookup(alias) is cls, alias
    assert losses.lookup(registry.snake_case(name)) is cls
    kwargs = VARIANTS.get(name, [{}])[0]
    assert losses.get(registry.snake_case(name), **kwargs).get_config() == cls(**kwargs).get_config()


def test_npair_loss_name_is_registered():
    """Issue 11: ``NPairLoss().name`` ('npair_loss') was no alias, and two snake-case rules disagreed."""
    assert losses.NPairLoss().name == "npair_loss"
    assert losses.lookup("npair_loss") is losses.NPairLoss is losses.lookup("n_pair_loss")
    assert registry.snake_case("LMNNLoss") == "lmnn_loss" and registry.snake_case("InfoNCE") == "info_nce"


def test_toy_loss_registered_by_a_fixture_only(toy_loss):
    assert "ToyMeanPositiveScore" in losses.available()
    loss = losses.get("toy_mean_positive_score", weight=2.0)
    clone = tf_keras.losses.deserialize(tf_keras.losses.serialize(loss))
    assert type(clone) is toy_loss and clone.get_config() == {
        "name": "toy_mean_positive_score",
        "bidirectional": False,
        "weight": 2.0,
    }
    assert float(clone(np.eye(2, dtype=np.float32), np.array([[0.5, 0.1], [0.2, 0.9]], np.float32))) == pytest.approx(
        -1.4
    )
    with pytest.raises(ValueError, match="already taken"):
        losses.register(type("ToyMeanPositiveScore", (losses.RetrievalLoss,), {}))


def test_toy_loss_is_gone_after_its_test():
    assert "ToyMeanPositiveScore" not in losses.available()
    assert "ce_retrieval>ToyMeanPositiveScore" not in tf_keras.utils.get_custom_objects()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_bidirectional_only_where_supported(name):
    cls = CLASSES[name]
    if cls.supports_bidirectional:
        assert cls(bidirectional=True).get_config()["bidirectional"] is True
        return
    assert "bidirectional" not in cls().get_config()
    if cls is losses.SymmetricInfoNCE:  # bidirectional by definition: only the one-way request is refused
        with pytest.raises(ValueError, match="always bidirectional"):
            cls(bidirectional=False)
        return
    with pytest.raises(ValueError, match="bidirectional"):
        cls(bidirectional=True)


# ---- capabilities -------------------------------------------------------------------------------------------


def test_every_class_declares_its_capabilities():
    assert set(CAPABILITIES) == set(CLASSES)
    for name, (scale, proxies, annealed, gram) in CAPABILITIES.items():
        cls = CLASSES[name]
        assert (cls.has_logit_scale, cls.needs_proxies, cls.annealed, cls.needs_gram) == (
            scale,
            proxies,
            annealed,
            gram,
        ), name
        loss = cls()
        assert isinstance(getattr(loss, "step", None), tf.Variable) == annealed, name
        if proxies:
            assert not cls.supports_bidirectional, name  # S^T would make proxies the queries
        if scale:
            for lam in (5.0, 20.0):
                assert cls(**cls.logit_scale_kwargs(lam)).logit_scale == pytest.approx(lam), name
        else:
            assert cls.logit_scale_kwargs(20.0) == {} and loss.logit_scale is None, name
        if name in HAS_LOGIT_BIAS:
            assert cls(**cls.logit_bias_kwargs(-4.0)).logit_bias == pytest.approx(-4.0), name
        else:
            assert cls.logit_bias_kwargs(-4.0) == {} and loss.logit_bias is None, name


#: The losses that declare a logit bias b (``l = λ·S + b``).
HAS_LOGIT_BIAS = {"SigmoidLoss"}


def test_logit_bias_is_declared_where_it_is_a_hyperparameter():
    assert {name for name, cls in CLASSES.items() if cls.has_logit_bias} == HAS_LOGIT_BIAS
    for name in HAS_LOGIT_BIAS:
        assert "bias" in CLASSES[name].hyperparameter_names(), name


#: Options under which a has_logit_scale loss is a plain softmax over λ·S (no margin, no mining).
PLAIN = {
    "StochasticNegativeMining": dict(negative_fraction=1.0),
    "CrossExampleNegativeMining": dict(negative_fraction=1.0),
    "MixedSoftmax": dict(cross_weight=0.0),  # the row softmax
    "LargeMarginSoftmax": dict(margin=1),
    "AngularSoftmax": dict(margin=1),
    "AdditiveMarginSoftmax": dict(margin=0.0),
    "ArcMarginSoftmax": dict(margin=0.0),
}


@pytest.mark.parametrize("name", sorted(n for n in CLASSES if CLASSES[n].has_logit_scale))
def test_logit_scale_multiplies_cosines(name):
    """Issue 11: ``cls(**cls.logit_scale_kwargs(λ))`` uses the logits λ·S on cosine S (NCA once used 2λ).

    Reference: the softmax over λ·S of NumPy (row-wise; across the batch's negatives for the cross-example
    losses; both directions for SymmetricInfoNCE), one positive per row and nothing ignored; for SigmoidLoss,
    the pairwise sigmoid on λ·S + b.
    """
    cls, lam = CLASSES[name], 20.0
    rng = np.random.default_rng(5)
    queries, documents = _unit(rng.normal(size=(6, 5))), _unit(rng.normal(size=(6, 5)))
    if cls.needs_proxies:
        documents = _unit(rng.normal(size=(4, 5)))
        relevance = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]]
    else:
        relevance = np.eye(6, dtype=np.float32)[[1, 2, 0, 4, 5, 3]]
    scores = queries @ documents.T
    loss = cls(**cls.logit_scale_kwargs(lam), **PLAIN.get(name, {}))
    assert loss.logit_scale == pytest.approx(lam)
    if name == "SigmoidLoss":
        want = ref.sigmoid(relevance, scores.astype(np.float64), scale=lam, bias=loss.logit_bias)
        assert float(loss(relevance, scores)) == pytest.approx(want, rel=1e-5)
        return
    cross = name.startswith("CrossExample")
    want = ref.softmax(relevance, scores, scale=lam, cross_example=cross)
    if name == "SymmetricInfoNCE":
        want = 0.5 * (want + ref.softmax(relevance.T, scores.T, scale=lam))
    if not cross:  # the row softmax written out once more: -log e^{λ s_ij} / sum_k e^{λ s_ik}
        logits = lam * scores.astype(np.float64)
        rows = np.mean(
            [np.logaddexp.reduce(logits[i]) - logits[i, j] for i, j in zip(*np.nonzero(relevance), strict=True)]
        )
        if name != "SymmetricInfoNCE":
            assert want == pytest.approx(rows, rel=1e-9)
    assert float(loss(relevance, scores)) == pytest.approx(want, rel=1e-5)


#: The losses whose logits are not linear in S: the margin softmaxes (λ·ψ(cos)) and NCA (clamped d² = 2 − 2s).
NEEDS_COSINE = {
    "LargeMarginSoftmax",
    "AngularSoftmax",
    "AdditiveMarginSoftmax",
    "ArcMarginSoftmax",
    "NCALoss",
    "ProxyNCALoss",
}


@pytest.mark.parametrize("name", sorted(n for n in CLASSES if CLASSES[n].has_logit_scale))
def test_a_given_lambda_reaches_every_loss_one_way(name):
    """λ (and b) given at call, a number or a learned tensor, replace the instance's: the value and the gradient
    w.r.t. S are the fixed-λ loss's at that λ. A loss linear in S folds a tensor into ``λ·S + b``; one that
    ``needs_cosine`` (and only such a loss: on ``λ·S`` it would differ) applies λ after its transform."""
    cls, lam, bias = CLASSES[name], 20.0, -4.0
    assert cls.needs_cosine == (name in NEEDS_COSINE)
    fixed = cls(**cls.logit_scale_kwargs(lam), **cls.logit_bias_kwargs(bias))
    other = cls(**cls.logit_scale_kwargs(3.0), **cls.logit_bias_kwargs(1.5))  # replaced at call
    if cls.annealed:
        fixed.step.assign(10_000)
        other.step.assign(10_000)
    relevance, scores = inputs_for(fixed)
    scores = tf.constant(scores)

    def value_and_grad(loss, **given):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = loss.call(relevance, scores, **given)
        return float(value), tape.gradient(value, scores).numpy()

    want, want_grad = value_and_grad(fixed)
    bias_kwargs = {"logit_bias": bias} if cls.has_logit_bias else {}
    for given in (
        {"logit_scale": lam, **bias_kwargs},  # numbers (a fixed λ)
        {"logit_scale": tf.constant(lam), **bias_kwargs},  # a learned λ
        {"logit_scale": tf.constant(lam), **{k: tf.constant(v) for k, v in bias_kwargs.items()}},  # and b
    ):
        got, got_grad = value_and_grad(other, **given)
        assert got == pytest.approx(want, rel=1e-5), (name, given)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-6, err_msg=name)
    unit = cls(**cls.logit_scale_kwargs(1.0), **cls.logit_bias_kwargs(0.0))
    if cls.annealed:
        unit.step.assign(10_000)
    on_scaled = float(unit(relevance, lam * scores + (bias if cls.has_logit_bias else 0.0)))
    if name in NEEDS_COSINE:  # why such a loss is not given λ·S
        assert abs(on_scaled - want) > 1e-3 * abs(want), name
    else:
        assert on_scaled == pytest.approx(want, rel=1e-5), name


def test_a_loss_refuses_a_scalar_it_does_not_have():
    relevance, scores = inputs_for(CLASSES["TripletLoss"]())
    with pytest.raises(ValueError, match="TripletLoss has no logit scale"):
        CLASSES["TripletLoss"]().call(relevance, scores, logit_scale=tf.constant(20.0))
    with pytest.raises(ValueError, match="CrossExampleSoftmax has no logit bias"):
        CLASSES["CrossExampleSoftmax"]().call(relevance, scores, logit_bias=-4.0)


# ---- XLA, mixed precision, functional API ------------------------------------------------------------------


@pytest.fixture(scope="module")
def eager_and_xla():
    """Value and gradient of every case, eagerly and in ONE jit-compiled function (one XLA compilation)."""
    cases = [_case(name, kwargs) for name, kwargs in CASES]
    for loss, _ in cases:
        if loss.annealed:
            loss.step.assign(50)  # a step variable read at run time

    def evaluate(all_scores):
        return [_value_and_grad(loss, r, s) for (loss, (r, _)), s in zip(cases, all_scores, strict=True)]

    scores = [tf.constant(s) for _, (_, s) in cases]
    eager = [(float(v), g.numpy()) for v, g in evaluate(scores)]
    xla = [(float(v), g.numpy()) for v, g in tf.function(evaluate, jit_compile=True, autograph=False)(scores)]
    return dict(zip(CASE_IDS, zip(eager, xla, strict=True), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_xla_equals_eager(case_id, eager_and_xla):
    (eager_value, eager_grad), (xla_value, xla_grad) = eager_and_xla[case_id]
    assert math.isfinite(eager_value) and np.all(np.isfinite(eager_grad))
    np.testing.assert_allclose(xla_value, eager_value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xla_grad, eager_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_mixed_precision_inputs(name, kwargs):
    loss, (relevance, scores) = _case(name, kwargs)
    full = float(loss(relevance, scores))
    for dtype in (tf.float16, tf.bfloat16):
        low = tf.cast(scores, dtype)
        value, grad = _value_and_grad(loss, relevance, low)
        assert value.dtype == tf.float32 and grad.dtype == dtype
        # float32 arithmetic on the rounded scores, exactly, and close to the float32 loss
        np.testing.assert_allclose(float(value), float(loss(relevance, tf.cast(low, tf.float32))), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(float(value), full, rtol=0.05, atol=0.05)
        assert np.all(np.isfinite(tf.cast(grad, tf.float32).numpy()))


@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_functional_api_equals_the_class(name, kwargs):
    cls = CLASSES[name]
    loss, (relevance, scores) = _case(name, kwargs)
    function = getattr(functional, cls.function.__name__)
    assert function.__wrapped__ is cls.function  # the class is a thin layer over the family's function
    two_way = {"bidirectional": True} if loss.supports_bidirectional and loss.bidirectional else {}
    value = function(relevance, scores, **loss.function_kwargs(), **two_way)
    assert value.dtype == tf.float32
    np.testing.assert_allclose(float(value), float(loss(relevance, scores)), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive pair"):
        function(np.zeros_like(relevance), scores, **loss.function_kwargs())


def test_functional_api_covers_every_family():
    exported = {getattr(functional, name).__wrapped__ for name in functional.__all__}
    assert {cls.function for cls in CLASSES.values()} <= exported


# ---- bad inputs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_bad_inputs_name_the_problem(name):
    loss, (relevance, scores) = _case(name, {})
    with pytest.raises(ValueError, match="does not match"):
        loss(relevance, scores[:, :-1])
    with pytest.raises(ValueError, match="rank-2"):
        loss(relevance[0], scores[0])
    with pytest.raises(ValueError, match="dtype bool"):
        loss(relevance > 0, scores)
    with pytest.raises(ValueError, match="floating"):
        loss(relevance, scores.astype(np.int32))
    with pytest.raises(ValueError, match="sample_weight"):
        loss(relevance, scores, sample_weight=np.ones(len(scores), np.float32))
    nan = scores.copy()
    nan[0, 0] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        loss(relevance, nan)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"outside \{-1, 0, 1\}"):
        loss(2 * relevance, scores)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive pair"):
        loss(np.where(relevance == 1, 0.0, relevance).astype(np.float32), scores)
    # the run-time checks hold in a graph as well, and the graph computes the eager value
    graph = tf.function(lambda r, s: loss(r, s))
    assert float(graph(relevance, scores)) == pytest.approx(float(loss(relevance, scores)), rel=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive pair"):
        graph(np.zeros_like(relevance), scores)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        graph(relevance, nan)


@pytest.mark.parametrize("name", sorted(n for n in CLASSES if CLASSES[n].needs_gram))
def test_gram_matrix_required(name):
    """Issue 11: a loss that reads S[p, :] of a positive p refuses the two-tower text × image matrix, square or not."""
    loss, (relevance, gram) = _case(name, {})
    rng = np.random.default_rng(2)
    texts, images = _unit(rng.normal(size=(len(gram), 6))), _unit(rng.normal(size=(len(gram), 6)))
    two_tower = texts @ images.T  # [B, B] but not a Gram matrix
    with pytest.raises(tf.errors.InvalidArgumentError, match="not symmetric.*Gram matrix"):
        loss(relevance, two_tower)
    symmetric = 0.5 * (two_tower + two_tower.T)  # symmetric, but its diagonal is not 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="diagonal"):
        loss(relevance, symmetric)
    with pytest.raises(ValueError, match="square"):
        loss(relevance[:, :-1], gram[:, :-1])
    graph = tf.function(lambda r, s: loss(r, s))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Gram matrix"):
        graph(relevance, two_tower)
    function = getattr(functional, CLASSES[name].function.__name__)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Gram matrix"):
        function(relevance, two_tower)
    # a Gram matrix rounded to bfloat16 is still one
    assert math.isfinite(float(loss(relevance, tf.cast(gram, tf.bfloat16))))

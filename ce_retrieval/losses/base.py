"""The one loss contract of ce_retrieval (docs/losses.md).

Every objective maps a similarity matrix ``S = y_pred`` of shape ``[N, M]`` (rows: queries, columns:
documents) and a relevance matrix ``R = y_true`` of the same shape (1 positive, 0 negative, -1 ignored) to a
scalar: the mean over positive pairs of a per-pair term. Each family's mathematics is a plain function
``fn(relevance, scores, **hyper) -> scalar`` in its module (exported, validated, by
:mod:`ce_retrieval.losses.functional`); a Keras class names it as its ``function`` and its constructor arguments
are the function's hyper-parameters, so :meth:`RetrievalLoss.compute` calls ``function(relevance, scores,
**hyperparameters())`` and :meth:`RetrievalLoss.get_config` is read off the constructor's signature (no
hand-written config). The list of hyper-parameters is written once, in the function: a class that writes no
``__init__`` gets one with the function's keyword arguments and defaults, validated by the class's ``check`` (the
family's check function, shared with the function). A subclass may override ``compute`` instead (on float32
tensors already validated). This base class owns everything else:

* validation with clear errors (rank, shape, dtype, relevance values, no positive pair, non-finite scores and,
  for a loss that ``needs_gram``, a similarity matrix that is not the Gram matrix of one embedding set),
  statically where shapes are known and with ``tf.debugging`` asserts at run time (eager and graph mode;
  XLA compiles asserts out, so under ``jit_compile=True`` only the static checks remain);
* float32 computation whatever the input dtype (float16/bfloat16 mixed precision);
* ``bidirectional=True``: mean of the loss on ``S`` (text->image) and on ``S^T`` (image->text), as CLIP.

Distribution is not the loss's business: a loss returns the objective of the matrix it is given, and whoever runs
the step scales it for the replicas, as for every Keras loss. ``reduction`` keeps Keras's meaning (the value is
one scalar, so every reduction returns it unchanged): under ``model.compile``/``fit`` with a strategy, Keras
divides an ``AUTO``/``SUM_OVER_BATCH_SIZE`` loss by ``num_replicas_in_sync`` itself, which is exact both for
per-replica matrices (the mean of the replicas' losses) and for all-gathered global matrices (every replica holds
the global ``L``; Keras sums ``L / R`` over replicas). In a custom loop under a strategy, pass
``reduction="sum"`` and scale yourself (Keras refuses ``AUTO`` there with its own message). The two-tower model
owns its step and does the scaling there (``ce_retrieval/modeling/two_tower.py``). ``sample_weight`` is not
supported (weight pairs through ``y_true`` instead).

λ and b at call. A loss with a logit scale λ (``has_logit_scale``; and a logit bias b, ``has_logit_bias``) is
constructed with λ₀ (b₀): its value when it is called alone. The retrieval objective, the one owner of λ and b
(``ce_retrieval.objective``), gives the loss their current values at every call, the one way they reach a loss:
``logit_scale=`` and ``logit_bias=`` of :meth:`RetrievalLoss.call`, ``sharded_share`` and ``tiled_loss``. A given
value replaces the instance's for that evaluation (:meth:`RetrievalLoss.given_scalars`):

* a number (a fixed λ or b) goes through ``logit_scale_kwargs`` / ``logit_bias_kwargs`` into the loss's own
  arithmetic, exactly as the constructor's value would;
* a tensor (a learned λ or b) is folded into the input by a loss linear in S: the logits ``λ·S + b`` are formed
  once and the loss is evaluated at λ = 1, b = 0 (on the tiled path ``λ·q``, and b as one more column,
  ``[λq, b]·[d, 1] = λ q·d + b``: :meth:`RetrievalLoss.fold_into_embeddings`); when b is learned a fixed λ is
  folded with it, since b is added after λ;
* a loss that ``needs_cosine`` (its logits are not linear in S: a margin on cosines, NCA's clamped distance) is
  given a learned λ as a tensor, applied after its own transform of the cosines.

Folding keeps every kernel's arithmetic at a Python-number λ (the same float32 rounding as a fixed λ's run) and
costs one multiply of S, or of the ``[N, d]`` queries on the tiled path.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import tensorflow as tf
import tf_keras

from ce_retrieval.losses._similarity import require_gram
from ce_retrieval.losses.kernels.masked import mean_over_positives
from ce_retrieval.losses.registry import default_name, register
from ce_retrieval.losses.relevance import IGNORED, IRRELEVANT, RELEVANT


def validate_similarity_inputs(y_true, y_pred, name: str = "loss", gram: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """Checks and casts ``(y_true, y_pred)``; returns float32 ``(relevance, scores)``.

    Raises ``ValueError`` for problems visible in static shapes and dtypes, and adds run-time asserts that raise
    ``tf.errors.InvalidArgumentError`` for: relevance values outside {-1, 0, 1}, no positive pair, non-finite
    scores, and shape mismatches only known at run time. ``gram=True`` also requires ``y_pred`` to be the Gram
    matrix of one embedding set (square, symmetric, unit diagonal: ``_similarity.require_gram``).
    """
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if not (y_pred.dtype.is_floating):
        raise ValueError(f"{name}: y_pred (similarity scores) must be a floating tensor, got dtype {y_pred.dtype.name}")
    if y_true.dtype == tf.bool or not (y_true.dtype.is_floating or y_true.dtype.is_integer):
        raise ValueError(
            f"{name}: y_true (relevance) must be numeric with values in {{-1, 0, 1}}, got dtype {y_true.dtype.name}"
        )
    if y_pred.shape.rank is not None and y_pred.shape.rank != 2:
        raise ValueError(
            f"{name}: y_pred must be a rank-2 similarity matrix [num_queries, num_documents], got shape {y_pred.shape}"
        )
    if y_true.shape.rank is not None and y_true.shape.rank != 2:
        raise ValueError(
            f"{name}: y_true must be a rank-2 relevance matrix [num_queries, num_documents], got shape {y_true.shape}"
        )
    if y_true.shape.is_fully_defined() and y_pred.shape.is_fully_defined() and y_true.shape != y_pred.shape:
        raise ValueError(f"{name}: y_true shape {y_true.shape} does not match y_pred shape {y_pred.shape}")
    if y_pred.shape.num_elements() == 0:
        raise ValueError(f"{name}: empty batch (y_pred has shape {y_pred.shape})")

    scores = tf.cast(y_pred, tf.float32)
    relevance = tf.cast(y_true, tf.float32)
    checks = [
        tf.debugging.assert_equal(
            tf.shape(relevance), tf.shape(scores), message=f"{name}: y_true and y_pred shapes differ"
        ),
        tf.debugging.assert_greater(tf.size(scores), 0, message=f"{name}: empty batch"),
        tf.debugging.assert_equal(
            tf.reduce_all((relevance == RELEVANT) | (relevance == IRRELEVANT) | (relevance == IGNORED)),
            True,
            message=f"{name}: y_true (relevance) has values outside {{-1, 0, 1}}",
        ),
        tf.debugging.assert_equal(
            tf.reduce_any(relevance == RELEVANT), True, message=f"{name}: the batch has no positive pair (y_true == 1)"
        ),
        tf.debugging.assert_equal(
            tf.reduce_all(tf.math.is_finite(scores)), True, message=f"{name}: y_pred has NaN or Inf scores"
        ),
    ]
    with tf.control_dependencies(checks):
        relevance, scores = tf.identity(relevance), tf.identity(scores)
    if gram:
        scores = require_gram(scores, name)
    return relevance, scores


class Folded(NamedTuple):
    """What a learned λ and b fold into a loss's input (``RetrievalLoss.given_scalars``; None: nothing)."""

    scale: tf.Tensor | float | None
    bias: tf.Tensor | None

    def apply(self, scores: tf.Tensor) -> tf.Tensor:
        """``λ·S + b`` of the folded parts (S unchanged when nothing is folded)."""
        if self.scale is not None:
            scores = scores * self.scale
        if self.bias is not None:
            scores = scores + self.bias
        return scores


class RetrievalLoss(tf_keras.losses.Loss):
    """Base class: validation, float32, bidirectional averaging, config. See module docstring."""

    #: The family's loss function ``fn(relevance, scores, **hyperparameters()) -> scalar`` that ``compute`` calls.
    function = None
    #: Keras ``name`` when none is given; ``None``: the snake-cased class name (``registry.default_name``).
    default_name: str | None = None
    #: Subclasses that may be applied to S^T set this to True to expose ``bidirectional=``.
    supports_bidirectional = True

    # Declared capabilities: what the retrieval task (``ce_retrieval.tasks``) reads to wire a loss into a model;
    # nothing is found by ``getattr``.
    #: λ (the logit scale, ``l = λ·S``) is a constructor argument; see :meth:`logit_scale_kwargs`.
    has_logit_scale: bool = False
    #: b, a logit bias (``l = λ·S + b``, SigLIP), is a constructor argument; see :meth:`logit_bias_kwargs`.
    has_logit_bias: bool = False
    #: the columns of S are learned class proxies (or centres), not documents of the batch.
    needs_proxies: bool = False
    #: holds a training-step variable ``step`` that :class:`~ce_retrieval.losses.AnnealingStepCallback` advances.
    annealed: bool = False
    #: S must be the Gram matrix X·Xᵀ of one embedding set (the two-tower task passes the joint Gram matrix of
    #: [text; image] embeddings).
    needs_gram: bool = False
    #: has an exact column-tiled path from embeddings (:meth:`tiled_loss`, ``kernels/tiled.py``: no ``[N, M]`` matrix).
    supports_tiled: bool = False
    #: can be sharded over replicas (:meth:`sharded_share`: each replica's rows against the gathered documents,
    #: the replicas' shares summing to the loss; ``kernels/sharded.py``).
    supports_sharded: bool = False
    #: S must stay cosines because the logits are not linear in S (the margin softmaxes' ``p = λ·ψ(cos)``, NCA's
    #: clamped ``d² = max(2 − 2s, 0)``): a learned λ given at call is not folded into S but applied by the loss
    #: after its own transform (module docstring, "λ and b at call").
    needs_cosine: bool = False

    #: the family's validation, ``check(**hyperparameters, owner=class name)`` -> the values to store (a dict, or a
    #: tuple in the function's order); ``None``: stored as given. Used by a class that writes no ``__init__``.
    check = None

    def __init_subclass__(cls, **kwargs):
        """A subclass that names its ``function`` and neither writes nor inherits a constructor of its own gets one
        whose hyper-parameters are the function's keyword arguments, with the function's defaults: each list is
        written once, in the function."""
        super().__init_subclass__(**kwargs)
        inherited = cls.__init__  # RetrievalLoss's, or one built here: a class's own constructor is kept
        plain = inherited is RetrievalLoss.__init__ or getattr(inherited, "from_function", False)
        if "function" in vars(cls) and "__init__" not in vars(cls) and cls.function is not None and plain:
            cls.__init__ = _constructor_of(cls.function)

    @classmethod
    def logit_scale_kwargs(cls, scale) -> dict:
        """Constructor kwargs that give this loss the logit scale λ = ``scale`` ({} for a loss without one); a
        tensor stays a tensor (the learned λ given to a loss that ``needs_cosine``)."""
        if not cls.has_logit_scale:
            return {}
        return {"scale": scale if tf.is_tensor(scale) else float(scale)}

    def given_scalars(self, logit_scale=None, logit_bias=None) -> tuple[Folded, dict]:
        """How one evaluation applies the λ and b it is given (module docstring, "λ and b at call"): what to fold
        into the input (:class:`Folded`: ``scale``, ``bias``, each None for nothing) and the keyword arguments
        ``logit_scale`` / ``logit_bias`` that replace the instance's own in :meth:`compute` (or in a path's kernel).
        """
        if logit_scale is not None and not self.has_logit_scale:
            raise ValueError(f"{self.name}: logit_scale= given, but {type(self).__name__} has no logit scale")
        if logit_bias is not None and not self.has_logit_bias:
            raise ValueError(f"{self.name}: logit_bias= given, but {type(self).__name__} has no logit bias")
        scale = tf.cast(logit_scale, tf.float32) if tf.is_tensor(logit_scale) else logit_scale
        bias = tf.cast(logit_bias, tf.float32) if tf.is_tensor(logit_bias) else logit_bias
        if tf.is_tensor(bias) and self.needs_cosine:  # no such loss today: a bias after a transform of the cosines
            raise ValueError(f"{self.name}: a learned logit bias cannot be folded into the cosines of this loss")
        if not (tf.is_tensor(scale) or tf.is_tensor(bias)) or self.needs_cosine:
            given = {"logit_scale": scale, "logit_bias": bias}
            return Folded(None, None), {k: v for k, v in given.items() if v is not None}
        folded_bias = bias if tf.is_tensor(bias) else None
        kwargs = {} if scale is None else {"logit_scale": 1.0}
        if bias is not None:
            kwargs["logit_bias"] = 0.0 if folded_bias is not None else bias
        return Folded(scale, folded_bias), kwargs

    @staticmethod
    def fold_into_embeddings(query_emb, doc_emb, folded: Folded) -> tuple[tf.Tensor, tf.Tensor]:
        """The tiled path's fold: queries ``λ·q`` and, for b, one more column ``[λq, b]·[d, 1] = λ q·d + b``."""
        if folded.scale is None and folded.bias is None:
            return query_emb, doc_emb
        query_emb = tf.cast(query_emb, tf.float32)
        if folded.scale is not None:
            query_emb = query_emb * folded.scale
        if folded.bias is not None:
            doc_emb = tf.cast(doc_emb, tf.float32)
            query_emb = tf.concat([query_emb, tf.fill([tf.shape(query_emb)[0], 1], folded.bias)], 1)
            doc_emb = tf.concat([doc_emb, tf.ones([tf.shape(doc_emb)[0], 1], tf.float32)], 1)
        return query_emb, doc_emb

    @property
    def logit_scale(self) -> float | None:
        """The λ this instance multiplies S by, or None for a loss without a logit scale."""
        return float(self.scale) if self.has_logit_scale else None

    @classmethod
    def logit_bias_kwargs(cls, bias: float) -> dict:
        """Constructor kwargs that give this loss the logit bias b = ``bias`` ({} for a loss without one)."""
        return {"bias": float(bias)} if cls.has_logit_bias else {}

    @property
    def logit_bias(self) -> float | None:
        """The b this instance adds to its logits, or None for a loss without a logit bias."""
        return float(self.bias) if self.has_logit_bias else None

    def __init__(
        self,
        bidirectional: bool = False,
        name: str | None = None,
        reduction: str = tf_keras.losses.Reduction.AUTO,
        **kwargs,
    ):
        if bidirectional and not self.supports_bidirectional:
            raise ValueError(f"{type(self).__name__} does not support bidirectional=True")
        super().__init__(name=name or default_name(type(self)), reduction=reduction, **kwargs)
        self.bidirectional = bool(bidirectional)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(
                f"{self.name}: sample_weight is not supported by similarity-matrix losses; "
                "mark pairs as ignored (-1) in y_true instead"
            )
        return super().__call__(y_true, y_pred)

    # No tensor-dependent Python control flow here or in ``compute``: skipping autograph's conversion saves most
    # of a loss's trace time.
    @tf.autograph.experimental.do_not_convert
    def call(self, y_true, y_pred, logit_scale=None, logit_bias=None) -> tf.Tensor:
        """The loss of ``(R, S)``; ``logit_scale``, ``logit_bias``: λ and b that replace this instance's (a number,
        or a learned tensor: module docstring, "λ and b at call")."""
        relevance, scores = validate_similarity_inputs(y_true, y_pred, self.name, gram=self.needs_gram)
        folded, kwargs = self.given_scalars(logit_scale, logit_bias)
        scores = folded.apply(scores)
        value = self.compute(relevance, scores, **kwargs)
        if self.bidirectional:
            value = 0.5 * (value + self.compute(tf.transpose(relevance), tf.transpose(scores), **kwargs))
        return value

    def compute(self, relevance: tf.Tensor, scores: tf.Tensor, logit_scale=None, logit_bias=None) -> tf.Tensor:
        """Scalar float32 loss for validated ``relevance`` and ``scores`` (both float32 ``[N, M]``): the class's
        ``function`` with this instance's hyper-parameters (λ and b replaced by ``logit_scale`` and ``logit_bias``
        when given). Override it for a loss without such a function."""
        if type(self).function is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither `function` nor `compute`")
        kwargs = self.function_kwargs()
        if logit_scale is not None:
            kwargs.update(self.logit_scale_kwargs(logit_scale))
        if logit_bias is not None:
            kwargs.update(self.logit_bias_kwargs(logit_bias))
        return type(self).function(relevance, scores, **kwargs)

    def function_kwargs(self) -> dict:
        """The keyword arguments ``compute`` gives ``function``: the hyper-parameters, unless a class maps them
        (an annealed loss passes its current λ instead of its schedule)."""
        return self.hyperparameters()

    @classmethod
    def hyperparameter_names(cls) -> tuple[str, ...]:
        """The named arguments of the constructor, less ``name``, ``bidirectional`` and ``reduction``: the
        hyper-parameters, each stored under its own name on the instance."""
        return tuple(
            p.name
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.name not in ("self", "name", "bidirectional", "reduction")
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        )

    def hyperparameters(self) -> dict:
        """``{argument: value}`` for every hyper-parameter of :meth:`hyperparameter_names`."""
        return {key: getattr(self, key) for key in self.hyperparameter_names()}

    def get_config(self) -> dict:
        """``name``, ``bidirectional`` (where supported) and every hyper-parameter: exactly the constructor's
        arguments, so ``type(loss).from_config(loss.get_config())`` rebuilds the loss."""
        config = super().get_config()
        if config.get("reduction") == tf_keras.losses.Reduction.AUTO:
            config.pop("reduction")
        if self.supports_bidirectional:
            config["bidirectional"] = self.bidirectional
        config.update(self.hyperparameters())
        return config


def _constructor_of(function):
    """``__init__(self, <function's hyper-parameters with their defaults>, **kwargs)``: validates them with the
    class's ``check``, passes ``**kwargs`` (``bidirectional``, ``name``, ``reduction``) to :class:`RetrievalLoss`
    and stores each hyper-parameter under its own name (which ``hyperparameters`` and ``get_config`` read)."""
    parameters = list(inspect.signature(function).parameters.values())[2:]  # after (relevance, scores)
    signature = inspect.Signature(
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in parameters),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
    )

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        hyper = {p.name: bound.arguments[p.name] for p in parameters}
        check = type(self).check
        if check is not None:
            values = check(**hyper, owner=type(self).__name__)
            hyper = values if isinstance(values, dict) else dict(zip(hyper, values, strict=True))
        RetrievalLoss.__init__(self, **bound.arguments["kwargs"])
        for key, value in hyper.items():
            setattr(self, key, value)

    __init__.__signature__ = signature
    __init__.from_function = True
    __init__.__doc__ = f"The hyper-parameters of ``{function.__name__}`` (its signature and defaults)."
    return __init__


__all__ = [
    "IGNORED",
    "IRRELEVANT",
    "RELEVANT",
    "RetrievalLoss",
    "mean_over_positives",
    "register",
    "validate_similarity_inputs",
]

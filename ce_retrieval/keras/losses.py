"""Keras 3 versions of the registered losses, generated from the registry (no second copy of any equation).

For every loss class of the package in the registry (``ce_retrieval.losses.available()``, tf_keras
``RetrievalLoss`` subclasses) this module builds a ``keras.losses.Loss`` subclass of the same name, with the same
constructor arguments and defaults, registered for Keras 3 serialisation as ``ce_retrieval>ClassName``. An
instance holds an instance of the tf_keras class and computes through its ``call``: the same validation, float32
computation, ``bidirectional`` averaging and functional core (docs/losses.md). ``keras3_class(MyLoss)`` does the
same for a user's own registered ``RetrievalLoss``. Only the Keras plumbing differs:

* ``y_true`` is the relevance matrix ``[N, M]`` (1 positive, 0 negative, -1 ignored), or integer (or string)
  ids of shape ``[N]`` or ``[N, 1]`` with a square ``S``: then ``R[i, j] = (id_i == id_j)``, the diagonal set
  to -1 (ignored) for a loss that ``needs_gram`` (S = E Eᵀ, where the diagonal is a self-pair). The ids are
  compared before Keras casts ``y_true`` to float32; ids that arrive as floats compare exactly below 2^24.
  A rank-2 ``y_true`` with one column is read as ids unless ``S`` is known to have one column.
* ``reduction`` keeps Keras 3's values (default ``"sum_over_batch_size"``): the value is one scalar, so every
  reduction returns it unchanged, and under a ``tf.distribute`` strategy ``"sum_over_batch_size"`` / ``"mean"``
  divide it by ``num_replicas_in_sync`` (as ``AUTO`` does for the tf_keras classes); ``"sum"`` leaves the
  replica scaling to the caller.
* Computation is float32 whatever the dtype policy; ``sample_weight`` is refused (mark pairs -1 instead).
* The TensorFlow backend is required (``RuntimeError`` naming the active backend otherwise).

Every registered loss has a Keras 3 class. ``AngularSoftmax`` anneals its λ from a step variable that
:class:`ce_retrieval.keras.callbacks.AnnealingStepCallback` keeps equal to ``optimizer.iterations`` (pass it to
``fit``, as with the tf_keras class). Every loss works as a plain
Keras 3 loss; the proxy losses (``ProxyNCALoss``, ``ProxyAnchorLoss``, ``SoftTripleLoss``,
``CentroidUpperBoundLoss``) expect ``S = cos(E, proxies)`` and the matching relevance
(``ce_retrieval.modeling.proxies.proxy_relevance``), but the ``ProxySimilarity`` layer that owns the proxies is a
tf_keras layer, so a Keras 3 model supplies its own proxy weights; ``AngularLoss`` needs the Gram matrix
``S = E Eᵀ`` of one embedding set (``SimilarityMatrix()([e, e])``).
"""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf

from ce_retrieval import losses as _tf_keras_losses
from ce_retrieval.keras._backend import require_tensorflow_backend
from ce_retrieval.losses.relevance import relevance_from_ids

#: Registered losses without a Keras 3 class, with the reason (none today; kept for a user's own registered losses).
EXCLUDED: dict[str, str] = {}

#: the declared capabilities copied from the tf_keras class (docs/losses.md, "Declared capabilities")
_CAPABILITIES = ("supports_bidirectional", "has_logit_scale", "has_logit_bias", "needs_gram", "needs_proxies")


class RetrievalLoss(keras.losses.Loss):
    """Keras 3 adapter around one tf_keras ``RetrievalLoss`` class (``tf_keras_class``); see module docstring."""

    #: the tf_keras class whose ``call`` computes the value; set by :func:`keras3_class`.
    tf_keras_class: type | None = None

    def __init__(self, *args, **kwargs):
        if self.tf_keras_class is None:
            raise TypeError("RetrievalLoss is the adapter base; use a generated class such as CrossExampleSoftmax")
        require_tensorflow_backend(type(self).__name__)
        signature = inspect.signature(type(self).__init__)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {}
        for key, value in list(bound.arguments.items())[1:]:  # less self
            kind = signature.parameters[key].kind
            arguments.update(value if kind is inspect.Parameter.VAR_KEYWORD else {key: value})
        reduction = arguments.pop("reduction")
        self._core = self.tf_keras_class(**arguments)  # validates the hyper-parameters with the class's messages
        super().__init__(name=self._core.name, reduction=reduction, dtype="float32")

    @property
    def core(self) -> _tf_keras_losses.RetrievalLoss:
        """The tf_keras loss instance this loss computes through."""
        return self._core

    def hyperparameters(self) -> dict:
        """``{argument: value}`` of the hyper-parameters (as the tf_keras class)."""
        return self._core.hyperparameters()

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(
                f"{self.name}: sample_weight is not supported by similarity-matrix losses; "
                "mark pairs as ignored (-1) in y_true instead"
            )
        return super().__call__(self.relevance(y_true, y_pred), y_pred)

    def relevance(self, y_true, y_pred) -> tf.Tensor:
        """``y_true`` itself when it is a relevance matrix; the ``[N, N]`` relevance of ids ``[N]`` / ``[N, 1]``."""
        y_true, y_pred = tf.convert_to_tensor(y_true), tf.convert_to_tensor(y_pred)
        rank, columns = y_true.shape.rank, y_pred.shape[-1] if y_pred.shape.rank else None
        if not (rank == 1 or (rank == 2 and y_true.shape[-1] == 1 and columns != 1)):
            return y_true
        ids = tf.reshape(y_true, [-1])
        rows = y_pred.shape[0] if y_pred.shape.rank else None
        if rows is not None and columns is not None and rows != columns:
            raise ValueError(
                f"{self.name}: y_true of shape {y_true.shape} holds ids, which need a square similarity matrix "
                f"(R[i, j] = id_i == id_j); got y_pred of shape {y_pred.shape}. Pass a relevance matrix instead."
            )
        if y_pred.shape.rank == 2:
            tf.debugging.assert_equal(
                tf.shape(y_pred),
                tf.stack([tf.size(ids), tf.size(ids)]),
                message=f"{self.name}: ids in y_true need a square [N, N] similarity matrix",
            )
        return relevance_from_ids(ids, ids, exclude_self=self.tf_keras_class.needs_gram)

    @tf.autograph.experimental.do_not_convert
    def call(self, y_true, y_pred) -> tf.Tensor:
        value = self._core.call(y_true, y_pred)
        # One scalar; shape [1] lets Keras's reduction scale it for replicas like the tf_keras classes' AUTO.
        return value if self.reduction in (None, "none") else tf.reshape(value, [1])

    def get_config(self) -> dict:
        config = self._core.get_config()
        config.pop("reduction", None)
        return {**config, "reduction": self.reduction}


def _signature(core: type) -> inspect.Signature:
    """``core``'s constructor signature, with ``bidirectional`` (where supported), ``name`` and Keras 3's
    ``reduction`` added as keyword-only arguments when ``core`` only takes them through ``**kwargs``."""
    parameters = list(inspect.signature(core.__init__).parameters.values())
    variadic = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    parameters = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in parameters}
    extra = {"bidirectional": False, "name": None} if core.supports_bidirectional else {"name": None}
    for key, default in extra.items():
        if key not in names:
            parameters.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default))
    parameters = [p.replace(default="sum_over_batch_size") if p.name == "reduction" else p for p in parameters]
    if "reduction" not in names:
        parameters.append(inspect.Parameter("reduction", inspect.Parameter.KEYWORD_ONLY, default="sum_over_batch_size"))
    return inspect.Signature(parameters + variadic)


def keras3_class(core: type) -> type:
    """The Keras 3 loss class (registered ``ce_retrieval>Name``) that computes through the tf_keras class ``core``."""
    signature = _signature(core)

    def __init__(self, *args, **kwargs):
        RetrievalLoss.__init__(self, *args, **kwargs)

    __init__.__signature__ = signature
    doc = f"Keras 3 ``keras.losses.Loss`` computing :class:`ce_retrieval.losses.{core.__name__}` (same arguments)."
    attributes = {
        "__init__": __init__,
        "__module__": __name__,
        "__qualname__": core.__name__,
        "__doc__": doc + "\n\n" + inspect.cleandoc(core.__doc__ or ""),
        "tf_keras_class": core,
        **{key: getattr(core, key) for key in _CAPABILITIES},
    }
    cls = type(core.__name__, (RetrievalLoss,), attributes)
    return keras.saving.register_keras_serializable(package="ce_retrieval")(cls)


def _package_losses() -> list[type]:
    """The registered classes of ``ce_retrieval.losses`` itself (not a user's, which ``keras3_class`` converts)."""
    classes = [_tf_keras_losses.lookup(name) for name in _tf_keras_losses.available() if name not in EXCLUDED]
    return [cls for cls in classes if cls.__module__.startswith("ce_retrieval.losses.")]


#: ``{class name: Keras 3 class}`` for every loss of the package not in :data:`EXCLUDED`.
LOSSES: dict[str, type] = {cls.__name__: keras3_class(cls) for cls in _package_losses()}


def available() -> list[str]:
    """The names of the Keras 3 loss classes, sorted."""
    return sorted(LOSSES)


def get(identifier, **kwargs) -> keras.losses.Loss:
    """A Keras 3 loss from a registered name or alias (``'cross_example_softmax'``), or an instance (as is)."""
    if isinstance(identifier, keras.losses.Loss):
        return identifier
    name = _tf_keras_losses.lookup(identifier).__name__
    if name not in LOSSES:
        raise ValueError(f"{name} has no Keras 3 class: {EXCLUDED[name]}")
    return LOSSES[name](**kwargs)


globals().update(LOSSES)

__all__ = ["EXCLUDED", "LOSSES", "RetrievalLoss", "available", "get", "keras3_class", *sorted(LOSSES)]

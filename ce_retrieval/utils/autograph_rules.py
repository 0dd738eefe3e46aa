"""Autograph leaves the towers' graph-ready libraries as they are: keras-cv, tensorflow-text, tf-models-official
and dm-tree, as TensorFlow already leaves its own packages, keras and tf_keras.

Why. Inside a ``tf.function`` (Keras's train step, an export's signatures, a ``tf.data`` map), autograph rewrites
every Python function it meets so that Python ``if`` / ``for`` / ``while`` on tensors become graph control flow.
These libraries are written for graphs: their layers branch on Python values and loop with TensorFlow ops.
Rewriting them changes nothing, but it costs CPU. Building and training a tiny two-tower model rewrites about 220 of
their functions. That takes about 6 s of CPU in every process that builds, trains or exports a model (measured:
keras-cv 2.5 s, tensorflow-text 1.5 s, tf-models-official 1.1 s, dm-tree 0.6 s), a third of a short training
process.

Safety. A function left unconverted runs as written. Had one of them branched on a tensor, the trace would fail
loudly (``OperatorNotAllowedInGraphError``) rather than compute something else. Our own code (``ce_retrieval``) is
still converted.

The rules are TensorFlow's own mechanism (``autograph.core.config.CONVERSION_RULES``, the list that holds
``DoNotConvert('keras')``); it has no public setter, so the pinned TensorFlow's is extended here, once per process,
when a tower is built.
"""

from __future__ import annotations

from tensorflow.python.autograph.core import config as _autograph_config

__all__ = ["GRAPH_READY_LIBRARIES", "leave_graph_ready_libraries_unconverted"]

GRAPH_READY_LIBRARIES = ("keras_cv", "tensorflow_text", "official", "tree")
_RULES = tuple(_autograph_config.DoNotConvert(name) for name in GRAPH_READY_LIBRARIES)


def leave_graph_ready_libraries_unconverted() -> None:
    """Put the ``DoNotConvert`` rules for :data:`GRAPH_READY_LIBRARIES` ahead of TensorFlow's own (idempotent)."""
    rules = tuple(_autograph_config.CONVERSION_RULES)
    missing = tuple(rule for rule in _RULES if rule not in rules)
    if missing:
        _autograph_config.CONVERSION_RULES = missing + rules

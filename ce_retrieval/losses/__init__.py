"""Keras losses on a similarity matrix S [N, M] and a relevance matrix in {-1, 0, 1} (shared/spec/losses.md).

One family per module (``softmax.py``, ``triplet.py``, ...). Every module of this package is imported here
and the names in its ``__all__`` are re-exported, so ``from ce_retrieval.losses import CrossExampleSoftmax``
works for every class and ``ce_retrieval.losses.get('cross_example_softmax')`` finds it by name.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from ce_retrieval.losses.base import RetrievalLoss, mean_over_positives, validate_similarity_inputs
from ce_retrieval.losses.registry import available, get
from ce_retrieval.losses.relevance import relevance_from_ids

__all__ = [
    "RetrievalLoss",
    "available",
    "get",
    "mean_over_positives",
    "relevance_from_ids",
    "validate_similarity_inputs",
]

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("_") or _info.name in {"base", "registry", "relevance"}:
        continue
    _module = _importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_module, "__all__", []):
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)

"""Datasets: the embedded synthetic image-caption set and loaders for real formats (see ``schema.py``)."""
from ce_retrieval.data.api import *  # noqa: F403
from ce_retrieval.data.api import __all__ as _api_all
from ce_retrieval.data.pk_sampler import pk_sample, pk_sampler
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, RetrievalSplit

__all__ = ["CAPTION", "IMAGE", "IMAGE_ID", "RetrievalSplit", "pk_sample", "pk_sampler", *_api_all]

"""Datasets: the embedded synthetic image-caption set and loaders for real formats (see ``schema.py``)."""
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, RetrievalSplit

__all__ = ["CAPTION", "IMAGE", "IMAGE_ID", "RetrievalSplit"]

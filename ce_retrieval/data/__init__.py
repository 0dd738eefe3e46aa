"""Datasets: the embedded synthetic image-caption set and loaders for real formats (see ``schema.py``)."""
from ce_retrieval.data.config import DataConfig
from ce_retrieval.data.pipeline import load_examples, load_retrieval_split, train_pipeline, vocab_path_for
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, RetrievalSplit

__all__ = [
    "CAPTION",
    "IMAGE",
    "IMAGE_ID",
    "DataConfig",
    "RetrievalSplit",
    "load_examples",
    "load_retrieval_split",
    "train_pipeline",
    "vocab_path_for",
]

"""Public data API (re-exported by ``ce_retrieval.data``)."""
from ce_retrieval.data.config import DataConfig, SplitPaths
from ce_retrieval.data.pipeline import load_examples, load_retrieval_split, train_pipeline, vocab_path_for
from ce_retrieval.data.synthetic import distractor_images

__all__ = [
    "DataConfig",
    "SplitPaths",
    "distractor_images",
    "load_examples",
    "load_retrieval_split",
    "train_pipeline",
    "vocab_path_for",
]

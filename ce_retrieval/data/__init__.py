"""Datasets: the embedded synthetic image-caption set and loaders for real formats (see ``schema.py``)."""

from ce_retrieval.data.config import DataConfig, SplitPaths
from ce_retrieval.data.export import export_synthetic
from ce_retrieval.data.pipeline import (
    load_examples,
    load_report,
    load_retrieval_split,
    train_pipeline,
    training_captions,
    vocab_path_for,
)
from ce_retrieval.data.pk_sampler import pk_sample, pk_sampler
from ce_retrieval.data.report import DataError, LoadReport
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, PIXELS, RetrievalSplit
from ce_retrieval.data.synthetic import distractor_images
from ce_retrieval.data.tfrecords import FEATURE_SPEC, read_tfrecords, write_tfrecords
from ce_retrieval.data.vocab import build_vocab, read_vocab, write_vocab

__all__ = [
    "CAPTION",
    "FEATURE_SPEC",
    "IMAGE",
    "IMAGE_ID",
    "PIXELS",
    "DataConfig",
    "DataError",
    "LoadReport",
    "RetrievalSplit",
    "SplitPaths",
    "build_vocab",
    "distractor_images",
    "export_synthetic",
    "load_examples",
    "load_report",
    "load_retrieval_split",
    "pk_sample",
    "pk_sampler",
    "read_tfrecords",
    "read_vocab",
    "train_pipeline",
    "training_captions",
    "vocab_path_for",
    "write_tfrecords",
    "write_vocab",
]

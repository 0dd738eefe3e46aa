"""Dataset configuration: which image-caption set to read and how (plain, YAML-able dataclasses).

``DataConfig.name`` picks the source:

* ``synthetic`` — the embedded, procedurally generated set (:mod:`ce_retrieval.data.synthetic`), the default;
* ``karpathy``  — Flickr30k / COCO images with a Karpathy-split ``dataset_*.json`` index;
* ``cc_tsv``    — Conceptual-Captions-style TSV files (caption, image path or URL), one per split;
* ``tfrecord``  — TFRecord shards written by :func:`ce_retrieval.data.tfrecords.write_tfrecords`.

Every field is a str / int / float / bool / None or a nested dataclass of those, so the experiment config can
be read from YAML with unknown keys rejected. Split-specific paths live in :class:`SplitPaths`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ce_retrieval.utils.dataclass_yaml import from_dict

SOURCES = ("synthetic", "karpathy", "cc_tsv", "tfrecord")
SPLITS = ("train", "val", "test")


@dataclasses.dataclass
class SplitPaths:
    """One path (file, or glob pattern for TFRecord shards) per split; ``None`` if the split is absent."""

    train: str | None = None
    val: str | None = None
    test: str | None = None

    def get(self, split: str) -> str:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        path = getattr(self, split)
        if not path:
            raise ValueError(f"no path configured for split {split!r}")
        return path


@dataclasses.dataclass
class DataConfig:
    """Where the image-caption examples come from. See the module docstring for the sources."""

    name: str = "synthetic"

    # Synthetic set (ce_retrieval.data.synthetic).
    image_size: int = 64
    num_train_images: int = 3000
    num_val_images: int = 500
    num_test_images: int = 500
    captions_per_image: int = 5
    seed: int = 0
    near_duplicate_fraction: float = 0.1  # share of images re-rendered from an earlier image's scene
    cache_dir: str | None = None  # TFRecord cache of generated splits, keyed by the config fingerprint

    # Karpathy split JSON (Flickr30k / COCO).
    karpathy_json: str | None = None
    image_root: str | None = None  # images are image_root/[filepath/]filename
    restval_to_train: bool = True  # COCO "restval" images join the training split

    # Conceptual Captions TSV: "caption<TAB>image" rows; image is a path under tsv_image_root or a URL whose
    # local file is named sha1(url) (with any extension of .jpg/.jpeg/.png/none) under tsv_image_root.
    tsv_path: SplitPaths = dataclasses.field(default_factory=SplitPaths)
    tsv_image_root: str | None = None
    tsv_header: bool = False  # first row is a header and is skipped
    tsv_image_id: str = "row"  # "row": the row index; "hash": a 63-bit hash of the image path (dedups images)

    # TFRecord shards (glob patterns per split).
    tfrecord_pattern: SplitPaths = dataclasses.field(default_factory=SplitPaths)

    # Shared.
    skip_corrupt: bool = True  # count and skip bad rows/images (else fail naming the file/row)
    validate_images: bool = True  # decode every image once at scan time (Python-side loaders)
    shuffle_buffer: int = 50_000  # upper bound; small sets are shuffled fully
    vocab_path: str | None = None  # given WordPiece vocab; else one is built from the training captions
    vocab_size: int = 8000

    def __post_init__(self):
        # Nested mappings (e.g. from ``dataclasses.asdict``) are built by the one config-from-dict, strictly.
        if isinstance(self.tsv_path, dict):
            self.tsv_path = from_dict(SplitPaths, self.tsv_path, "tsv_path")
        if isinstance(self.tfrecord_pattern, dict):
            self.tfrecord_pattern = from_dict(SplitPaths, self.tfrecord_pattern, "tfrecord_pattern")
        if self.name not in SOURCES:
            raise ValueError(f"DataConfig.name must be one of {SOURCES}, got {self.name!r}")
        if self.tsv_image_id not in ("row", "hash"):
            raise ValueError(f"DataConfig.tsv_image_id must be 'row' or 'hash', got {self.tsv_image_id!r}")
        if self.image_size < 16:
            raise ValueError(f"DataConfig.image_size must be >= 16, got {self.image_size}")
        if self.captions_per_image < 1:
            raise ValueError(f"DataConfig.captions_per_image must be >= 1, got {self.captions_per_image}")
        if not 0.0 <= self.near_duplicate_fraction < 1.0:
            raise ValueError(
                f"DataConfig.near_duplicate_fraction must be in [0, 1), got {self.near_duplicate_fraction}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """A short hash of the fields that determine the examples (not of shuffling/caching/vocab settings)."""
        ignored = {"cache_dir", "shuffle_buffer", "vocab_path", "vocab_size"}
        data = {k: v for k, v in self.to_dict().items() if k not in ignored}
        return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

"""Input pipelines: examples of any configured source as ``tf.data`` and whole splits for retrieval evaluation.

``load_examples`` yields one unbatched ``{"caption", "image", "image_id"}`` dict per caption (schema.py).
``train_pipeline`` shuffles (seeded), repeats, batches with ``drop_remainder=True`` and prefetches. Two captions
of one image may share a batch; the relevance matrix is built from ``image_id``, so they count as positives.

The training pipeline runs without tf.data's autotuning thread (``Options.autotune.enabled = False``). That thread
re-optimises after waits of 10 ms, 20 ms, 40 ms, ... (doubling up to 60 s), and on busy cores destroying the
iterator sometimes waits for the current wait to run out: a 500-step training (about 45 s) then ended at 82 s
(``python -m benchmarks.scale.iterator_teardown``). The map's ``AUTOTUNE`` parallelism falls back to the number of
cores and ``prefetch(AUTOTUNE)`` keeps its own buffer tuning, so no knob of these pipelines is lost; the order of
the examples never depended on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from ce_retrieval.data import synthetic
from ce_retrieval.data.config import SPLITS, DataConfig
from ce_retrieval.data.report import LoadReport
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, PIXELS, RetrievalSplit
from ce_retrieval.utils.atomic import atomic_path


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def _indexed_dataset(captions, caption_image_index, images, image_ids, decode=None) -> tf.data.Dataset:
    """Captions with the index of their image; image bytes are gathered from one table (stored once). With
    ``decode``, the table is decoded once, in parallel, and examples gather ``"pixels"`` instead of bytes."""
    id_table = tf.constant(np.asarray(image_ids, np.int64), tf.int64)
    base = tf.data.Dataset.from_tensor_slices(
        (tf.constant(captions, tf.string), tf.constant(np.asarray(caption_image_index, np.int64), tf.int64))
    )
    if decode is None or _decoded_bytes(images, decode) > DECODE_ONCE_MAX_BYTES:
        key, table = IMAGE, tf.constant(images, tf.string)  # decoded per example by train_pipeline, if at all
    else:
        key, table = PIXELS, _decode_table(images, decode)
    return base.map(
        lambda caption, index: {
            CAPTION: caption,
            key: tf.gather(table, index),
            IMAGE_ID: tf.gather(id_table, index),
        },
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


# An in-memory source's images are decoded once only while the decoded table stays this small (the demo's 3,000
# training images at 64 px take 147 MB as float32); a larger one is decoded per example, after the shuffle.
DECODE_ONCE_MAX_BYTES = 1 << 30


def _decoded_bytes(images, decode) -> int:
    """Bytes of every image decoded: ``len(images)`` × the size of ``decode``'s output (traced, not run)."""
    if not len(images):
        return 0
    spec = tf.data.Dataset.from_tensor_slices(tf.constant(images[:1], tf.string)).map(decode).element_spec
    return len(images) * spec.shape.num_elements() * spec.dtype.size


def _decode_table(images, decode) -> tf.Tensor:
    """``decode`` over every encoded image, in parallel tf.data threads: one tensor [N, ...] in the images' order."""
    if not len(images):
        raise ValueError("no images to decode")
    decoded = tf.data.Dataset.from_tensor_slices(tf.constant(images, tf.string))
    decoded = decoded.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return decoded.batch(len(images)).get_single_element()


def _synthetic_split(cfg: DataConfig, split: str):
    if cfg.cache_dir:
        from ce_retrieval.data import synthetic_cache

        return synthetic_cache.load_or_generate(cfg, split)
    return synthetic.split_from_config(cfg, split)


def load_examples(
    cfg: DataConfig, split: str, decode: Callable[[tf.Tensor], tf.Tensor] | None = None
) -> tf.data.Dataset:
    """Unbatched ``{"caption": string, "image": string (PNG/JPEG bytes), "image_id": int64}``, one per caption.

    ``decode``: where a source holds its images in memory (the synthetic set), they are decoded once up front and
    the examples carry ``"pixels"`` instead of bytes, while the decoded table stays within ``DECODE_ONCE_MAX_BYTES``;
    otherwise, and for streamed sources, the bytes stay (``train_pipeline`` decodes them per example)."""
    _check_split(split)
    if cfg.name == "synthetic":
        data = _synthetic_split(cfg, split)
        captions, _, index = data.flat_captions()
        return _indexed_dataset(captions, index, data.images, data.image_ids, decode=decode)
    from ce_retrieval.data import sources

    return sources.load_examples(cfg, split)


def train_pipeline(
    cfg: DataConfig,
    split: str,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    repeat: bool = True,
    decode: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> tf.data.Dataset:
    """Batches of ``batch_size`` examples (``drop_remainder=True``), shuffled with ``seed``, repeated, prefetched.

    ``decode`` (the image tower's decoder, e.g. ``functools.partial(modeling.decode_image, image_size=S)``) turns
    each example's ``"image"`` bytes into ``"pixels"`` in parallel tf.data threads (an in-memory source's images
    once, up front; a streamed source's per example, after the shuffle), so that the train step gets decoded batches
    instead of decoding them one by one in a loop of its own graph.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dataset = load_examples(cfg, split, decode=decode)
    cardinality = int(dataset.cardinality())
    if cardinality >= 0 and cardinality < batch_size and not repeat:
        raise ValueError(f"split {split!r} has {cardinality} examples, fewer than one batch of {batch_size}")
    if shuffle:
        buffer = cfg.shuffle_buffer if cardinality < 0 else max(1, min(cfg.shuffle_buffer, cardinality))
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if decode is not None and PIXELS not in dataset.element_spec:  # after the shuffle: it buffers bytes, not pixels
        dataset = dataset.map(
            lambda ex: {**{k: v for k, v in ex.items() if k != IMAGE}, PIXELS: decode(ex[IMAGE])},
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    options = tf.data.Options()
    options.autotune.enabled = False  # no optimisation thread whose timed wait can hold up teardown (module doc)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE).with_options(options)


def load_retrieval_split(cfg: DataConfig, split: str) -> RetrievalSplit:
    """All captions (queries) and unique images (documents) of a split, for evaluation."""
    _check_split(split)
    if cfg.name == "synthetic":
        data = _synthetic_split(cfg, split)
        captions, caption_ids, _ = data.flat_captions()
        return RetrievalSplit(captions, caption_ids, list(data.images), data.image_ids, name=f"synthetic/{split}")
    from ce_retrieval.data import sources

    return sources.load_retrieval_split(cfg, split)


def training_captions(cfg: DataConfig) -> list[str]:
    """Every caption of the training split (the corpus a vocabulary is learned from)."""
    if cfg.name == "synthetic":
        return _synthetic_split(cfg, "train").flat_captions()[0]
    from ce_retrieval.data import sources

    return sources.training_captions(cfg)


def vocab_path_for(cfg: DataConfig, workdir: str) -> str:
    """Path of ``workdir/vocab.txt``: a copy of ``cfg.vocab_path`` if given, else learned from the training
    captions (deterministic for a given config). An existing ``workdir/vocab.txt`` is reused."""
    from ce_retrieval.data import vocab

    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "vocab.txt")
    if os.path.exists(path):
        vocab.read_vocab(path)
        return path
    if cfg.vocab_path:
        vocab.read_vocab(cfg.vocab_path)
        if os.path.abspath(cfg.vocab_path) != os.path.abspath(path):
            with atomic_path(path) as tmp:  # a crash mid-copy must not leave a partial vocab to be reused
                tf.io.gfile.copy(cfg.vocab_path, tmp, overwrite=True)
        return path
    tokens = vocab.build_vocab(training_captions(cfg), vocab_size=cfg.vocab_size)
    return vocab.write_vocab(tokens, path)


def load_report(cfg: DataConfig, split: str) -> LoadReport:
    """The :class:`~ce_retrieval.data.report.LoadReport` of a real-format split (rows read, skipped and why).
    The synthetic set has no bad rows; its report counts its examples and images."""
    _check_split(split)
    if cfg.name == "synthetic":
        from ce_retrieval.data.report import LoadReport

        data = _synthetic_split(cfg, split)
        n = sum(len(c) for c in data.captions)
        return LoadReport(source="synthetic", split=split, rows=n, examples=n, images=len(data.images))
    from ce_retrieval.data import sources

    return sources.load_report(cfg, split)

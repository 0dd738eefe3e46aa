"""Input pipelines: one ``tf.data`` contract for every source (see ``schema.py``).

``load_examples`` gives unbatched ``{caption, image, image_id}`` elements (one per caption); ``train_pipeline``
shuffles (seeded), repeats and batches them with ``drop_remainder=True`` (a fixed global batch for
``tf.distribute``); ``load_retrieval_split`` gives a whole split for evaluation; ``vocab_path_for`` the text
tower's WordPiece vocab. Two captions of one image can land in the same batch: the train step builds the
relevance matrix from ``image_id``, so they are both positives of that image, never negatives.
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, RetrievalSplit


def _source_split(cfg, split: str):
    """(captions [N], caption image ids [N], images [M] bytes, image ids [M]) of a split of any source."""
    if cfg.name == "synthetic":
        from ce_retrieval.data.synthetic import split_from_config

        s = split_from_config(cfg, split)
        captions, caption_ids, _ = s.flat_captions()
        return captions, caption_ids, s.images, s.image_ids
    from ce_retrieval.data import loaders  # real formats (Karpathy JSON, CC TSV, TFRecords)

    return loaders.load_source_split(cfg, split)


def load_retrieval_split(cfg, split: str) -> RetrievalSplit:
    captions, caption_ids, images, image_ids = _source_split(cfg, split)
    return RetrievalSplit(list(captions), caption_ids, list(images), image_ids, name=split)


def load_examples(cfg, split: str) -> tf.data.Dataset:
    """Unbatched ``{"caption", "image", "image_id"}`` elements, one per caption, in a fixed order."""
    if cfg.name == "tfrecord":
        from ce_retrieval.data import loaders

        return loaders.tfrecord_examples(cfg, split)
    captions, caption_ids, images, image_ids = _source_split(cfg, split)
    if len(captions) == 0:
        raise ValueError(f"split {split!r} of the {cfg.name} dataset has no captions")
    row_of_id = {int(i): r for r, i in enumerate(np.asarray(image_ids))}
    missing = [int(i) for i in caption_ids if int(i) not in row_of_id]
    if missing:
        raise ValueError(f"{len(missing)} captions of split {split!r} refer to images that are not loaded (e.g. id {missing[0]})")
    rows = np.asarray([row_of_id[int(i)] for i in caption_ids], np.int64)
    image_table = tf.constant(list(images), dtype=tf.string)
    ds = tf.data.Dataset.from_tensor_slices(
        {CAPTION: tf.constant(list(captions), tf.string), "row": rows, IMAGE_ID: np.asarray(caption_ids, np.int64)}
    )
    return ds.map(
        lambda e: {CAPTION: e[CAPTION], IMAGE: tf.gather(image_table, e["row"]), IMAGE_ID: e[IMAGE_ID]},
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def train_pipeline(cfg, split: str, batch_size: int, seed: int = 0, shuffle: bool = True, repeat: bool = True):
    """Batched (``drop_remainder=True``), shuffled with ``seed``, repeated, prefetched."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ds = load_examples(cfg, split)
    if shuffle:
        size = int(tf.data.experimental.cardinality(ds).numpy())
        buffer = cfg.shuffle_buffer if size < 0 else max(1, min(size, cfg.shuffle_buffer))
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def vocab_path_for(cfg, workdir: str) -> str:
    """``cfg.vocab_path`` if given, else a WordPiece vocab built from the training captions into ``workdir``."""
    if cfg.vocab_path:
        if not os.path.exists(cfg.vocab_path):
            raise FileNotFoundError(f"data.vocab_path {cfg.vocab_path} does not exist")
        return cfg.vocab_path
    from ce_retrieval.data.vocab import build_wordpiece_vocab, write_vocab

    path = os.path.join(workdir, f"vocab-{cfg.fingerprint()}-{cfg.vocab_size}.txt")
    if not os.path.exists(path):
        captions, _, _, _ = _source_split(cfg, "train")
        write_vocab(build_wordpiece_vocab(captions, cfg.vocab_size), path)
    return path

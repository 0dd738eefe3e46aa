"""On-disk cache of generated synthetic splits, keyed by the data config's fingerprint.

Generating the default splits takes seconds (PIL drawing + PNG encoding of ~4,000 images); runs that start
often (CLI, tests of other subsystems, the demo) can set ``DataConfig.cache_dir`` to reuse them. A split is one
TFRecord file ``{cache_dir}/synthetic-{fingerprint}/{split}.tfrecord`` with one record per image:
``image`` (PNG bytes), ``image_id`` (int64), ``captions`` (bytes list). A cached split carries the images,
ids and captions; the generator metadata (scenes, drawn objects) exists only after a fresh generation.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from ce_retrieval.data import synthetic
from ce_retrieval.utils.atomic import atomic_path

_SPEC = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "image_id": tf.io.FixedLenFeature([], tf.int64),
    "captions": tf.io.VarLenFeature(tf.string),
}


def cache_path(cfg, split: str) -> str:
    return os.path.join(cfg.cache_dir, f"synthetic-{cfg.fingerprint()}", f"{split}.tfrecord")


def _write(data: synthetic.SyntheticSplit, path: str) -> None:
    # atomic: concurrent readers never see a partial file
    with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for image, image_id, captions in zip(data.images, data.image_ids.tolist(), data.captions, strict=True):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                "image_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[image_id])),
                "captions": tf.train.Feature(bytes_list=tf.train.BytesList(value=[c.encode() for c in captions])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _read(path: str, split: str) -> synthetic.SyntheticSplit:
    images, ids, captions = [], [], []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        feats = tf.train.Example.FromString(record).features.feature
        images.append(feats["image"].bytes_list.value[0])
        ids.append(feats["image_id"].int64_list.value[0])
        captions.append([c.decode("utf-8") for c in feats["captions"].bytes_list.value])
    n = len(images)
    return synthetic.SyntheticSplit(
        split, images, np.asarray(ids, np.int64), captions, scenes=[], objects=[], duplicate_of=np.full(n, -1, np.int64)
    )


def load_or_generate(cfg, split: str) -> synthetic.SyntheticSplit:
    """The cached split if present, else generate it (memoised in-process) and write the cache."""
    path = cache_path(cfg, split)
    if os.path.exists(path):
        return _read(path, split)
    data = synthetic.split_from_config(cfg, split)
    _write(data, path)
    return data

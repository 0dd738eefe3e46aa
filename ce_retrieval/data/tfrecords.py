"""TFRecord storage of image-caption examples: a sharded writer and a validating reader.

Feature spec (one ``tf.train.Example`` per caption):

    caption:  bytes  (tf.io.FixedLenFeature([], tf.string))  UTF-8 caption
    image:    bytes  (tf.io.FixedLenFeature([], tf.string))  encoded JPEG/PNG/GIF/BMP bytes
    image_id: int64  (tf.io.FixedLenFeature([], tf.int64))   id shared by all captions of one image

Shards are named ``{prefix}-{i:05d}-of-{n:05d}``; examples are dealt round-robin. The reader validates every
record once (caption UTF-8 and non-empty, image decodable) in a Python scan, then streams the shards with
``tf.data`` and drops the bad records by (shard, index), so its :class:`LoadReport` counts are exact.
"""

from __future__ import annotations

import contextlib
import glob
from collections.abc import Iterable, Iterator

import numpy as np
import tensorflow as tf

from ce_retrieval.data.report import DataError, LoadReport, caption_problem, image_problem
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID
from ce_retrieval.utils.atomic import atomic_path

FEATURE_SPEC = {
    CAPTION: tf.io.FixedLenFeature([], tf.string),
    IMAGE: tf.io.FixedLenFeature([], tf.string),
    IMAGE_ID: tf.io.FixedLenFeature([], tf.int64),
}


def shard_paths(prefix: str, num_shards: int) -> list[str]:
    return [f"{prefix}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


def _as_bytes(value) -> bytes:
    if isinstance(value, tf.Tensor):
        value = value.numpy()
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def serialize_example(caption, image, image_id) -> bytes:
    feature = {
        CAPTION: tf.train.Feature(bytes_list=tf.train.BytesList(value=[_as_bytes(caption)])),
        IMAGE: tf.train.Feature(bytes_list=tf.train.BytesList(value=[_as_bytes(image)])),
        IMAGE_ID: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(image_id)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecords(
    examples: Iterable[dict] | tf.data.Dataset, path_pattern: str, num_shards: int = 1, validate: bool = True
) -> list[str]:
    """Write ``{"caption", "image", "image_id"}`` examples to ``num_shards`` shards named from ``path_pattern``
    (a path prefix). With ``validate`` a bad caption or image raises :class:`DataError`. Returns the shard paths."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    paths = shard_paths(path_pattern, num_shards)
    with contextlib.ExitStack() as shards:  # every shard is renamed into place only if all were written
        writers = [tf.io.TFRecordWriter(shards.enter_context(atomic_path(p))) for p in paths]
        try:
            for i, example in enumerate(examples):
                caption, image = _as_bytes(example[CAPTION]), _as_bytes(example[IMAGE])
                if validate:
                    problem = caption_problem(caption) or image_problem(image)
                    if problem:
                        raise DataError(f"write_tfrecords: example {i}: {problem}")
                writers[i % num_shards].write(serialize_example(caption, image, example[IMAGE_ID]))
        finally:
            for w in writers:
                w.close()
    return paths


def _files(pattern: str) -> list[str]:
    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {pattern!r}")
    return files


def iterate_records(pattern: str) -> Iterator[tuple[str, int, bytes]]:
    """(file, index, caption bytes, image bytes, image_id) for every parseable record, in file order; records that
    do not parse under FEATURE_SPEC yield (file, index, None, None, None)."""
    for path in _files(pattern):
        for index, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
            try:
                example = tf.train.Example.FromString(record)
                feats = example.features.feature
                caption = feats[CAPTION].bytes_list.value[0]
                image = feats[IMAGE].bytes_list.value[0]
                image_id = int(feats[IMAGE_ID].int64_list.value[0])
            except Exception:  # protobuf DecodeError, missing feature (IndexError / KeyError)
                yield path, index, None, None, None
                continue
            yield path, index, caption, image, image_id


def scan_tfrecords(
    pattern: str, split: str = "split", skip_corrupt: bool = True, validate: bool = True
) -> tuple[LoadReport, list[str]]:
    """Validate every record. Returns (report, bad keys ``"file:index"``)."""
    report = LoadReport(source=f"tfrecord {pattern}", split=split)
    bad: list[str] = []
    ids = set()
    for path, index, caption, image, image_id in iterate_records(pattern):
        report.rows += 1
        where = f"{path} record {index}"
        if caption is None:
            problem, kind = "record does not match the feature spec", "bad_rows"
        else:
            problem, kind = caption_problem(caption), "bad_rows"
            if problem is None and validate:
                problem, kind = image_problem(image), "corrupt_images"
        if problem:
            report.fail_or_count(kind, f"{where}: {problem}", skip_corrupt)
            bad.append(f"{path}:{index}")
            continue
        report.examples += 1
        ids.add(image_id)
    report.images = len(ids)
    report.log()
    return report, bad


def read_tfrecords(
    pattern: str, skip_corrupt: bool = True, validate: bool = True, split: str = "split"
) -> tuple[tf.data.Dataset, LoadReport]:
    """(dataset of unbatched examples, LoadReport). Bad records are dropped (or raise, see ``skip_corrupt``)."""
    report, bad = scan_tfrecords(pattern, split=split, skip_corrupt=skip_corrupt, validate=validate)
    files = _files(pattern)

    def records_of(path):
        return tf.data.TFRecordDataset(path).enumerate().map(lambda i, r: (path, i, r))

    dataset = tf.data.Dataset.from_tensor_slices(files).flat_map(records_of)
    if bad:
        keys = tf.constant(bad, tf.string)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, tf.ones([len(bad)], tf.int64)), default_value=0
        )

        def keep(path, index, _record):
            return tf.equal(table.lookup(tf.strings.join([path, tf.strings.as_string(index)], ":")), 0)

        dataset = dataset.filter(keep)
    dataset = dataset.map(
        lambda _p, _i, r: tf.io.parse_single_example(r, FEATURE_SPEC),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset, report


def read_all(
    pattern: str, skip_corrupt: bool = True, validate: bool = True, split: str = "split"
) -> tuple[list, np.ndarray, list, LoadReport]:
    """Every valid record in Python: (captions, image ids, {image_id: image bytes}, report)."""
    report = LoadReport(source=f"tfrecord {pattern}", split=split)
    captions, ids, images = [], [], {}
    for path, index, caption, image, image_id in iterate_records(pattern):
        report.rows += 1
        if caption is None:
            report.fail_or_count(
                "bad_rows", f"{path} record {index}: record does not match the feature spec", skip_corrupt
            )
            continue
        problem = caption_problem(caption)
        if problem:
            report.fail_or_count("bad_rows", f"{path} record {index}: {problem}", skip_corrupt)
            continue
        if image_id not in images:
            problem = image_problem(image) if validate else None
            if problem:
                report.fail_or_count("corrupt_images", f"{path} record {index}: {problem}", skip_corrupt)
                continue
            images[image_id] = image
        captions.append(caption.decode("utf-8"))
        ids.append(image_id)
        report.examples += 1
    report.images = len(images)
    report.log()
    return captions, np.asarray(ids, np.int64), images, report

"""Batch gallery embedding on Apache Beam: image records -> the exported image encoder -> checksummed shards.

What :func:`embed_gallery` does (``ce-retrieval embed-gallery`` is its command):

    source records ──> de-duplicate by image id ──> image_problem() check ──> BatchElements ──> image encoder
        ──> (shard(id), (id, embedding)) ──> GroupByKey per shard ──> two .npy files per shard ──> manifest.json

Sources (:func:`resolve_source` of :mod:`ce_retrieval.build.gallery_source`, shared with ``ce-retrieval index``):
TFRecord file patterns in the format of :mod:`ce_retrieval.data.tfrecords`
(one record per caption, so an image id repeats and is de-duplicated), a folder of .jpg/.png files (integer file
names become ids, as in ``ce-retrieval index``), or a split of a data config (Karpathy JSON / Conceptual-Captions
TSV are listed with the scanners of :mod:`ce_retrieval.data.sources`, without decoding, and the image files are
read inside the pipeline, on the workers; TFRecord configs read their pattern; the synthetic set is generated in
the driver). Each record carries its provenance (``file record i`` or the file path) for error messages.

Why a DoFn and not Beam's ``RunInference(TFModelHandlerTensor)``: that handler loads models with
``tf.keras.models.load_model`` (Keras 3 cannot load a SavedModel that way, and the library never selects Keras 2
globally), calls the model object rather than a named signature, and stacks tensors without keeping the image
ids. :class:`_EmbedBatches` instead loads the SavedModel with ``tf.saved_model.load`` (no Keras) in ``setup()``
through :class:`apache_beam.utils.shared.Shared`, so a worker process loads it once whatever its thread count,
and calls the ``serving_default`` signature on a batch of raw encoded bytes (``tf.string``).

Corrupt images (:data:`ON_CORRUPT`): every image id's bytes are checked with
:func:`ce_retrieval.data.report.image_problem` before batching (if an id has several differing records, the first
decodable one in (file, record) order is used). ``on_corrupt="skip"`` counts them (Beam counter
``corrupt_images``) and lists ``{id, source, reason}`` in the manifest; ``"fail"`` stops the pipeline with a
:class:`CorruptImageError` naming the record, the id and the reason. Unreadable files and records without the
features count the same way (their id is ``None`` when the record does not parse).

Output folder (published atomically: built in :func:`ce_retrieval.utils.atomic.temp_dir_for` and moved into place
by ``publish_directory``, so a failed or killed run leaves no partial output)::

    embeddings-00000-of-0000N.npy   float32 [n_i, d] unit vectors, rows sorted by id
    ids-00000-of-0000N.npy          int64 [n_i], ascending
    manifest.json                   FORMAT, export (dir, version, export_id, fingerprints), embedding_dim,
                                    shards [{files, count, sha256 of each .npy file}], count, corrupt, runner, ...

The shard of an id is ``splitmix64(id) mod N`` (:func:`shard_of`): the same id always lands in the same shard,
whatever the runner, worker count or input order. :func:`load_embedded_gallery` reads a folder back and verifies
it. The output folder must be on a file system the driver and every worker can see (local disk for the
DirectRunner; a shared mount for Flink/Spark clusters): object stores such as ``gs://`` have no atomic folder
rename and are rejected.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.utils.shared import Shared

from ce_retrieval.build.gallery_source import CorruptImageError, GallerySource, resolve_source
from ce_retrieval.data.report import image_problem
from ce_retrieval.data.schema import IMAGE, IMAGE_ID
from ce_retrieval.search import layout
from ce_retrieval.search.assignment import shard_of as shard_of_array
from ce_retrieval.utils import atomic

__all__ = [
    "FORMAT",
    "MANIFEST",
    "ON_CORRUPT",
    "CorruptImageError",
    "GalleryIntegrityError",
    "GallerySource",
    "direct_runner_args",
    "embed_gallery",
    "load_embedded_gallery",
    "resolve_source",
    "shard_of",
    "shard_of_ids",
    "shard_file_names",
]

FORMAT = "ce_retrieval.embedded_gallery/1"
MANIFEST = "manifest.json"
ON_CORRUPT = ("skip", "fail")
METRICS_NAMESPACE = "ce_retrieval.embed_gallery"
_CORRUPT = "corrupt"
_CORRUPT_FILE = ".corrupt.json"  # written by the pipeline into the temporary folder; merged into the manifest

logger = logging.getLogger("ce_retrieval.serving")


class GalleryIntegrityError(ValueError):
    """An embedded-gallery folder whose files do not match its manifest (checksum, shape, duplicate ids)."""


# ---------------------------------------------------------------------------------------------------- sharding
def shard_of_ids(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard of each id (int64 [n]): :func:`ce_retrieval.search.assignment.shard_of`, the sharded index's rule."""
    return shard_of_array(np.reshape(np.asarray(ids, dtype=np.int64), -1), num_shards)


def shard_of(image_id: int, num_shards: int) -> int:
    """Shard of one id (see :func:`shard_of_ids`)."""
    return int(shard_of_array([int(image_id)], num_shards)[0])


def shard_file_names(shard: int, num_shards: int) -> dict[str, str]:
    """``{"embeddings": "embeddings-0000s-of-0000N.npy", "ids": "ids-0000s-of-0000N.npy"}``."""
    suffix = f"{shard:05d}-of-{num_shards:05d}.npy"
    return {"embeddings": f"embeddings-{suffix}", "ids": f"ids-{suffix}"}


def _shard_info_file(shard: int, num_shards: int) -> str:
    return f".shard-{shard:05d}-of-{num_shards:05d}.json"


# ------------------------------------------------------------------------------------------------- transforms
_OBJECT_ADDRESS = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


class _PolicyDoFn(beam.DoFn):
    """A DoFn that meets corrupt records with the ``on_corrupt`` policy: raise, or count and tag them."""

    def __init__(self, on_corrupt: str):
        self.on_corrupt = on_corrupt
        self.corrupt_counter = Metrics.counter(METRICS_NAMESPACE, "corrupt_images")

    def corrupt(self, image_id: int | None, where: str, reason: str) -> beam.pvalue.TaggedOutput:
        reason = _OBJECT_ADDRESS.sub("<bytes>", reason)  # PIL names the BytesIO by address: keep manifests stable
        if self.on_corrupt == "fail":
            raise CorruptImageError(
                f"corrupt gallery image: id {image_id} in {where}: {reason} (on_corrupt='skip' skips such images)"
            )
        self.corrupt_counter.inc()
        return beam.pvalue.TaggedOutput(_CORRUPT, {"id": image_id, "source": where, "reason": reason})


class _ReadTFRecordFile(_PolicyDoFn):
    """TFRecord file -> (image_id, ((file, index), "file record i", image bytes)) per record."""

    def __init__(self, on_corrupt: str):
        super().__init__(on_corrupt)
        self.records = Metrics.counter(METRICS_NAMESPACE, "records_read")

    def process(self, path: str) -> Iterator:
        import tensorflow as tf

        index = -1
        try:
            for index, raw in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
                self.records.inc()
                where = f"{path} record {index}"
                image_id = None
                try:
                    feats = tf.train.Example.FromString(raw).features.feature
                    image_id = int(feats[IMAGE_ID].int64_list.value[0])
                    data = bytes(feats[IMAGE].bytes_list.value[0])
                except Exception as exc:  # protobuf DecodeError, a missing feature (KeyError / IndexError)
                    yield self.corrupt(image_id, where, f"record lacks an {IMAGE!r} or {IMAGE_ID!r} feature ({exc!r})")
                    continue
                yield image_id, ((path, index), where, data)
        except tf.errors.OpError as exc:  # truncated or corrupted file: the records before it were read
            yield self.corrupt(None, f"{path} after record {index}", f"unreadable TFRecord file ({exc.message})")


class _ReadImageFile(_PolicyDoFn):
    """(image_id, path) -> (image_id, ((path, 0), path, file bytes)); tf.io.gfile also reads gs:// paths."""

    def process(self, element: tuple[int, str]) -> Iterator:
        import tensorflow as tf

        image_id, path = element
        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                data = f.read()
        except (OSError, tf.errors.OpError) as exc:
            yield self.corrupt(image_id, path, f"cannot read the image file ({exc})")
            return
        yield image_id, ((path, 0), path, data)


class _DistinctImages(beam.CombineFn):
    """Per image id: its distinct byte strings, each with the first (file, record) naming it, in that order.

    The captions of one image repeat the same bytes, so the accumulator usually holds one entry, and combiner
    lifting drops the repeats before the shuffle."""

    def create_accumulator(self) -> dict:
        return {}

    @staticmethod
    def _keep(acc: dict, record: tuple) -> None:
        digest = hashlib.blake2b(record[2], digest_size=16).digest()
        if digest not in acc or record[0] < acc[digest][0]:
            acc[digest] = record

    def add_input(self, acc: dict, record: tuple) -> dict:
        self._keep(acc, record)
        return acc

    def merge_accumulators(self, accumulators: Iterable[dict]) -> dict:
        merged: dict = {}
        for acc in accumulators:
            for record in acc.values():
                self._keep(merged, record)
        return merged

    def extract_output(self, acc: dict) -> list:
        return sorted(acc.values(), key=lambda record: record[0])


class _CheckImage(_PolicyDoFn):
    """(image_id, [records]) -> (image_id, where, bytes) of the first decodable record, else a corrupt entry."""

    def process(self, element: tuple[int, list]) -> Iterator:
        image_id, records = element
        first_problem = None
        for _order, where, data in records:
            problem = image_problem(data)
            if problem is None:
                yield image_id, where, data
                return
            first_problem = first_problem or (where, problem)
        yield self.corrupt(image_id, *first_problem)


class _LoadedEncoder:
    """The image encoder SavedModel of one process (held through ``Shared``, which needs a weak-referenceable
    object); ``fresh`` is true until the first batch, so the load is counted once in a Beam counter."""

    def __init__(self, model_dir: str):
        from ce_retrieval.build.export import load_signature

        started = time.perf_counter()
        self.loaded, self.signature = load_signature(model_dir)
        self.fresh = True
        self.lock = threading.Lock()
        logger.info("loaded image encoder %s in %.1f s (pid %d)", model_dir, time.perf_counter() - started, os.getpid())

    def take_fresh(self) -> bool:
        with self.lock:
            fresh, self.fresh = self.fresh, False
            return fresh


class _EmbedBatches(_PolicyDoFn):
    """A batch of (image_id, where, bytes) -> (shard, (image_id, embedding)) per image.

    A batch the encoder rejects (an image PIL decodes but TensorFlow does not) is embedded one image at a time,
    so only the culprit meets the corrupt policy."""

    def __init__(self, model_dir: str, dim: int, num_shards: int, on_corrupt: str):
        super().__init__(on_corrupt)
        self.model_dir, self.dim, self.num_shards = model_dir, dim, num_shards
        self.shared = Shared()
        self.loads = Metrics.counter(METRICS_NAMESPACE, "model_loads")
        self.embedded = Metrics.counter(METRICS_NAMESPACE, "images_embedded")
        self.model = None

    def setup(self) -> None:
        self.model = self.shared.acquire(lambda: _LoadedEncoder(self.model_dir), tag=self.model_dir)

    def _embed(self, data: list[bytes]) -> np.ndarray:
        import tensorflow as tf

        from ce_retrieval.build.export import IMAGE_INPUT, OUTPUT

        out = self.model.signature(**{IMAGE_INPUT: tf.constant(data, dtype=tf.string)})[OUTPUT].numpy()
        if out.shape != (len(data), self.dim):
            raise ValueError(f"{self.model_dir}: expected embeddings of shape {(len(data), self.dim)}, got {out.shape}")
        return out.astype(np.float32, copy=False)

    def process(self, batch: list[tuple[int, str, bytes]]) -> Iterator:
        import tensorflow as tf

        if self.model.take_fresh():
            self.loads.inc()
        try:
            done = [(item, row) for item, row in zip(batch, self._embed([d for _, _, d in batch]), strict=True)]
        except tf.errors.InvalidArgumentError:
            done = []
            for item in batch:
                try:
                    done.append((item, self._embed([item[2]])[0]))
                except tf.errors.InvalidArgumentError as exc:
                    yield self.corrupt(item[0], item[1], f"the image encoder rejects it ({exc.message.strip()})")
        ids = np.array([item[0] for item, _ in done], dtype=np.int64)
        for (item, row), shard in zip(done, shard_of_ids(ids, self.num_shards), strict=True):
            yield int(shard), (item[0], row)
        self.embedded.inc(len(done))


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


class _WriteShard(beam.DoFn):
    """(shard, [None marker, (id, embedding), ...]) -> the shard's two .npy files (sorted by id) and a hidden JSON
    with their counts and SHA-256, in the temporary output folder. The marker makes every shard, even an empty
    one, reach this step."""

    def __init__(self, out_dir: str, num_shards: int, dim: int):
        self.out_dir, self.num_shards, self.dim = out_dir, num_shards, dim

    def process(self, element: tuple[int, Iterable]) -> Iterator[dict]:
        shard, values = element
        rows = sorted((v for v in values if v is not None), key=lambda v: v[0])
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"shard {shard}: image ids repeat after de-duplication (a bug): {ids.tolist()[:10]}")
        if rows:
            embeddings = np.stack([np.asarray(r[1], dtype=np.float32) for r in rows])
        else:
            embeddings = np.zeros((0, self.dim), np.float32)
        names = shard_file_names(shard, self.num_shards)
        digests = {}
        for kind, array in (("embeddings", embeddings), ("ids", ids)):
            data = _npy_bytes(array)
            digests[kind] = hashlib.sha256(data).hexdigest()
            atomic.atomic_write_bytes(os.path.join(self.out_dir, names[kind]), data, fsync=False)  # fsynced at publish
        info = {"shard": int(shard), "files": names, "count": len(ids), "sha256": digests}
        atomic.atomic_write_text(
            os.path.join(self.out_dir, _shard_info_file(shard, self.num_shards)), json.dumps(info), fsync=False
        )
        yield info


def _write_corrupt_list(items: list[dict], out_dir: str) -> None:
    atomic.atomic_write_text(os.path.join(out_dir, _CORRUPT_FILE), json.dumps(items), fsync=False)


def _build(pipeline: beam.Pipeline, src: GallerySource, tmp: str, model_dir: str, dim: int, cfg: dict) -> None:
    """Adds the embedding steps to ``pipeline``; they write into the temporary folder ``tmp``."""
    on_corrupt, num_shards = cfg["on_corrupt"], cfg["num_shards"]
    corrupt = []
    readers = {
        "tfrecord": ("TFRecord files", lambda: list(src.files), "Read records", _ReadTFRecordFile),
        "files": ("Image paths", lambda: list(src.items), "Read files", _ReadImageFile),
    }
    if src.kind in readers:
        inputs_label, inputs, read_label, reader = readers[src.kind]
        read = (
            pipeline
            | inputs_label >> beam.Create(inputs())
            | read_label >> beam.ParDo(reader(on_corrupt)).with_outputs(_CORRUPT, main="records")
        )
        records = read.records
        corrupt.append(read[_CORRUPT])
    elif src.kind == "memory":
        records = (
            pipeline
            | "Images" >> beam.Create([(i, ((where, 0), where, data)) for i, where, data in src.items])
            | "Count records" >> beam.Map(_count_record)
        )
    else:
        raise ValueError(f"unknown gallery source kind {src.kind!r}")
    checked = (
        records
        | "One image per id" >> beam.CombinePerKey(_DistinctImages())
        | "Check images" >> beam.ParDo(_CheckImage(on_corrupt)).with_outputs(_CORRUPT, main="valid")
    )
    corrupt.append(checked[_CORRUPT])
    embedded = (
        checked.valid
        | "Batch" >> beam.BatchElements(min_batch_size=cfg["batch_size"], max_batch_size=cfg["batch_size"])
        | "Embed"
        >> beam.ParDo(_EmbedBatches(model_dir, dim, num_shards, on_corrupt)).with_outputs(_CORRUPT, main="rows")
    )
    corrupt.append(embedded[_CORRUPT])
    markers = pipeline | "Every shard" >> beam.Create([(s, None) for s in range(num_shards)], reshuffle=False)
    _ = (
        (embedded.rows, markers)
        | "Rows and markers" >> beam.Flatten()
        | "Group by shard" >> beam.GroupByKey()
        | "Write shards" >> beam.ParDo(_WriteShard(tmp, num_shards, dim))
    )
    _ = (
        tuple(corrupt)
        | "All corrupt" >> beam.Flatten()
        | "Corrupt list" >> beam.combiners.ToList()
        | "Write corrupt list" >> beam.Map(_write_corrupt_list, tmp)
    )


def _count_record(element: tuple) -> tuple:
    Metrics.counter(METRICS_NAMESPACE, "records_read").inc()
    return element


# ----------------------------------------------------------------------------------------------------- driver
def direct_runner_args(workers: int, mode: str = "multi_processing") -> list[str]:
    """Pipeline arguments that run the DirectRunner with ``workers`` parallel workers (processes or threads)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if mode not in ("multi_processing", "multi_threading", "in_memory"):
        raise ValueError(f"mode must be multi_processing, multi_threading or in_memory, got {mode!r}")
    if workers == 1:
        return ["--runner", "DirectRunner"]
    return ["--runner", "DirectRunner", "--direct_num_workers", str(workers), "--direct_running_mode", mode]


def _counters(result) -> dict[str, int]:
    counters: dict[str, int] = {}
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    except Exception as exc:  # some runners do not report metrics back
        logger.warning("could not read the pipeline's metrics: %s", exc)
        return counters
    for counter in found:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + int(value or 0)
    return counters


_CORRUPT_MESSAGE = re.compile(r"(corrupt gallery image: id .*? \(on_corrupt='skip' skips such images\))")


def _corrupt_error_in(exc: BaseException) -> CorruptImageError | None:
    """The CorruptImageError behind a runner's exception: in-process runners chain it, others stringify it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, CorruptImageError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _corrupt_error_named(exc: BaseException) -> CorruptImageError | None:
    """A fresh CorruptImageError with just the DoFn's message (runners append step names and tracebacks)."""
    found = _corrupt_error_in(exc)
    match = _CORRUPT_MESSAGE.search(str(found if found is not None else exc))
    if match:
        return CorruptImageError(match.group(1))
    return CorruptImageError(str(found)) if found is not None else None


def _resolve_version(export_dir: str, version: int | None) -> int:
    complete = layout.complete_versions(export_dir)
    if version is None:
        if not complete:
            raise FileNotFoundError(f"{export_dir} has no complete export version")
        return complete[-1]
    if int(version) not in complete:
        raise FileNotFoundError(f"{export_dir} has no complete export version {version} (complete: {complete})")
    return int(version)


def _collect_shards(tmp: str, num_shards: int) -> list[dict]:
    shards = []
    for s in range(num_shards):
        path = os.path.join(tmp, _shard_info_file(s, num_shards))
        if not os.path.isfile(path):
            raise RuntimeError(
                f"the pipeline did not write shard {s} into {tmp}: the workers must see the driver's output folder"
            )
        shards.append(layout.read_json(path))
        os.unlink(path)
    return shards


def embed_gallery(
    source: str,
    export_dir: str,
    output_dir: str,
    *,
    version: int | None = None,
    num_shards: int = 8,
    batch_size: int = 64,
    on_corrupt: str = "skip",
    pipeline_args: list[str] | None = None,
    data_config=None,
    overwrite: bool = False,
) -> dict:
    """Embeds the gallery ``source`` (see :func:`resolve_source`) with ``export_dir``'s image encoder (``version``:
    default the newest complete one) on Beam and publishes ``output_dir`` atomically; returns the manifest.

    ``pipeline_args`` are Beam's own command-line options, passed unchanged to ``PipelineOptions`` (default
    runner: DirectRunner; e.g. :func:`direct_runner_args` for N local workers, or ``--runner FlinkRunner ...``).
    """
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    if num_shards < 1 or batch_size < 1:
        raise ValueError(f"num_shards and batch_size must be >= 1, got {num_shards} and {batch_size}")
    if "://" in output_dir:
        raise ValueError(
            f"output_dir {output_dir!r}: the output folder is published with an atomic rename, which object stores "
            "do not have; use a path on a (shared) file system"
        )
    export_dir, output_dir = os.path.abspath(export_dir), os.path.abspath(output_dir)
    version = _resolve_version(export_dir, version)
    meta = layout.export_metadata(export_dir, layout.IMAGE_ENCODER, version)
    model_dir = layout.version_dir(export_dir, layout.IMAGE_ENCODER, version)
    dim = int(meta["embedding_dim"])
    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} already exists (pass overwrite=True / --overwrite to replace it)")
    src = resolve_source(source, data_config=data_config, export_meta=meta, on_corrupt=on_corrupt)

    args = list(pipeline_args or [])
    options = PipelineOptions(args)
    standard = options.view_as(StandardOptions)
    standard.runner = standard.runner or "DirectRunner"
    runner = standard.runner if isinstance(standard.runner, str) else type(standard.runner).__name__
    settings = {"on_corrupt": on_corrupt, "num_shards": num_shards, "batch_size": batch_size}

    tmp = atomic.temp_dir_for(output_dir)
    started = time.perf_counter()
    try:
        os.makedirs(tmp)
        pipeline = beam.Pipeline(options=options)
        _build(pipeline, src, tmp, model_dir, dim, settings)
        logger.info("embedding gallery %s on %s into %s", source, runner, output_dir)
        result = pipeline.run()
        state = result.wait_until_finish()
        if state not in (None, PipelineState.DONE):
            raise RuntimeError(f"the embedding pipeline ended in state {state}")
        shards = _collect_shards(tmp, num_shards)
        with open(os.path.join(tmp, _CORRUPT_FILE), encoding="utf-8") as f:
            corrupt = sorted(json.load(f), key=lambda c: (c["id"] is None, c["id"] or 0, c["source"]))
        os.unlink(os.path.join(tmp, _CORRUPT_FILE))
        manifest = {
            "format": FORMAT,
            "export": {
                "dir": export_dir,
                "version": version,
                "export_id": meta.get("export_id"),
                "fingerprint": meta.get("fingerprint"),
                "image_fingerprint": meta.get("image_fingerprint"),
            },
            "embedding_dim": dim,
            "num_shards": num_shards,
            "shard_function": "splitmix64(id as uint64) mod num_shards",
            "shards": shards,
            "count": sum(s["count"] for s in shards),
            "corrupt": {"count": len(corrupt), "items": corrupt},
            "on_corrupt": on_corrupt,
            "source": src.info,
            "batch_size": batch_size,
            "runner": runner,
            "pipeline_args": args,
            "metrics": _counters(result),
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "elapsed_seconds": round(time.perf_counter() - started, 3),
        }
        layout.write_json(os.path.join(tmp, MANIFEST), manifest)
        atomic.publish_directory(tmp, output_dir, overwrite=overwrite)
    except Exception as exc:
        named = _corrupt_error_named(exc)
        if named is not None and named is not exc:
            raise named from exc
        raise
    finally:
        atomic.remove_tree(tmp)
    logger.info(
        "embedded %d images into %d shards (%d corrupt) in %.1f s",
        manifest["count"],
        num_shards,
        len(corrupt),
        manifest["elapsed_seconds"],
    )
    return manifest


# ------------------------------------------------------------------------------------------------------ reader
def _load_npy(path: str, data: bytes, shard: int) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        raise GalleryIntegrityError(f"shard {shard}: {path} is not a readable .npy file ({exc})") from exc


def load_embedded_gallery(path: str, verify: bool = True) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(embeddings float32 [n, d], ids int64 [n], manifest)`` of a folder written by :func:`embed_gallery`,
    shard after shard (each sorted by id).

    With ``verify`` every file's SHA-256 is checked against the manifest and every id against its shard; shapes,
    dtypes and counts are always checked, and ids must be unique. A mismatch raises :class:`GalleryIntegrityError`
    naming the shard and file."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise FileNotFoundError(f"{manifest_path} is missing: {path} is not an embedded gallery (embed-gallery)")
    manifest = layout.read_json(manifest_path)
    if manifest.get("format") != FORMAT:
        raise GalleryIntegrityError(f"{manifest_path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    dim, num_shards = int(manifest["embedding_dim"]), int(manifest["num_shards"])
    all_embeddings, all_ids = [], []
    for info in manifest["shards"]:
        shard, arrays = int(info["shard"]), {}
        for kind in ("embeddings", "ids"):
            file_path = os.path.join(path, info["files"][kind])
            if not os.path.isfile(file_path):
                raise GalleryIntegrityError(f"shard {shard}: {file_path} is missing")
            with open(file_path, "rb") as f:
                data = f.read()
            if verify:
                digest = hashlib.sha256(data).hexdigest()
                if digest != info["sha256"][kind]:
                    raise GalleryIntegrityError(
                        f"shard {shard}: {file_path} has SHA-256 {digest}, the manifest says {info['sha256'][kind]} "
                        "(the file was changed or damaged after it was written)"
                    )
            arrays[kind] = _load_npy(file_path, data, shard)
        embeddings, ids, count = arrays["embeddings"], arrays["ids"], int(info["count"])
        if embeddings.dtype != np.float32 or embeddings.shape != (count, dim):
            raise GalleryIntegrityError(
                f"shard {shard}: embeddings are {embeddings.dtype} {embeddings.shape}, expected float32 {(count, dim)}"
            )
        if ids.dtype != np.int64 or ids.shape != (count,):
            raise GalleryIntegrityError(f"shard {shard}: ids are {ids.dtype} {ids.shape}, expected int64 ({count},)")
        if verify and count and np.any(shard_of_ids(ids, num_shards) != shard):
            raise GalleryIntegrityError(f"shard {shard}: holds ids that belong to other shards")
        all_embeddings.append(embeddings)
        all_ids.append(ids)
    embeddings = np.concatenate(all_embeddings) if all_embeddings else np.zeros((0, dim), np.float32)
    ids = np.concatenate(all_ids) if all_ids else np.zeros((0,), np.int64)
    if len(ids) != int(manifest["count"]):
        raise GalleryIntegrityError(f"{path}: the shards hold {len(ids)} ids, the manifest says {manifest['count']}")
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        raise GalleryIntegrityError(f"{path}: image ids repeat: {unique[counts > 1][:10].tolist()}")
    return embeddings, ids, manifest

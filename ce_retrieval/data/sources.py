"""Loaders of real image-caption sets, each producing the same examples as the synthetic set (schema.py).

* Karpathy split JSON (Flickr30k / COCO ``dataset_*.json``): ``images[]`` with ``filename``, optional
  ``filepath`` (COCO's ``train2014`` / ``val2014``), ``split`` (train / restval / val / test), ``imgid`` (the
  image id) and ``sentences[].raw`` (about 5 captions); ``restval`` joins train when ``restval_to_train``.
* Conceptual Captions TSV: ``caption<TAB>image`` rows (optionally a header). ``image`` is a path (absolute or
  under ``tsv_image_root``) or a URL, whose local file is ``sha1(url)`` with one of the extensions
  ``"", .jpg, .jpeg, .png`` under ``tsv_image_root``. The image id is the data row index (``tsv_image_id="row"``)
  or a 60-bit hash of the resolved path (``"hash"``: rows naming the same file share one image).
* TFRecords written by :func:`ce_retrieval.data.tfrecords.write_tfrecords`.

The JSON/TSV loaders scan the index once per split (memoised per config fingerprint), validate captions and
(with ``validate_images``) decode every distinct image file once in a thread pool, then stream files with
``tf.io.read_file``. Skipped rows are counted in a :class:`LoadReport` (see :func:`load_report`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from ce_retrieval.data import tfrecords
from ce_retrieval.data.config import DataConfig
from ce_retrieval.data.report import LoadReport, caption_problem, image_problem
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, RetrievalSplit

URL_EXTENSIONS = ("", ".jpg", ".jpeg", ".png")


@dataclasses.dataclass
class ScannedSplit:
    """A validated split: image j is file ``image_paths[j]`` with id ``image_ids[j]``; caption i shows image
    ``caption_image_index[i]``."""

    captions: list[str]
    caption_image_index: np.ndarray
    image_paths: list[str]
    image_ids: np.ndarray
    report: LoadReport


def _file_problem(path: str, validate: bool) -> tuple[str, str] | None:
    """(kind, message) if the image file is missing or (with ``validate``) undecodable, else None."""
    if not os.path.isfile(path):
        return "missing_images", f"missing image file {path}"
    if validate:
        with open(path, "rb") as f:
            problem = image_problem(f.read())
        if problem:
            return "corrupt_images", f"{path}: {problem}"
    return None


class _SplitBuilder:
    """Collects (caption, image document) rows while an index is parsed, then validates every distinct image
    file once, in parallel threads (PIL decoding releases the GIL), and drops the captions of bad images.
    A document is (path, image_id): with per-row ids one file may back several documents."""

    def __init__(self, cfg: DataConfig, source: str, split: str):
        self.cfg = cfg
        self.report = LoadReport(source=source, split=split)
        self.documents: dict[tuple[str, int], str] = {}  # (path, image_id) -> where first named
        self.rows: list[tuple[str, tuple[str, int]]] = []  # (caption, document)

    def add(self, caption: str, path: str, image_id: int, where: str) -> None:
        document = (path, int(image_id))
        self.documents.setdefault(document, where)
        self.rows.append((caption.strip(), document))

    def bad_row(self, message: str) -> None:
        self.report.fail_or_count("bad_rows", message, self.cfg.skip_corrupt)

    def build(self) -> ScannedSplit:
        paths = list(dict.fromkeys(path for path, _ in self.documents))
        workers = min(32, (os.cpu_count() or 1) + 4)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            problems = dict(
                zip(paths, pool.map(lambda p: _file_problem(p, self.cfg.validate_images), paths), strict=True)
            )
        reported: set[str] = set()
        index: dict[tuple[str, int], int] = {}
        for document, where in self.documents.items():  # first-appearance order: deterministic errors
            path = document[0]
            if problems[path] is not None:
                if path not in reported:
                    reported.add(path)
                    kind, message = problems[path]
                    self.report.fail_or_count(kind, f"{where}: {message}", self.cfg.skip_corrupt)
                continue
            index[document] = len(index)
        image_paths = [path for path, _ in index]
        image_ids = np.asarray([image_id for _, image_id in index], np.int64)
        if len(np.unique(image_ids)) != len(image_ids):
            raise ValueError(f"{self.report.source} [{self.report.split}]: one image id names several image files")
        kept = [(caption, index[doc]) for caption, doc in self.rows if doc in index]
        captions = [caption for caption, _ in kept]
        caption_index = np.asarray([i for _, i in kept], np.int64)
        self.report.examples, self.report.images = len(captions), len(image_paths)
        self.report.log()
        return ScannedSplit(captions, caption_index, image_paths, image_ids, self.report)


def scan_karpathy(cfg: DataConfig, split: str) -> ScannedSplit:
    if not cfg.karpathy_json:
        raise ValueError("DataConfig.karpathy_json is not set")
    with open(cfg.karpathy_json, encoding="utf-8") as f:
        index = json.load(f)
    if not isinstance(index, dict) or not isinstance(index.get("images"), list):
        raise ValueError(f"{cfg.karpathy_json}: expected a JSON object with an 'images' list (Karpathy split format)")
    root = cfg.image_root or os.path.dirname(os.path.abspath(cfg.karpathy_json))
    wanted = {split} | ({"restval"} if split == "train" and cfg.restval_to_train else set())
    builder = _SplitBuilder(cfg, f"karpathy {cfg.karpathy_json}", split)
    for n, entry in enumerate(index["images"]):
        if not isinstance(entry, dict) or "filename" not in entry or "split" not in entry:
            builder.report.rows += 1
            builder.bad_row(f"images[{n}]: entry lacks 'filename' or 'split'")
            continue
        if entry["split"] not in wanted:
            continue
        sentences = entry.get("sentences") or []
        builder.report.rows += len(sentences)
        path = os.path.join(root, entry.get("filepath", ""), entry["filename"])
        try:
            image_id = int(entry.get("imgid", n))
        except (TypeError, ValueError):
            builder.bad_row(f"images[{n}] ({entry['filename']}): imgid {entry.get('imgid')!r} is not an integer")
            continue
        for k, sentence in enumerate(sentences):
            raw = sentence.get("raw") if isinstance(sentence, dict) else None
            problem = caption_problem(raw)
            if problem:
                builder.bad_row(f"images[{n}] ({entry['filename']}) sentences[{k}]: {problem}")
                continue
            builder.add(raw, path, image_id, f"images[{n}] ({entry['filename']})")
    return builder.build()


def url_to_filename(url: str) -> str:
    """Local file name (without extension) of a downloaded URL: its SHA-1 hex digest."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()


def _tsv_image_path(cfg: DataConfig, value: str) -> str:
    root = cfg.tsv_image_root or ""
    if "://" in value:
        stem = os.path.join(root, url_to_filename(value))
        for ext in URL_EXTENSIONS:
            if os.path.isfile(stem + ext):
                return stem + ext
        return stem
    return value if os.path.isabs(value) else os.path.join(root, value)


def _hash_id(path: str) -> int:
    return int(hashlib.sha1(path.encode("utf-8")).hexdigest()[:15], 16)


def scan_tsv(cfg: DataConfig, split: str) -> ScannedSplit:
    tsv = cfg.tsv_path.get(split)
    builder = _SplitBuilder(cfg, f"cc_tsv {tsv}", split)
    with open(tsv, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line_no == 1 and cfg.tsv_header:
                continue
            _tsv_row(cfg, builder, tsv, line_no, line.rstrip(b"\n"), row=line_no - 1 - int(cfg.tsv_header))
    return builder.build()


def _tsv_row(cfg: DataConfig, builder: _SplitBuilder, tsv: str, line_no: int, line: bytes, row: int) -> None:
    """Validate one ``caption<TAB>image`` row (``row`` is the 0-based data-row index) and add it."""
    builder.report.rows += 1
    where = f"{tsv}:{line_no}"
    try:
        text = line.rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError as exc:
        builder.bad_row(f"{where}: row is not valid UTF-8 ({exc})")
        return
    columns = text.split("\t")
    if len(columns) != 2:
        builder.bad_row(f"{where}: expected 2 tab-separated columns (caption, image), got {len(columns)}")
        return
    caption, image = columns
    problem = caption_problem(caption) or (None if image.strip() else "empty image column")
    if problem:
        builder.bad_row(f"{where}: {problem}")
        return
    path = _tsv_image_path(cfg, image.strip())
    image_id = row if cfg.tsv_image_id == "row" else _hash_id(path)
    builder.add(caption, path, image_id, where)


_SCANS: dict[tuple[str, str], ScannedSplit] = {}


def scan(cfg: DataConfig, split: str) -> ScannedSplit:
    """The validated split of a JSON/TSV source, memoised per (config fingerprint, split)."""
    key = (cfg.fingerprint(), split)
    if key not in _SCANS:
        if cfg.name == "karpathy":
            _SCANS[key] = scan_karpathy(cfg, split)
        elif cfg.name == "cc_tsv":
            _SCANS[key] = scan_tsv(cfg, split)
        else:
            raise ValueError(f"scan: source {cfg.name!r} is not a JSON/TSV source")
    return _SCANS[key]


_TFRECORD_REPORTS: dict[tuple[str, str], LoadReport] = {}


def load_examples(cfg: DataConfig, split: str) -> tf.data.Dataset:
    if cfg.name == "tfrecord":
        dataset, report = tfrecords.read_tfrecords(
            cfg.tfrecord_pattern.get(split), skip_corrupt=cfg.skip_corrupt, validate=cfg.validate_images, split=split
        )
        _TFRECORD_REPORTS[(cfg.fingerprint(), split)] = report
        return dataset
    scanned = scan(cfg, split)
    if not scanned.captions:
        raise ValueError(f"{scanned.report.source} [{split}]: no usable examples")
    paths = tf.constant(scanned.image_paths, tf.string)
    ids = tf.constant(scanned.image_ids, tf.int64)
    base = tf.data.Dataset.from_tensor_slices((tf.constant(scanned.captions, tf.string), scanned.caption_image_index))
    return base.map(
        lambda caption, i: {CAPTION: caption, IMAGE: tf.io.read_file(tf.gather(paths, i)), IMAGE_ID: tf.gather(ids, i)},
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def load_retrieval_split(cfg: DataConfig, split: str) -> RetrievalSplit:
    if cfg.name == "tfrecord":
        captions, caption_ids, images, report = tfrecords.read_all(
            cfg.tfrecord_pattern.get(split), skip_corrupt=cfg.skip_corrupt, validate=cfg.validate_images, split=split
        )
        _TFRECORD_REPORTS[(cfg.fingerprint(), split)] = report
        image_ids = np.asarray(sorted(images), np.int64)
        return RetrievalSplit(
            captions, caption_ids, [images[i] for i in image_ids.tolist()], image_ids, name=f"tfrecord/{split}"
        )
    scanned = scan(cfg, split)
    images = []
    for path in scanned.image_paths:
        with open(path, "rb") as f:
            images.append(f.read())
    return RetrievalSplit(
        list(scanned.captions),
        scanned.image_ids[scanned.caption_image_index],
        images,
        scanned.image_ids,
        name=f"{cfg.name}/{split}",
    )


def training_captions(cfg: DataConfig) -> list[str]:
    if cfg.name == "tfrecord":
        return [
            c.decode("utf-8")
            for _, _, c, _, _ in tfrecords.iterate_records(cfg.tfrecord_pattern.get("train"))
            if c is not None and caption_problem(c) is None
        ]
    return list(scan(cfg, "train").captions)


def load_report(cfg: DataConfig, split: str) -> LoadReport:
    """The LoadReport of the latest scan of (cfg, split); scans now if there was none."""
    if cfg.name == "tfrecord":
        key = (cfg.fingerprint(), split)
        if key not in _TFRECORD_REPORTS:
            _TFRECORD_REPORTS[key] = tfrecords.scan_tfrecords(
                cfg.tfrecord_pattern.get(split),
                split=split,
                skip_corrupt=cfg.skip_corrupt,
                validate=cfg.validate_images,
            )[0]
        return _TFRECORD_REPORTS[key]
    return scan(cfg, split).report

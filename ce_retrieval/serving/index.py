"""Build the gallery index next to an export (CLI ``ce-retrieval index``).

``<export_dir>/index/<version>/`` holds, for the image embeddings x_j = image_encoder(image_j) of one export
version (unit vectors, score s(q, x) = q.x):

    manifest.json   model binding (fingerprint, dimension, normalisation, logit scale), ids checksum, index
                    kind and parameters, build time, ANN recall@10 vs exact search measured at build time,
                    calibrated thresholds (score at which global precision reaches 0.5 / 0.8 / 0.9)
    embeddings.npy  float32 [n, d] in leaf order;  ids.npy  int64 [n] (gallery id of each row)
    partitions.npz  k-means ball partitions for exact threshold search (see ``partitions``)
    scann/          serialised ScaNN searcher (galleries of at least ``brute_force_below`` items)

ScaNN set-up follows its guidance for n items: a spherical k-means tree of num_leaves ~ sqrt(n), anisotropic
asymmetric hashing (2 dims/block, threshold 0.2) for scoring, exact float32 re-ranking of the best
``reorder`` candidates. ``leaves_to_search`` and the re-ranking depth are tuned at build time: the cheapest
pair on a grid whose recall@10 against exact search reaches the target (0.95 by default) on evaluation
queries (validation captions when given, otherwise held-out-like points near the gallery). ScaNN is serialised with relative asset paths so the
folder can be moved and loaded from any working directory. The folder is published atomically (``layout``).
"""
from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import math
import os
import time

import numpy as np

from ce_retrieval.serving import layout
from ce_retrieval.serving.gallery import (
    EMBEDDINGS_FILE,
    IDS_FILE,
    PARTITIONS_FILE,
    SCANN_DIR,
    GalleryIndex,
    exact_topk,
    ids_digest,
    scann_ops_pybind,
)
from ce_retrieval.serving.partitions import build_partitions

BRUTE_FORCE_BELOW = 20_000
PRECISION_LEVELS = ("0.5", "0.8", "0.9")


@dataclasses.dataclass
class IndexParams:
    """ScaNN parameters; ``None`` fields are chosen from the gallery size by :func:`default_params`."""

    num_leaves: int | None = None
    leaves_to_search: int | None = None  # None: tuned for the target recall
    training_sample_size: int | None = None
    spherical_tree: bool = True  # spherical k-means leaves suit unit vectors (measured: higher recall per leaf)
    dims_per_block: int = 2
    anisotropic_quantization_threshold: float = 0.2
    reorder_num_neighbors: int | None = None


def default_params(n: int, params: IndexParams | None = None) -> IndexParams:
    p = dataclasses.replace(params or IndexParams())
    if p.num_leaves is None:
        p.num_leaves = max(1, min(n // 8, round(math.sqrt(n))))
    if p.training_sample_size is None:
        p.training_sample_size = min(n, 250_000)
    if p.reorder_num_neighbors is None:
        p.reorder_num_neighbors = 100 if n < 500_000 else 200
    return p


def normalize_thresholds(thresholds) -> dict[str, float] | None:
    """Accepts ``{"0.9": t}``, ``{0.9: t}`` or a whole ``global_pr_auc`` result; returns ``{"0.9": t, ...}``."""
    if thresholds is None:
        return None
    if "threshold_at_precision" in thresholds:
        thresholds = thresholds["threshold_at_precision"]
    out = {}
    for key, value in thresholds.items():
        if value is None or not math.isfinite(float(value)):
            continue  # precision level never reached on the calibration split
        out[format(float(key), "g")] = float(value)
    return out


def _recall_at_10(searcher_rows: np.ndarray, exact_rows: np.ndarray) -> float:
    k = exact_rows.shape[1]
    hits = [len(np.intersect1d(a[:k], b)) for a, b in zip(searcher_rows, exact_rows, strict=True)]
    return float(np.sum(hits) / exact_rows.size)


def _held_out_like(x: np.ndarray, rng: np.random.Generator, num: int = 1000) -> np.ndarray:
    """Queries like unseen points of the gallery's distribution: q = normalise(x_i + r_i u_i), r_i the distance
    from x_i to its nearest other gallery item and u_i a random unit vector. (Gallery points themselves would
    overstate recall: each sits in its own leaf and is its own nearest neighbour.)"""
    base = x[rng.choice(len(x), size=min(len(x), num), replace=False)]
    _, scores = exact_topk(base, x, 2)
    radius = np.sqrt(np.maximum(2.0 - 2.0 * scores[:, 1:2], 0.0))
    u = rng.normal(size=base.shape).astype(np.float32)
    q = base + radius * u / np.linalg.norm(u, axis=1, keepdims=True)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _build_scann(x: np.ndarray, p: IndexParams):
    return (scann_ops_pybind.builder(x, 10, "dot_product")
            .tree(num_leaves=p.num_leaves, num_leaves_to_search=p.leaves_to_search or max(1, p.num_leaves // 10),
                  training_sample_size=p.training_sample_size, spherical=p.spherical_tree)
            .score_ah(p.dims_per_block, anisotropic_quantization_threshold=p.anisotropic_quantization_threshold)
            .reorder(p.reorder_num_neighbors)
            .build())


def _tune_leaves(searcher, queries: np.ndarray, exact_rows: np.ndarray, p: IndexParams, target: float):
    """Cheapest (leaves_to_search, reorder) on a grid reaching ``target`` recall@10: leaves grow geometrically
    and, at each, the re-ranking depth is tried at 1x and 4x (hard, diffuse data needs deeper re-ranking
    rather than more leaves). Returns (leaves, reorder, recall, table)."""
    grid = sorted({max(1, math.ceil(p.num_leaves * f)) for f in (0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)})
    if p.leaves_to_search is not None:
        grid = [p.leaves_to_search]
    table = []
    for leaves in grid:
        for reorder in (p.reorder_num_neighbors, 4 * p.reorder_num_neighbors):
            rows, _ = searcher.search_batched_parallel(queries, 10, reorder, leaves)
            recall = _recall_at_10(np.asarray(rows), exact_rows)
            table.append({"leaves_to_search": leaves, "reorder_num_neighbors": reorder, "recall_at_10": recall})
            if recall >= target:
                return leaves, reorder, recall, table
    best = max(table, key=lambda r: r["recall_at_10"])
    return best["leaves_to_search"], best["reorder_num_neighbors"], best["recall_at_10"], table


def build_index(embeddings, ids, export_dir: str, version: int | None = None, *, thresholds=None,
                queries=None, target_recall: float = 0.95, brute_force_below: int = BRUTE_FORCE_BELOW,
                params: IndexParams | None = None, overwrite: bool = False, gallery_info: dict | None = None,
                seed: int = 0) -> dict:
    """Builds and publishes ``<export_dir>/index/<version>/`` for gallery ``embeddings`` [n, d] with ``ids`` [n].

    ``embeddings`` must come from ``image_encoder/<version>`` (unit norm). ``thresholds`` maps a precision
    level to the score reaching it on a validation split (``evaluation.calibration.global_pr_auc``'s
    ``threshold_at_precision``). ``queries`` (unit vectors, e.g. validation caption embeddings) are used to
    measure ANN recall@10; by default a sample of the gallery. Returns the manifest.
    """
    export_dir = os.path.abspath(export_dir)
    if version is None:
        complete = layout.complete_versions(export_dir)
        if not complete:
            raise FileNotFoundError(f"{export_dir} holds no complete export; run `ce-retrieval export` first")
        version = complete[-1]
    meta = layout.export_metadata(export_dir, layout.IMAGE_ENCODER, version)
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty [n, d] array, got shape {x.shape}")
    if x.shape[1] != meta["embedding_dim"]:
        raise ValueError(f"embeddings have dimension {x.shape[1]} but export version {version} has {meta['embedding_dim']}")
    if ids.shape != (len(x),):
        raise ValueError(f"ids must have shape ({len(x)},), got {ids.shape}")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("gallery ids must be unique")
    norms = np.linalg.norm(x, axis=1)
    if not np.all(np.isfinite(norms)) or np.max(np.abs(norms - 1.0)) > 1e-3:
        raise ValueError("gallery embeddings must be finite and L2-normalised (use the exported image encoder)")

    start = time.time()
    n = len(x)
    kind = "brute_force" if n < brute_force_below else "scann"
    final = layout.version_dir(export_dir, layout.INDEX, version)
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite=True / --overwrite to replace it atomically)")
    tmp = layout.temp_dir_for(final)
    try:
        os.makedirs(tmp)
        p = default_params(n, params)
        recall_info = None
        if kind == "scann":
            order, partitions = build_partitions(x, p.num_leaves, seed=seed)
            x, ids = np.ascontiguousarray(x[order]), ids[order]
            partitions.save(os.path.join(tmp, PARTITIONS_FILE))
            searcher = _build_scann(x, p)
            rng = np.random.default_rng(seed)
            if queries is None:
                q = _held_out_like(x, rng)
                source = "gallery sample moved by its nearest-neighbour distance (held-out-like)"
            else:
                q = np.asarray(queries, dtype=np.float32)
                q = q[rng.choice(len(q), size=min(len(q), 1000), replace=False)]
                source = "given queries"
            exact_rows, _ = exact_topk(q, x, 10)
            p.leaves_to_search, p.reorder_num_neighbors, recall, table = _tune_leaves(searcher, q, exact_rows, p,
                                                                                      target_recall)
            os.makedirs(os.path.join(tmp, SCANN_DIR))
            searcher.serialize(os.path.join(tmp, SCANN_DIR), relative_path=True)
            recall_info = {"recall_at_10": recall, "target": target_recall, "meets_target": recall >= target_recall,
                           "num_queries": len(q), "query_source": source, "tuning": table}
            params_out = dataclasses.asdict(p)
        else:
            params_out = {"exact": True}
            recall_info = {"recall_at_10": 1.0, "target": target_recall, "meets_target": True, "num_queries": 0,
                           "query_source": "exact search (gallery below brute_force_below)"}
        np.save(os.path.join(tmp, EMBEDDINGS_FILE), x)
        np.save(os.path.join(tmp, IDS_FILE), ids)
        manifest = {
            "format": "ce_retrieval.index/1",
            "version": int(version),
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(time.time() - start, 3),
            "model": {"fingerprint": meta["fingerprint"], "export_id": meta["export_id"],
                      "embedding_dim": meta["embedding_dim"], "normalization": meta.get("normalization", "l2"),
                      "logit_scale": meta.get("logit_scale")},
            "score": "cosine similarity q.x of unit vectors",
            "num_items": n,
            "ids": {"file": IDS_FILE, "dtype": "int64", "count": n, "sha256": ids_digest(ids),
                    "min": int(ids.min()), "max": int(ids.max())},
            "embeddings": {"file": EMBEDDINGS_FILE, "dtype": "float32", "order": "leaf" if kind == "scann" else "input"},
            "kind": kind,
            "brute_force_below": brute_force_below,
            "params": params_out,
            "threshold_search": {"method": "exact: ball-bounded k-means leaves + exact re-scoring" if kind == "scann"
                                 else "exact: brute force", "file": PARTITIONS_FILE if kind == "scann" else None},
            "ann": recall_info,
            "thresholds": {"threshold_at_precision": normalize_thresholds(thresholds)},
            "gallery": gallery_info or {},
        }
        layout.write_json(os.path.join(tmp, layout.INDEX_MANIFEST), manifest)
        GalleryIndex.load(tmp, expected_model=meta, mmap=True)  # the folder must load before it is published
        layout.publish(tmp, final, overwrite=overwrite)
    finally:
        layout.remove_quietly(tmp)
    return manifest


# ----------------------------------------------------------------------------------------------------- CLI
def _embed_batches(signature, input_name: str, values: list, batch_size: int) -> np.ndarray:
    import tensorflow as tf

    out = [signature(**{input_name: tf.constant(values[i:i + batch_size], dtype=tf.string)})["embedding"].numpy()
           for i in range(0, len(values), batch_size)]
    return np.concatenate(out, axis=0)


def _image_files(folder: str) -> tuple[list[bytes], np.ndarray, list[str]]:
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    if not names:
        raise FileNotFoundError(f"no .jpg/.jpeg/.png files in {folder}")
    stems = [os.path.splitext(f)[0] for f in names]
    ids = np.array([int(s) for s in stems]) if all(s.isdigit() for s in stems) else np.arange(len(names))
    images = []
    for f in names:
        with open(os.path.join(folder, f), "rb") as fh:
            images.append(fh.read())
    return images, ids, names


def _tfrecord_images(pattern: str) -> tuple[list[bytes], np.ndarray]:
    import tensorflow as tf

    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {pattern}")
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "image_id": tf.io.FixedLenFeature([], tf.int64)}
    seen: dict[int, bytes] = {}
    for rec in tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec)):
        seen.setdefault(int(rec["image_id"]), rec["image"].numpy())  # one entry per image (records are per caption)
    return list(seen.values()), np.array(list(seen.keys()), dtype=np.int64)


def _dataclass_from_dict(cls, data: dict):
    """Rebuilds a (possibly nested) config dataclass from its ``dataclasses.asdict`` form; unknown keys fail."""
    import typing

    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        kind = hints.get(key)
        if isinstance(value, dict) and dataclasses.is_dataclass(kind):
            value = _dataclass_from_dict(kind, value)
        kwargs[key] = value
    return cls(**kwargs)


def _data_config(meta: dict):
    from ce_retrieval.data.config import DataConfig  # lazy: only split names need the data package

    data = ((meta.get("metadata") or {}).get("config") or {}).get("data")
    if data is None:
        raise ValueError("this export carries no data config; pass an image folder or TFRecord pattern to --images")
    return _dataclass_from_dict(DataConfig, data) if isinstance(data, dict) else data


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--images", required=True,
                        help="gallery: a split name of the export's data config (e.g. test), a folder of "
                             ".jpg/.png files (integer file names become ids) or a TFRecord file pattern")
    parser.add_argument("--version", type=int, default=None, help="export version (default: newest complete)")
    parser.add_argument("--calibration_split", default=None,
                        help="split used to calibrate thresholds (global PR) and measure ANN recall, e.g. val")
    parser.add_argument("--thresholds_json", default=None,
                        help="JSON file with threshold_at_precision (e.g. an evaluation report) instead of calibrating")
    parser.add_argument("--distractors", type=int, default=0, help="add N synthetic distractor images (ids -1, -2, ...)")
    parser.add_argument("--target_recall", type=float, default=0.95)
    parser.add_argument("--brute_force_below", type=int, default=BRUTE_FORCE_BELOW)
    parser.add_argument("--num_leaves", type=int, default=None)
    parser.add_argument("--leaves_to_search", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--overwrite", action="store_true")


def run(args) -> int:
    from ce_retrieval.serving.export import IMAGE_INPUT, TEXT_INPUT, load_signature

    export_dir = os.path.abspath(args.export_dir)
    complete = layout.complete_versions(export_dir)
    version = args.version if args.version is not None else (complete[-1] if complete else None)
    if version is None or version not in complete:
        raise SystemExit(f"error: no complete export version {version if version else ''} in {export_dir}")
    meta = layout.export_metadata(export_dir, layout.IMAGE_ENCODER, version)
    _, image_fn = load_signature(layout.version_dir(export_dir, layout.IMAGE_ENCODER, version))
    info: dict = {"source": args.images}
    if os.path.isdir(args.images):
        images, ids, names = _image_files(args.images)
        if not all(os.path.splitext(f)[0].isdigit() for f in names):
            info["names"] = names  # row i of the folder listing has id i
    elif glob.glob(args.images):
        images, ids = _tfrecord_images(args.images)
    else:
        from ce_retrieval.data import load_retrieval_split

        split = load_retrieval_split(_data_config(meta), args.images)
        images, ids = list(split.images), split.image_ids
    if args.distractors:
        from ce_retrieval.data.synthetic import distractor_images

        cfg = _data_config(meta)
        extra = distractor_images(args.distractors, seed=getattr(cfg, "seed", 0) + 7919, image_size=getattr(cfg, "image_size", 64))
        images = list(images) + list(extra)
        ids = np.concatenate([np.asarray(ids, dtype=np.int64), -np.arange(1, len(extra) + 1)])
        info["distractors"] = len(extra)
    embeddings = _embed_batches(image_fn, IMAGE_INPUT, list(images), args.batch_size)

    thresholds, queries = None, None
    if args.thresholds_json:
        with open(args.thresholds_json, encoding="utf-8") as f:
            report = json.load(f)
        thresholds = report.get("threshold_at_precision") or report.get("calibration", {}).get("threshold_at_precision")
        if thresholds is None:
            raise SystemExit(f"error: {args.thresholds_json} has no threshold_at_precision")
    if args.calibration_split:
        from ce_retrieval.data import load_retrieval_split
        from ce_retrieval.evaluation.calibration import global_pr_auc

        _, text_fn = load_signature(layout.version_dir(export_dir, layout.TEXT_ENCODER, version))
        cal = load_retrieval_split(_data_config(meta), args.calibration_split)
        queries = _embed_batches(text_fn, TEXT_INPUT, list(cal.captions), args.batch_size)
        cal_docs = _embed_batches(image_fn, IMAGE_INPUT, list(cal.images), args.batch_size)
        if thresholds is None:
            thresholds = global_pr_auc(queries, cal_docs, cal.caption_ids, cal.image_ids)["threshold_at_precision"]
        info["calibration_split"] = args.calibration_split
    params = IndexParams(num_leaves=args.num_leaves, leaves_to_search=args.leaves_to_search)
    manifest = build_index(embeddings, ids, export_dir, version, thresholds=thresholds, queries=queries,
                           target_recall=args.target_recall, brute_force_below=args.brute_force_below,
                           params=params, overwrite=args.overwrite, gallery_info=info)
    ann = manifest["ann"]
    print(f"index version {version}: {manifest['num_items']} items, {manifest['kind']}, "
          f"recall@10 {ann['recall_at_10']:.4f} (target {ann['target']}), built in {manifest['build_seconds']} s")
    print(f"thresholds (score at precision): {manifest['thresholds']['threshold_at_precision']}")
    return 0 if ann["meets_target"] else 1

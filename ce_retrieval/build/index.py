"""Build the gallery index next to an export (used by the ``ce-retrieval index`` command).

``<export_dir>/index/<version>/`` holds, for the image embeddings x_j = image_encoder(image_j) of one export
version (unit vectors, score s(q, x) = q.x):

    manifest.json   model binding (fingerprint, dimension, normalisation, logit scale), ids checksum, index
                    kind and parameters, build time, ANN recall@10 vs exact search measured at build time,
                    calibrated thresholds for this gallery's size: guaranteed (precision >= p with confidence
                    1 - delta) and estimated, with the calibration they came from (``split_calibration``)
    embeddings.npy  float32 [n, d] in leaf order;  ids.npy  int64 [n] (gallery id of each row); the manifest
                    holds the SHA-256 of both arrays
    partitions.npz  k-means ball partitions, finer than ScaNN's leaves, for exact threshold search and the
                    approximate search's leaf expansion (see ``search.partitions``, ``search.threshold``)
                    (the manifest's ``threshold_search`` records the measured set recall of the approximate
                    threshold search, ``ce_retrieval.search.threshold``, at the calibrated thresholds)
    scann/          serialised ScaNN searcher (galleries of at least ``brute_force_below`` items)

ScaNN set-up follows its guidance for n items: a spherical k-means tree of num_leaves ~ sqrt(n), anisotropic
asymmetric hashing (2 dims/block, threshold 0.2) for scoring, exact float32 re-ranking of the best
``reorder`` candidates (``ce_retrieval.search.ann.build_scann``, shared with the evaluation's ScaNN
search). ``leaves_to_search`` and the re-ranking depth are tuned at build time: the cheapest pair on a grid whose
recall@10 against exact search reaches the target (0.95 by default) on evaluation queries (validation captions when
given, otherwise held-out-like points near the gallery). ScaNN is serialised with relative asset paths so the
folder can be moved and loaded from any working directory. The folder is published atomically
(``ce_retrieval.utils.atomic.atomic_directory``).

:func:`write_index_folder` writes one such folder into a given directory; :func:`build_index` uses it for the
version folder itself and ``ce_retrieval.build.sharded.build_sharded_index`` for each shard folder of a
sharded version.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import time

import numpy as np

from ce_retrieval.build.tuning import (
    TARGET_SET_RECALL,
    gallery_tuning_queries,
    held_out_like,
    tune_leaves,
    tune_threshold_search,
)
from ce_retrieval.search import layout
from ce_retrieval.search.ann import IndexParams, build_scann, default_params
from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.gallery import (
    EMBEDDINGS_FILE,
    IDS_FILE,
    INDEX_FORMAT,
    PARTITIONS_FILE,
    SCANN_DIR,
    GalleryIndex,
    embeddings_digest,
    ids_digest,
)
from ce_retrieval.search.partitions import build_partitions
from ce_retrieval.utils.atomic import atomic_directory

BRUTE_FORCE_BELOW = 20_000
# Threshold partitions: a flat spherical k-means with leaves of ~128 items (never fewer leaves than ScaNN's, at
# most 8,192). Finer leaves follow a query's hits more closely: on the benchmark's hard gallery at 1M, the leaves
# holding the hits the ANN found (top-10 leaves, re-scoring 2k) hold 1,077 items per query with 7,812 leaves
# (expanded set recall 0.984) against 24,618 with 1,000 (0.963). Flat matters: 1,000 leaves each split in 8 by its
# own k-means gave 3,917 items and 0.952 (the split cuts the data's clusters at the coarse boundaries;
# benchmarks/results/threshold_leaves.md). The cap bounds the build's assignment pass (n x leaves x d
# multiply-adds: 1.0e13 at 10M x 128).
PARTITION_LEAF_ITEMS, MAX_PARTITION_LEAVES = 128, 8192
PRECISION_LEVELS = ("0.5", "0.8", "0.9")
SCORE = "cosine similarity q.x of unit vectors"


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


def thresholds_block(gallery_size: int, thresholds=None, probability=None, calibration=None) -> dict:
    """The manifest's ``thresholds``: from a :class:`~ce_retrieval.evaluation.split_calibration.Calibration`,
    recomputed for this gallery's size (guaranteed and estimated thresholds, the probability map at the served
    base rate, the calibration itself); without one, the given ``thresholds`` and ``probability`` as they are,
    with no guarantee (``guaranteed`` None: precision queries must then ask for the estimate)."""
    if calibration is not None:
        if thresholds is not None or probability is not None:
            raise ValueError("give a calibration or thresholds/probability, not both")
        return calibration.for_gallery(gallery_size)
    return {"threshold_at_precision": normalize_thresholds(thresholds), "probability": probability, "guaranteed": None}


def model_block(meta: dict) -> dict:
    """The manifest's ``model`` block: what binds an index to the export (image encoder metadata) that built it."""
    return {
        "fingerprint": meta["fingerprint"],
        "export_id": meta["export_id"],
        "embedding_dim": meta["embedding_dim"],
        "normalization": meta.get("normalization", "l2"),
        "logit_scale": meta.get("logit_scale"),
        "logit_bias": meta.get("logit_bias"),
    }


def resolve_version(export_dir: str, version: int | None) -> tuple[int, dict]:
    """``(version, image encoder metadata)``: the given export version, or the newest complete one."""
    if version is None:
        complete = layout.complete_versions(export_dir)
        if not complete:
            raise FileNotFoundError(f"{export_dir} holds no complete export; run `ce-retrieval export` first")
        version = complete[-1]
    return int(version), layout.export_metadata(export_dir, layout.IMAGE_ENCODER, version)


def check_gallery(embeddings, ids, embedding_dim: int, version: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32 [n, d] C-contiguous, ids int64 [n])`` after checking shape, dimension, unique ids and unit
    norms; ``ValueError`` naming the problem otherwise."""
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty [n, d] array, got shape {x.shape}")
    if x.shape[1] != embedding_dim:
        where = f"export version {version}" if version is not None else "the model"
        raise ValueError(f"embeddings have dimension {x.shape[1]} but {where} has {embedding_dim}")
    if ids.shape != (len(x),):
        raise ValueError(f"ids must have shape ({len(x)},), got {ids.shape}")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("gallery ids must be unique")
    # in blocks: a whole-gallery x * x temporary would double the memory of a large build
    block = 1 << 18
    norms = np.concatenate([np.linalg.norm(x[i : i + block], axis=1) for i in range(0, len(x), block)])
    if not np.all(np.isfinite(norms)) or np.max(np.abs(norms - 1.0)) > 1e-3:
        raise ValueError("gallery embeddings must be finite and L2-normalised (use the exported image encoder)")
    return x, ids


def evaluation_queries(x: np.ndarray, queries, seed: int) -> tuple[np.ndarray, str]:
    """Queries for measuring recall@10 at build time, and their description: at most 1,000 of the given ones
    (a seeded sample, so every shard of a sharded build and its global check use the same ones), otherwise
    held-out-like points near the gallery ``x``."""
    rng = np.random.default_rng(seed)
    if queries is None:
        return held_out_like(x, rng), "gallery sample moved by its nearest-neighbour distance (held-out-like)"
    q = np.asarray(queries, dtype=np.float32)
    return q[rng.choice(len(q), size=min(len(q), 1000), replace=False)], "given queries"


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """How an index is built: the one set of build settings of :func:`build_index`, ``build_sharded_index`` (where
    it applies to every shard) and :func:`write_index_folder`."""

    target_recall: float = 0.95  # recall@10 against exact search the ScaNN tuning must reach
    brute_force_below: int = BRUTE_FORCE_BELOW  # a gallery (or shard) smaller than this is searched exactly
    params: IndexParams | None = None  # ScaNN parameters; None fields are chosen from the gallery size
    seed: int = 0  # the evaluation-query sample, the threshold partitions' k-means and the tuning queries
    target_set_recall: float = TARGET_SET_RECALL  # the approximate threshold search's tuning target
    threshold_partitions: bool = True  # False: a faster build without the threshold search's partitions


@dataclasses.dataclass
class _Searchers:
    """What building the searcher and tuning it gave: the gallery in stored order and the manifest's blocks."""

    x: np.ndarray
    ids: np.ndarray
    kind: str
    params: dict
    ann: dict
    threshold_search: dict
    phases: dict


def _brute_force(x: np.ndarray, ids: np.ndarray, config: BuildConfig) -> _Searchers:
    """A gallery below ``brute_force_below``: exact search, nothing to build or tune."""
    ann = {
        "recall_at_10": 1.0,
        "target": config.target_recall,
        "meets_target": True,
        "num_queries": 0,
        "query_source": "exact search (gallery below brute_force_below)",
    }
    threshold_info = {"method": "exact: brute force", "default": "exact", "file": None}
    return _Searchers(x, ids, "brute_force", {"exact": True}, ann, threshold_info, {})


def _scann(x: np.ndarray, ids: np.ndarray, folder: str, queries, thresholds, config: BuildConfig) -> _Searchers:
    """Builds the threshold partitions (rows reordered by leaf) and the ScaNN searcher into ``folder``, tunes its
    top-10 search for ``target_recall`` and its approximate threshold search for ``target_set_recall`` at the
    calibrated ``thresholds``, and times each step (``build_phases_seconds``: the threshold search's share,
    issue #32)."""
    n = len(x)
    p = default_params(n, config.params)
    phases, lap = {}, [time.time()]

    def phase(name: str) -> None:
        phases[name] = round(time.time() - lap[0], 3)
        lap[0] = time.time()

    partitions = None
    if config.threshold_partitions:
        partition_leaves = min(max(n // PARTITION_LEAF_ITEMS, p.num_leaves), MAX_PARTITION_LEAVES)
        order, partitions, x = build_partitions(x, partition_leaves, seed=config.seed, ordered=True)
        ids = ids[order]
        partitions.save(os.path.join(folder, PARTITIONS_FILE))
    phase("threshold_partitions")
    searcher = build_scann(x, p)
    q, source = evaluation_queries(x, queries, config.seed)
    exact_rows, _ = exact_search(q, x, 10)
    p.leaves_to_search, p.reorder_num_neighbors, recall, table = tune_leaves(
        searcher, q, exact_rows, p, config.target_recall
    )
    os.mkdir(os.path.join(folder, SCANN_DIR))  # mkdir, not makedirs: never re-creates a removed temporary folder
    searcher.serialize(os.path.join(folder, SCANN_DIR), relative_path=True)
    ann = {
        "recall_at_10": recall,
        "target": config.target_recall,
        "meets_target": recall >= config.target_recall,
        "num_queries": len(q),
        "query_source": source,
        "tuning": table,
    }
    params_out = dataclasses.asdict(p)
    phase("scann_and_top10_tuning")
    own_rows = None
    if queries is None:  # tuned on gallery items, not on the top-10 tuning's moved points (gallery_tuning_queries)
        q, own_rows, source = gallery_tuning_queries(x, config.seed)
    threshold_info = tune_threshold_search(
        searcher, x, partitions, params_out, q, source, thresholds, config.target_set_recall, own_rows=own_rows
    )
    phase("threshold_tuning")
    return _Searchers(x, ids, "scann", params_out, ann, threshold_info, phases)


def _index_manifest(
    built: _Searchers, meta: dict, version: int, config: BuildConfig, thresholds: dict, gallery_info, start: float
) -> dict:
    """The manifest of one index folder (format ``INDEX_FORMAT``)."""
    x, ids, n = built.x, built.ids, len(built.x)
    return {
        "format": INDEX_FORMAT,
        "version": int(version),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(time.time() - start, 3),
        "build_phases_seconds": built.phases,
        "model": model_block(meta),
        "score": SCORE,
        "num_items": n,
        "ids": {
            "file": IDS_FILE,
            "dtype": "int64",
            "count": n,
            "sha256": ids_digest(ids),
            "min": int(ids.min()),
            "max": int(ids.max()),
        },
        "embeddings": {
            "file": EMBEDDINGS_FILE,
            "dtype": "float32",
            "order": "leaf" if built.kind == "scann" and config.threshold_partitions else "input",
            "sha256": embeddings_digest(x),
        },
        "kind": built.kind,
        "brute_force_below": config.brute_force_below,
        "params": built.params,
        "threshold_search": built.threshold_search,
        "ann": built.ann,
        "thresholds": thresholds,
        "gallery": gallery_info or {},
    }


def write_index_folder(
    embeddings,
    ids,
    folder: str,
    meta: dict,
    *,
    version: int,
    config: BuildConfig | None = None,
    thresholds=None,
    queries=None,
    gallery_info: dict | None = None,
    probability: dict | None = None,
    calibration=None,
) -> dict:
    """Writes one index folder (format ``ce_retrieval.index/1``) into the existing, empty ``folder`` and returns
    its manifest: builds and tunes the searcher (:func:`_scann`, or :func:`_brute_force` below
    ``config.brute_force_below``), stores the arrays, writes the manifest (atomically) and loads the folder back
    with :meth:`GalleryIndex.load` before returning. ``meta`` is the image encoder's export metadata. Publishing the
    folder (atomically) is the caller's job: ``build_index`` writes into its temporary version folder, the sharded
    builder into one subfolder of it per shard.

    ``config.threshold_partitions=False`` skips the threshold partitions (the k-means of ~128 items a leaf: about a
    quarter of a 1M build, ``build_phases_seconds`` in the manifest): the approximate threshold search then has no
    leaf expansion, no probe and no familiarity check (its answers carry the measured figure for every query), and
    the exact one is a plain scan."""
    config = config or BuildConfig()
    start = time.time()
    x, ids = check_gallery(embeddings, ids, meta["embedding_dim"], version)
    thresholds_out = thresholds_block(len(x), thresholds, probability, calibration)
    if len(x) < config.brute_force_below:
        built = _brute_force(x, ids, config)
    else:
        built = _scann(x, ids, folder, queries, thresholds_out["threshold_at_precision"], config)
    np.save(os.path.join(folder, EMBEDDINGS_FILE), built.x)
    np.save(os.path.join(folder, IDS_FILE), built.ids)
    manifest = _index_manifest(built, meta, version, config, thresholds_out, gallery_info, start)
    layout.write_json(os.path.join(folder, layout.INDEX_MANIFEST), manifest)
    GalleryIndex.load(folder, expected_model=meta, mmap=True)  # the folder must load before it is published
    return manifest


def build_index(
    embeddings,
    ids,
    export_dir: str,
    version: int | None = None,
    *,
    config: BuildConfig | None = None,
    thresholds=None,
    queries=None,
    overwrite: bool = False,
    gallery_info: dict | None = None,
    probability: dict | None = None,
    calibration=None,
) -> dict:
    """Builds and publishes ``<export_dir>/index/<version>/`` for gallery ``embeddings`` [n, d] with ``ids`` [n].

    ``embeddings`` must come from ``image_encoder/<version>`` (unit norm). ``config``: how to build it
    (:class:`BuildConfig`: recall targets, brute-force size, ScaNN parameters, seed, threshold partitions).
    ``thresholds`` maps a precision level to the score reaching it on a validation split
    (``evaluation.calibration.global_pr_auc``'s ``threshold_at_precision``). ``queries`` (unit vectors, e.g.
    validation caption embeddings) are used to measure ANN recall@10 and the approximate threshold search's set
    recall; by default a sample of the gallery. ``probability``: a score -> P(relevant) map fitted on the
    calibration split (``evaluation.probability.fit_probability_map(...).to_json()``), stored beside the thresholds.
    ``calibration`` (``evaluation.split_calibration.calibrate_split(...)``) replaces both: the thresholds are then
    derived for this gallery's size, with the guarantee beside the estimate. Returns the manifest.
    """
    export_dir = os.path.abspath(export_dir)
    version, meta = resolve_version(export_dir, version)
    x, ids = check_gallery(embeddings, ids, meta["embedding_dim"], version)
    final = layout.version_dir(export_dir, layout.INDEX, version)
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite=True / --overwrite to replace it atomically)")
    with atomic_directory(final, overwrite=overwrite) as tmp:  # published only if everything below succeeds
        return write_index_folder(
            x,
            ids,
            tmp,
            meta,
            version=version,
            config=config,
            thresholds=thresholds,
            queries=queries,
            gallery_info=gallery_info,
            probability=probability,
            calibration=calibration,
        )

"""Recalibrate a served index on a few labelled captions of a new domain (``ce-retrieval calibrate``).

A model served on data unlike its validation split breaks its promises: the guaranteed thresholds assume that
served queries and images are drawn like the calibration data (``evaluation.guarantee``). With labelled captions
of the served domain (``data.relevance_labels``) the promises are made again, without retraining and without
re-embedding the gallery:

1. the captions are embedded with the exported text encoder of the served version v (``Searcher.embed``);
2. they are scored against the index's own gallery embeddings (``embeddings.npy`` of the index folder, or of every
   shard), every caption x item pair, relevant iff the item's id is among the caption's labelled ids;
3. ``split_calibration.calibrate_split`` fits the size-free rates with their clustered bounds and the
   P(relevant | score) map on those pairs; the thresholds are derived for the index's gallery size (and each
   shard's), at the levels and confidence of the index's previous calibration unless given;
4. the result is published as a new version derived from v (``derived_version``): v's encoders and index, hard
   linked, with rewritten manifests that record the new thresholds and where they came from (``recalibration``:
   labels file, its SHA-256, number of labelled queries, date, the version recalibrated and its thresholds). A
   ScaNN folder's approximate threshold search is re-tuned at the new thresholds on the labelled captions, so its
   recorded set recall speaks about them.

The service loads the new version as it loads any newer one (its watcher, or ``POST /admin/reload``).

What it guarantees: with confidence 1 - delta, "score >= threshold" has precision >= p on new queries of the
population the labelled captions were drawn from, against this gallery. Below ``MIN_LABELLED_QUERIES`` captions
the clustered bounds have too few units to mean anything, and recalibration is refused; with a few hundred,
expect the higher levels to be refused (the refusal says so), not guessed.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np

from ce_retrieval.build.derived_version import derive_version
from ce_retrieval.build.index import model_block
from ce_retrieval.build.sharded import threshold_search_summary
from ce_retrieval.build.tuning import TARGET_SET_RECALL, tune_threshold_search
from ce_retrieval.data.relevance_labels import RelevanceLabels, positives_in_gallery, query_units
from ce_retrieval.evaluation.guarantee import DEFAULT_DELTA
from ce_retrieval.evaluation.split_calibration import DEFAULT_LEVELS, Calibration, calibrate_split
from ce_retrieval.search import layout
from ce_retrieval.search.gallery import GalleryIndex
from ce_retrieval.search.sharded import ShardedIndex
from ce_retrieval.serve.searcher import Searcher

__all__ = ["MIN_LABELLED_QUERIES", "Recalibrated", "calibrate_on_index", "publish_recalibration", "recalibrate_index"]

MIN_LABELLED_QUERIES = 20
QUERY_SOURCE = "labelled captions of the recalibration"


@dataclasses.dataclass
class Recalibrated:
    """What ``recalibrate_index`` published: the new version, recalibrated from ``from_version``, and its index
    manifest (``manifest["thresholds"]``: the new promises; ``manifest["recalibration"]``: their provenance)."""

    version: int
    from_version: int
    manifest: dict


def gallery_arrays(index) -> tuple[np.ndarray, np.ndarray]:
    """The served gallery's embeddings [M, d] and ids [M] as the index stores them (every shard's, in order)."""
    parts = index.shards if isinstance(index, ShardedIndex) else [index]
    return np.concatenate([p.embeddings for p in parts]), np.concatenate([p.ids for p in parts])


def promise_settings(manifest: dict, export_meta: dict, levels=None, delta=None) -> tuple[tuple, float]:
    """(levels, delta): as given, else the index's previous calibration's, else the export config's ``evaluation``
    block, else the defaults."""
    previous = (manifest.get("thresholds") or {}).get("calibration") or {}
    evaluation = ((export_meta.get("metadata") or {}).get("config") or {}).get("evaluation") or {}
    if levels is None:
        levels = previous.get("levels") or evaluation.get("precision_levels") or DEFAULT_LEVELS
    if delta is None:
        delta = previous.get("delta") or evaluation.get("delta") or DEFAULT_DELTA
    return tuple(float(p) for p in levels), float(delta)


def calibrate_on_index(
    query_emb, index, labels: RelevanceLabels, *, levels, delta: float, relevant_per_query=None
) -> Calibration:
    """The calibration of labelled captions (embeddings ``query_emb``) against the gallery of ``index`` (a
    GalleryIndex or ShardedIndex); ValueError for too few captions, ids the gallery lacks, or no relevant pair."""
    if len(labels) < MIN_LABELLED_QUERIES:
        raise ValueError(
            f"{len(labels)} labelled captions are too few: at least {MIN_LABELLED_QUERIES} are needed, and with fewer "
            "than a few hundred the guarantee will refuse the higher precision levels"
        )
    x, ids = gallery_arrays(index)
    rows, cols = positives_in_gallery(labels, ids)
    if len(rows) == 0:
        raise ValueError(f"no labelled caption names a relevant item of the gallery ({labels.source['file']})")
    source = {**labels.source, "num_labelled_queries": len(labels), "num_relevant_pairs": int(len(rows))}
    return calibrate_split(
        query_emb,
        x,
        query_units(labels),
        np.arange(len(ids)),
        positives=(rows, cols),
        levels=levels,
        delta=delta,
        relevant_per_query=relevant_per_query,
        source=source,
    )


def _rewrite_folder(folder: str, meta: dict, version: int, calibration: Calibration, queries, extra: dict) -> dict:
    """One index folder's manifest for the derived version: model binding, thresholds for its own size, a
    re-tuned approximate threshold search (ScaNN folders), the provenance; written atomically and loaded back."""
    path = os.path.join(folder, layout.INDEX_MANIFEST)
    manifest = layout.read_json(path)
    manifest.update(
        version=version, model=model_block(meta), thresholds=calibration.for_gallery(manifest["num_items"]), **extra
    )
    if manifest["kind"] == "scann":
        index = GalleryIndex.load(folder, expected_model=meta, mmap=True)
        target = (manifest["threshold_search"].get("approximate") or {}).get("target", TARGET_SET_RECALL)
        manifest["threshold_search"] = tune_threshold_search(
            index.scann,
            index.embeddings,
            index.partitions,
            manifest["params"],
            np.asarray(queries, np.float32),
            QUERY_SOURCE,
            manifest["thresholds"]["threshold_at_precision"],
            target,
        )
    layout.write_json(path, manifest)
    GalleryIndex.load(folder, expected_model=meta, mmap=True)  # the folder must load before it is published
    return manifest


def gallery_digest(manifest: dict) -> list:
    """The ids and embeddings checksums of an index manifest (every shard's for a sharded one)."""
    if manifest.get("kind") == "sharded":
        return [(s["ids_sha256"], s["embeddings_sha256"]) for s in manifest["shards"]]
    return [(manifest["ids"]["sha256"], manifest["embeddings"]["sha256"])]


def publish_recalibration(
    export_dir: str, from_version: int, calibration: Calibration, queries, old: dict, labels_source: dict
) -> Recalibrated:
    """Publishes version ``from_version`` with ``calibration``'s thresholds as a new version (module docstring,
    step 4). ``queries``: the labelled captions' embeddings (to re-tune a ScaNN folder's threshold search);
    ``old``: the manifest of the index the calibration was computed on (a copy holding another gallery, an index
    rebuilt meanwhile, is refused)."""
    previous = old.get("thresholds") or {}
    recalibration = {
        "from_version": int(from_version),
        "from_export_id": old["model"]["export_id"],
        "labels": dict(labels_source),
        "num_labelled_queries": calibration.rates.num_queries,
        "num_relevant_pairs": calibration.rates.num_positives,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "previous_thresholds": {
            "guaranteed": (previous.get("guaranteed") or {}).get("threshold_at_precision"),
            "estimated": previous.get("threshold_at_precision"),
            "calibration_source": (previous.get("calibration") or {}).get("source"),
        },
    }

    def rewrite(index_dir: str, meta: dict, version: int) -> dict:
        extra = {"recalibration": recalibration, "created_at": recalibration["date"]}
        if gallery_digest(layout.read_json(os.path.join(index_dir, layout.INDEX_MANIFEST))) != gallery_digest(old):
            raise RuntimeError(f"index version {from_version} was rebuilt while it was recalibrated; run again")
        if old["kind"] != "sharded":
            return _rewrite_folder(index_dir, meta, version, calibration, queries, extra)
        shards = [
            _rewrite_folder(os.path.join(index_dir, s["name"]), meta, version, calibration, queries, extra)
            for s in old["shards"]
        ]
        manifest = dict(old, version=version, model=model_block(meta), **extra)
        manifest["thresholds"] = calibration.for_gallery(manifest["num_items"])  # the whole gallery's size
        manifest["threshold_search"] = threshold_search_summary(shards)
        layout.write_json(os.path.join(index_dir, layout.INDEX_MANIFEST), manifest)
        ShardedIndex.load(index_dir, expected_model=meta, mmap=True).close()  # must load before it is published
        return manifest

    reason = {"by": "ce-retrieval calibrate", "labels": labels_source.get("file")}
    version, manifest = derive_version(export_dir, from_version, rewrite, reason)
    return Recalibrated(version, int(from_version), manifest)


def recalibrate_index(
    export_dir: str,
    labels: RelevanceLabels,
    *,
    version: int | None = None,
    levels=None,
    delta: float | None = None,
    relevant_per_query: float | None = None,
    batch_size: int = 256,
) -> Recalibrated:
    """Recalibrates servable ``version`` (default: the newest) of ``export_dir`` on ``labels`` and publishes the
    result as a new version (module docstring). ``levels`` / ``delta``: the previous calibration's by default;
    ``relevant_per_query``: as measured on the labels by default."""
    export_dir = os.path.abspath(export_dir)
    searcher = Searcher.load(export_dir, version)
    try:
        levels, delta = promise_settings(searcher.index.manifest, searcher.metadata, levels, delta)
        queries = searcher.embed(labels.captions, batch_size)
        calibration = calibrate_on_index(
            queries, searcher.index, labels, levels=levels, delta=delta, relevant_per_query=relevant_per_query
        )
    finally:
        searcher.index.close()
    return publish_recalibration(
        export_dir, searcher.version, calibration, queries, searcher.index.manifest, labels.source
    )

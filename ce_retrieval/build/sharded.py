"""Build a gallery index split into shards, in parallel processes (the loading side is ``search.sharded``).

One index folder must fit one machine's memory and one build process's time; a sharded index splits the gallery
into S disjoint shards, each an ordinary index folder (``ce_retrieval.index/1``, built by
:func:`~ce_retrieval.build.index.write_index_folder`, loadable by :meth:`GalleryIndex.load` and servable on its own
machine), under one version folder:

    <export_dir>/index/<version>/
        manifest.json                   format ce_retrieval.sharded_index/1: model, thresholds, shard list, ANN recall
        shard-00000-of-00008/           an ordinary index folder (manifest.json, embeddings.npy, ids.npy, ...)
        ...
        shard-00007-of-00008/

Why each piece:

* **Assignment** ``shard = splitmix64(uint64(id)) mod S`` (:mod:`ce_retrieval.search.assignment`, shared with the
  Beam pipeline) depends on the gallery id only, so an id always lands in the same shard (a rebuild, an incremental
  build or a router can compute it without a lookup table), and splitmix64 spreads consecutive ids evenly.
* **One global threshold**: a calibrated threshold is a score, not a rank, so it means the same on every shard.
* **Parallel build**: shards are built by a pool of ``workers`` processes started with "spawn" (never fork: the
  parent may already run TensorFlow / ScaNN / BLAS threads). Shard inputs go to the workers as ``.npy`` files in
  the temporary version folder, not as pickled arrays. The whole version folder, shards included, is published
  with one atomic rename (``atomic_directory``), so it is invisible until complete; a killed build leaves only a
  hidden temporary folder, removed by the next build.
* **Checked before publishing**: the folder is loaded back as a :class:`~ce_retrieval.search.sharded.ShardedIndex`
  (every shard against the top-level manifest) and its merged top-10 measured against one exact search.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import multiprocessing
import os
import shutil
import time

import numpy as np

from ce_retrieval.build.index import (
    SCORE,
    BuildConfig,
    check_gallery,
    evaluation_queries,
    model_block,
    normalize_thresholds,
    resolve_version,
    thresholds_block,
    write_index_folder,
)
from ce_retrieval.build.tuning import recall_at_10
from ce_retrieval.search import layout
from ce_retrieval.search.assignment import SHARD_ASSIGNMENT, shard_name, shard_of
from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.gallery import SHARDED_FORMAT, GalleryIndex
from ce_retrieval.search.sharded import ShardedIndex
from ce_retrieval.utils.atomic import atomic_directory

__all__ = ["ShardBuildError", "build_sharded_index", "threshold_search_summary"]

_INPUTS_DIR = ".inputs"  # shard inputs for the workers, inside the temporary version folder; removed before publish


class ShardBuildError(RuntimeError):
    """Building one shard failed (the message names it); nothing was published."""


def _build_shard(task: dict) -> dict:
    """Worker: builds one shard folder from its input files (runs in a pool process or in the caller)."""
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    x = np.load(task["x"])
    ids = np.load(task["ids"])
    queries = np.load(task["queries"]) if task["queries"] else None
    os.mkdir(task["folder"])  # mkdir, not makedirs: never re-creates the temporary folder of an abandoned build
    # BLAS threads per worker: the machine's cores shared by the parallel workers, not each taking them all
    with threadpool_limits(limits=task["blas_threads"]):
        return write_index_folder(
            x,
            ids,
            task["folder"],
            task["meta"],
            version=task["version"],
            config=task["config"],
            thresholds=task["thresholds"],
            queries=queries,
            gallery_info=task["gallery_info"],
            probability=task["probability"],
            calibration=task["calibration"],
        )


def _run_tasks(tasks: list[dict], workers: int) -> dict[str, dict]:
    """Shard manifests by shard name; the first failure cancels the shards not started yet and is re-raised as
    ``ShardBuildError`` naming its shard (after the running ones finished, so no worker writes on)."""
    results: dict[str, dict] = {}
    if workers == 1:  # nothing to parallelise: no process start-up (each would import TensorFlow and ScaNN)
        for task in tasks:
            try:
                results[task["name"]] = _build_shard(task)
            except Exception as e:
                raise ShardBuildError(f"building {task['name']} failed: {type(e).__name__}: {e}") from e
        return results
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_build_shard, task): task["name"] for task in tasks}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            try:
                results[name] = future.result()
            except Exception as e:
                for other in futures:
                    other.cancel()
                hint = ""
                if isinstance(e, concurrent.futures.BrokenExecutor):
                    hint = (
                        " (a worker process died: killed, out of memory, or started from a script without the "
                        "`if __name__ == '__main__':` guard that spawned processes need; workers=1 builds in-process)"
                    )
                raise ShardBuildError(f"building {name} failed: {type(e).__name__}: {e}{hint}") from e
    return results


def _global_ann(index: ShardedIndex, x: np.ndarray, ids: np.ndarray, queries, seed: int, target: float) -> dict:
    """Recall@10 of the merged sharded top-10 against one exact search over the whole gallery."""
    shard_recalls = [s.manifest["ann"]["recall_at_10"] for s in index.shards]
    common = {
        "target": target,
        "shard_recall_at_10_min": min(shard_recalls),
        "all_shards_meet_target": all(s.manifest["ann"]["meets_target"] for s in index.shards),
        "merge": "exact: top-k of the union of the shards' top-k lists (score descending, then id ascending)",
    }
    if all(s.scann is None for s in index.shards):
        return {
            "recall_at_10": 1.0,
            "meets_target": True,
            "num_queries": 0,
            "query_source": "exact search (every shard below brute_force_below)",
            **common,
        }
    q, source = evaluation_queries(x, queries, seed)
    exact_rows, _ = exact_search(q, x, 10)
    got_ids, _ = index.topk(q, 10)
    recall = recall_at_10(got_ids, ids[exact_rows])
    return {
        "recall_at_10": recall,
        "meets_target": recall >= target,
        "num_queries": len(q),
        "query_source": source,
        **common,
    }


def build_sharded_index(
    embeddings,
    ids,
    export_dir: str,
    version: int | None = None,
    *,
    num_shards: int,
    workers: int | None = None,
    thresholds=None,
    queries=None,
    config: BuildConfig | None = None,
    overwrite: bool = False,
    gallery_info: dict | None = None,
    probability: dict | None = None,
    calibration=None,
) -> dict:
    """Builds and publishes a sharded ``<export_dir>/index/<version>/`` of ``num_shards`` shards; returns the
    top-level manifest.

    Arguments as for :func:`ce_retrieval.build.index.build_index`; each shard is an ordinary index of its own
    items built with the same ``config`` (ScaNN when it holds at least ``config.brute_force_below`` of them, tuned
    for ``config.target_recall`` and ``config.target_set_recall`` on the same ``queries``), carrying the same
    thresholds (from a ``calibration``: derived for the shard's own size, and the
    top-level manifest's for the whole gallery). ``workers`` processes build shards in parallel (default
    ``min(num_shards, os.cpu_count())``, or 1 when every shard is below ``brute_force_below``; 1 builds them one
    after another in this process). The merged top-10 is measured against exact search over the whole gallery
    and recorded under ``ann``.
    """
    start = time.time()
    config = config or BuildConfig()
    export_dir = os.path.abspath(export_dir)
    version, meta = resolve_version(export_dir, version)
    x, ids = check_gallery(embeddings, ids, meta["embedding_dim"], version)
    assignment, counts = _assign(ids, num_shards)
    num_shards = len(counts)
    workers = _worker_count(workers, num_shards, int(counts.max()) >= config.brute_force_below)
    thresholds_out = thresholds_block(len(x), thresholds, probability, calibration)  # the whole gallery's size
    thresholds = normalize_thresholds(thresholds)
    final = layout.version_dir(export_dir, layout.INDEX, version)
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite=True / --overwrite to replace it atomically)")

    with atomic_directory(final, overwrite=overwrite) as tmp:  # published only if every shard and check succeeds
        inputs = os.path.join(tmp, _INPUTS_DIR)
        os.mkdir(inputs)
        common = {
            "meta": meta,
            "version": version,
            "thresholds": thresholds,
            "config": config,
            "probability": probability,
            "calibration": calibration,
            "blas_threads": None if workers == 1 else max(1, (os.cpu_count() or 1) // workers),
        }
        tasks = _write_shard_inputs(tmp, inputs, x, ids, assignment, num_shards, queries, gallery_info, common)
        built = _run_tasks(tasks, workers)
        shutil.rmtree(inputs)
        manifest = {
            "format": SHARDED_FORMAT,
            "version": version,
            "kind": "sharded",
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": model_block(meta),
            "score": SCORE,
            "num_items": len(x),
            "num_shards": num_shards,
            "shard_assignment": SHARD_ASSIGNMENT,
            "shards": [_shard_entry(task["name"], built[task["name"]]) for task in tasks],
            "brute_force_below": config.brute_force_below,
            "workers": workers,
            "threshold_search": threshold_search_summary([built[task["name"]] for task in tasks]),
            "thresholds": thresholds_out,
            "gallery": gallery_info or {},
        }
        shards = [GalleryIndex.load(task["folder"], expected_model=meta, mmap=True) for task in tasks]
        index = ShardedIndex(tmp, manifest, shards)  # checks the manifest against the shards
        try:
            manifest["ann"] = _global_ann(index, x, ids, queries, config.seed, config.target_recall)
        finally:
            index.close()
        manifest["build_seconds"] = round(time.time() - start, 3)
        layout.write_json(os.path.join(tmp, layout.INDEX_MANIFEST), manifest)
        ShardedIndex.load(tmp, expected_model=meta, mmap=True).close()  # the folder must load before it is published
    return manifest


def _assign(ids: np.ndarray, num_shards) -> tuple[np.ndarray, np.ndarray]:
    """The shard of every id and the number of ids per shard; refuses a shard count that leaves a shard empty."""
    n = len(ids)
    if isinstance(num_shards, bool) or not isinstance(num_shards, int | np.integer):
        raise TypeError(f"num_shards must be an integer, got {num_shards!r}")
    num_shards = int(num_shards)
    if not 1 <= num_shards <= n:
        raise ValueError(f"num_shards must be between 1 and the gallery size {n}, got {num_shards}")
    assignment = shard_of(ids, num_shards)
    counts = np.bincount(assignment, minlength=num_shards)
    empty = [shard_name(i, num_shards) for i in np.flatnonzero(counts == 0)]
    if empty:
        raise ValueError(
            f"{empty[0]} would be empty ({len(empty)} of {num_shards} shards get no id of the {n}-item gallery); "
            "use fewer shards"
        )
    return assignment, counts


def _worker_count(workers: int | None, num_shards: int, any_scann_shard: bool) -> int:
    """Build processes: as asked (at most one per shard), by default one per shard up to the CPU count, and 1
    when every shard is brute force (they only store their arrays: not worth starting processes for)."""
    if workers is None:
        workers = min(num_shards, os.cpu_count() or 1) if any_scann_shard else 1
    workers = int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return min(workers, num_shards)


def _write_shard_inputs(
    tmp: str, inputs: str, x, ids, assignment, num_shards: int, queries, gallery_info, common: dict
) -> list[dict]:
    """Saves each shard's rows (input order kept within a shard) and the queries as ``.npy`` files under
    ``inputs`` for the workers; returns one :func:`_build_shard` task per shard."""
    queries_file = None
    if queries is not None:
        queries_file = os.path.join(inputs, "queries.npy")
        np.save(queries_file, np.asarray(queries, dtype=np.float32))
    tasks = []
    for i in range(num_shards):
        name = shard_name(i, num_shards)
        rows = np.flatnonzero(assignment == i)
        np.save(os.path.join(inputs, f"{name}-x.npy"), x[rows])
        np.save(os.path.join(inputs, f"{name}-ids.npy"), ids[rows])
        tasks.append(
            {
                "name": name,
                "folder": os.path.join(tmp, name),
                "x": os.path.join(inputs, f"{name}-x.npy"),
                "ids": os.path.join(inputs, f"{name}-ids.npy"),
                "queries": queries_file,
                "gallery_info": dict(gallery_info or {}, shard=name, num_shards=num_shards),
                **common,
            }
        )
    return tasks


def threshold_search_summary(built: list[dict]) -> dict:
    """How the shards answer threshold queries: each runs its own search (approximate where its build measured the
    set recall target, else exact) and the union is exact over what they return, so the merged set recall is at
    least the lowest shard's (it is the hit-weighted mean of theirs)."""
    approx = [b["threshold_search"].get("approximate") for b in built]
    recalls = [a["set_recall_min"] for a in approx if a and a.get("set_recall_min") is not None]
    return {
        "method": "union of the shards' threshold answers (each shard: its own manifest's threshold_search)",
        "shard_defaults": [b["threshold_search"]["default"] for b in built],
        "shard_set_recall_min": min(recalls) if recalls else None,
    }


def _shard_entry(name: str, built: dict) -> dict:
    """A shard's line in the top-level manifest, from the manifest its build wrote."""
    return {
        "name": name,
        "num_items": built["num_items"],
        "ids_sha256": built["ids"]["sha256"],
        "embeddings_sha256": built["embeddings"]["sha256"],
        "kind": built["kind"],
        "recall_at_10": built["ann"]["recall_at_10"],
        "build_seconds": built["build_seconds"],
    }

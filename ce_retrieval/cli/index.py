"""``ce-retrieval index --export_dir E (--images SOURCE | --embeddings DIR) [--shards S] ...``: the gallery index
next to an export (:func:`ce_retrieval.build.index.build_index`, or with ``--shards S > 1``
:func:`ce_retrieval.build.sharded.build_sharded_index`, built by ``--workers`` processes).

``--images`` is a split name of the export's data config (e.g. ``test``), a folder of .jpg/.png files (integer
file names become ids) or a TFRecord file pattern; the images are embedded here with the exported image encoder.
``--embeddings`` is the output folder of the Beam embedding pipeline (``ce_retrieval.build.pipeline``), which
embedded a large gallery already; it is refused unless its model fingerprint is this export version's.
With ``--calibration_split`` the export is calibrated on that split (``evaluation.split_calibration``): for each
level of ``--precision_levels`` a threshold guaranteed with confidence 1 - ``--delta`` for *this* gallery's size,
the point estimate beside it, and the score -> P(relevant) map at the gallery's base rate. ``--thresholds_json``
takes thresholds from a file instead: an evaluation report's calibration (recomputed for this gallery), or bare
``threshold_at_precision`` (served as estimates only, without a guarantee).
"""

from __future__ import annotations

import json
import os

import numpy as np

from ce_retrieval.build.gallery_source import data_config_of, read_images, resolve_source
from ce_retrieval.build.index import BRUTE_FORCE_BELOW, BuildConfig, build_index
from ce_retrieval.build.sharded import build_sharded_index
from ce_retrieval.search import layout
from ce_retrieval.search.ann import IndexParams

__all__ = ["add_arguments", "run"]


def _embed_batches(signature, input_name: str, values: list, batch_size: int) -> np.ndarray:
    import tensorflow as tf

    out = [
        signature(**{input_name: tf.constant(values[i : i + batch_size], dtype=tf.string)})["embedding"].numpy()
        for i in range(0, len(values), batch_size)
    ]
    return np.concatenate(out, axis=0)


def _corrupt_policy(meta: dict) -> tuple[str, bool]:
    """(on_corrupt, validate) of the export's data config for a split gallery; ("fail", False) without one."""
    try:
        cfg = data_config_of(meta)
    except ValueError:
        return "fail", False
    return ("skip" if cfg.skip_corrupt else "fail"), bool(cfg.validate_images)


def _read_gallery(source: str, meta: dict) -> tuple[list[bytes], np.ndarray, dict]:
    """The images and ids of ``--images`` (:func:`ce_retrieval.build.gallery_source.resolve_source`, the Beam
    pipeline's reader too) and the provenance that goes into the index manifest."""
    on_corrupt, validate = _corrupt_policy(meta)
    src = resolve_source(source, export_meta=meta, on_corrupt=on_corrupt)
    images, ids = read_images(src, on_corrupt if validate and src.info["kind"] == "split" else None)
    info = {"source": source}
    if "names" in src.info:
        info["names"] = src.info["names"]  # row i of the folder listing has id i
    return images, ids, info


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--images",
        help="gallery: a split name of the export's data config (e.g. test), a folder of "
        ".jpg/.png files (integer file names become ids) or a TFRecord file pattern",
    )
    source.add_argument(
        "--embeddings",
        help="gallery: an output folder of the Beam embedding pipeline (embeddings of this export version's "
        "image encoder, with ids and a manifest)",
    )
    parser.add_argument("--version", type=int, default=None, help="export version (default: newest complete)")
    parser.add_argument(
        "--calibration_split",
        default=None,
        help="split used to calibrate thresholds (global PR) and measure ANN recall, e.g. val",
    )
    parser.add_argument(
        "--thresholds_json",
        default=None,
        help="JSON file with threshold_at_precision (e.g. an evaluation report) instead of calibrating",
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=None,
        help="promises hold with confidence 1 - delta (default: the export config's evaluation.delta, 0.1)",
    )
    parser.add_argument(
        "--precision_levels",
        default=None,
        help="comma-separated precisions to offer (default: the export config's evaluation.precision_levels)",
    )
    parser.add_argument(
        "--relevant_per_query",
        type=float,
        default=None,
        help="relevant gallery items per query on the served gallery (default: as measured on the calibration split)",
    )
    parser.add_argument(
        "--distractors", type=int, default=0, help="add N synthetic distractor images (ids -1, -2, ...)"
    )
    parser.add_argument("--target_recall", type=float, default=0.95)
    parser.add_argument("--brute_force_below", type=int, default=BRUTE_FORCE_BELOW)
    parser.add_argument("--num_leaves", type=int, default=None)
    parser.add_argument("--leaves_to_search", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument(
        "--shards", type=int, default=1, help="split the index into S shards (default 1: one index folder)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="with --shards S > 1: processes building shards in parallel (default min(S, CPUs); 1 = in this process)",
    )
    parser.add_argument("--overwrite", action="store_true")


def _pipeline_gallery(path: str, meta: dict, version: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Embeddings, ids and provenance of a Beam pipeline output folder, refused unless this model made them."""
    from ce_retrieval.build.pipeline import load_embedded_gallery  # lazy: Beam only for this source

    embeddings, ids, manifest = load_embedded_gallery(path, verify=True)
    # the export fingerprint (both towers) under "model" or "export", else the image tower's own
    made_by = manifest.get("model") or manifest.get("export") or {}
    if made_by.get("fingerprint") is not None:
        recorded, expected = made_by["fingerprint"], meta.get("fingerprint")
    else:
        recorded, expected = made_by.get("image_fingerprint"), meta.get("image_fingerprint")
    if recorded is None or recorded != expected:
        raise SystemExit(
            f"error: {path} was embedded by model fingerprint {str(recorded)[:12]}, but export version "
            f"{version}'s image encoder is {str(expected)[:12]}; re-run the embedding pipeline (embed-gallery) "
            "with this export version"
        )
    corrupt = (manifest.get("corrupt") or {}).get("count")
    return embeddings, ids, {"source": path, "embedded_gallery": {"export": made_by, "corrupt": corrupt}}


class _Encoders:
    """The export version's encoder signatures, each loaded on first use (a pipeline gallery with thresholds from a
    file needs neither)."""

    def __init__(self, export_dir: str, version: int):
        self.export_dir, self.version = export_dir, version
        self._loaded: dict[str, object] = {}

    def __call__(self, part: str):
        from ce_retrieval.build.export import load_signature

        if part not in self._loaded:
            _, self._loaded[part] = load_signature(layout.version_dir(self.export_dir, part, self.version))
        return self._loaded[part]


def _resolve_inputs(args) -> tuple[str, int, dict]:
    """(export_dir, version, image encoder metadata) after checking the arguments: the given complete version, else
    the newest one."""
    if args.shards < 1:
        raise SystemExit(f"error: --shards must be >= 1, got {args.shards}")
    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"error: --workers must be >= 1, got {args.workers}")
    export_dir = os.path.abspath(args.export_dir)
    complete = layout.complete_versions(export_dir)
    version = args.version if args.version is not None else (complete[-1] if complete else None)
    if version is None or version not in complete:
        raise SystemExit(f"error: no complete export version {version if version else ''} in {export_dir}")
    return export_dir, version, layout.export_metadata(export_dir, layout.IMAGE_ENCODER, version)


def _embed_gallery(args, meta: dict, version: int, encoders: _Encoders) -> tuple[np.ndarray, np.ndarray, dict]:
    """The gallery's embeddings, ids and provenance: a pipeline output folder as it is, or ``--images`` embedded
    with the image encoder, plus ``--distractors`` synthetic images (ids -1, -2, ...)."""
    from ce_retrieval.build.export import IMAGE_INPUT

    if args.embeddings is not None:
        embeddings, ids, info = _pipeline_gallery(args.embeddings, meta, version)
    else:
        image_fn = encoders(layout.IMAGE_ENCODER)
        images, ids, info = _read_gallery(args.images, meta)
        embeddings = _embed_batches(image_fn, IMAGE_INPUT, list(images), args.batch_size)
    if args.distractors:
        from ce_retrieval.data.synthetic import distractor_images

        cfg = data_config_of(meta)
        extra = distractor_images(
            args.distractors, seed=getattr(cfg, "seed", 0) + 7919, image_size=getattr(cfg, "image_size", 64)
        )
        extra_emb = _embed_batches(encoders(layout.IMAGE_ENCODER), IMAGE_INPUT, list(extra), args.batch_size)
        embeddings = np.concatenate([embeddings, extra_emb])
        ids = np.concatenate([np.asarray(ids, dtype=np.int64), -np.arange(1, len(extra) + 1)])
        info["distractors"] = len(extra)
    return embeddings, ids, info


def _thresholds_and_queries(args, meta: dict, encoders: _Encoders, info: dict):
    """(thresholds, queries, calibration): from ``--thresholds_json``, and with ``--calibration_split`` that split's
    caption embeddings as the build's queries and, unless the file gave thresholds, its :func:`_calibrate`."""
    from ce_retrieval.build.export import IMAGE_INPUT, TEXT_INPUT

    thresholds, queries, calibration = None, None, None
    if args.thresholds_json:
        thresholds, calibration = _thresholds_file(args.thresholds_json)
    if args.calibration_split:
        from ce_retrieval.data import load_retrieval_split

        image_fn, text_fn = encoders(layout.IMAGE_ENCODER), encoders(layout.TEXT_ENCODER)
        cal = load_retrieval_split(data_config_of(meta), args.calibration_split)
        queries = _embed_batches(text_fn, TEXT_INPUT, list(cal.captions), args.batch_size)
        cal_docs = _embed_batches(image_fn, IMAGE_INPUT, list(cal.images), args.batch_size)
        if thresholds is None and calibration is None:
            calibration = _calibrate(args, meta, queries, cal_docs, cal, {"split": args.calibration_split})
        info["calibration_split"] = args.calibration_split
    return thresholds, queries, calibration


def _build(args, embeddings, ids, export_dir: str, version: int, **inputs) -> tuple[dict, str, bool]:
    """Builds the index (sharded with ``--shards S > 1``) with the command line's :class:`BuildConfig`; returns the
    manifest, its layout in words and whether it met its recall targets."""
    config = BuildConfig(
        target_recall=args.target_recall,
        brute_force_below=args.brute_force_below,
        params=IndexParams(num_leaves=args.num_leaves, leaves_to_search=args.leaves_to_search),
    )
    if args.shards > 1:
        manifest = build_sharded_index(
            embeddings,
            ids,
            export_dir,
            version,
            num_shards=args.shards,
            workers=args.workers,
            config=config,
            overwrite=args.overwrite,
            **inputs,
        )
        kinds = sorted({s["kind"] for s in manifest["shards"]})
        ok = manifest["ann"]["meets_target"] and manifest["ann"]["all_shards_meet_target"]
        return manifest, f"{manifest['num_shards']} shards ({', '.join(kinds)})", ok
    manifest = build_index(embeddings, ids, export_dir, version, config=config, overwrite=args.overwrite, **inputs)
    return manifest, manifest["kind"], manifest["ann"]["meets_target"]


def run(args) -> int:
    """Resolve the inputs, embed the gallery, calibrate, build; exit status 1 when a recall target was missed."""
    export_dir, version, meta = _resolve_inputs(args)
    encoders = _Encoders(export_dir, version)
    embeddings, ids, info = _embed_gallery(args, meta, version, encoders)
    thresholds, queries, calibration = _thresholds_and_queries(args, meta, encoders, info)
    manifest, layout_text, ok = _build(
        args,
        embeddings,
        ids,
        export_dir,
        version,
        thresholds=thresholds,
        queries=queries,
        gallery_info=info,
        calibration=calibration,
    )
    ann = manifest["ann"]
    print(
        f"index version {version}: {manifest['num_items']} items, {layout_text}, "
        f"recall@10 {ann['recall_at_10']:.4f} (target {ann['target']}), built in {manifest['build_seconds']} s"
    )
    print(describe_thresholds(manifest["thresholds"]))
    return 0 if ok else 1


def _promise_settings(args, meta: dict) -> tuple[tuple, float]:
    """(levels, delta): the command line's, else the export config's ``evaluation`` block, else the defaults."""
    from ce_retrieval.evaluation.guarantee import DEFAULT_DELTA
    from ce_retrieval.evaluation.split_calibration import DEFAULT_LEVELS

    evaluation = (((meta.get("metadata") or {}).get("config") or {}).get("evaluation")) or {}
    levels = (
        tuple(float(v) for v in args.precision_levels.split(","))
        if args.precision_levels
        else tuple(evaluation.get("precision_levels") or DEFAULT_LEVELS)
    )
    delta = args.delta if args.delta is not None else float(evaluation.get("delta", DEFAULT_DELTA))
    return levels, delta


def _calibrate(args, meta, queries, docs, split, source):
    from ce_retrieval.evaluation.split_calibration import calibrate_split

    levels, delta = _promise_settings(args, meta)
    try:
        return calibrate_split(
            queries,
            docs,
            split.caption_ids,
            split.image_ids,
            levels=levels,
            delta=delta,
            relevant_per_query=args.relevant_per_query,
            source=source,
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def _thresholds_file(path: str):
    """(thresholds, None) for bare thresholds, (None, Calibration) for a file carrying a calibration."""
    from ce_retrieval.evaluation.split_calibration import Calibration

    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    block = report.get("calibration") if isinstance(report.get("calibration"), dict) else {}
    source = report.get("calibration_split") if isinstance(report.get("calibration_split"), dict) else {}
    stored = report.get("split_calibration") or block.get("split_calibration") or source.get("split_calibration")
    if stored:
        return None, Calibration.from_json(stored)
    thresholds = report.get("threshold_at_precision") or block.get("threshold_at_precision")
    if thresholds is None:
        raise SystemExit(f"error: {path} has no threshold_at_precision")
    return thresholds, None


def describe_thresholds(block: dict) -> str:
    """One line per offered precision: the guaranteed threshold (or why it is refused) and the estimate."""
    estimated = block.get("threshold_at_precision") or {}
    promise = block.get("guaranteed")
    if promise is None:
        return f"thresholds (estimated only, no guarantee): {estimated}"
    lines = [
        f"thresholds for a gallery of {promise['gallery_size']:,} items, guaranteed with confidence "
        f"{promise['confidence']:g} ({promise['num_calibration_queries']:,} calibration queries):"
    ]
    for level, entry in promise["levels"].items():
        est = estimated.get(level)
        est_text = "none" if est is None else f"{est:.4f}"
        if entry.get("threshold") is None:
            lines.append(f"  precision {level}: refused ({entry['refused']}); estimate {est_text}")
        else:
            lines.append(
                f"  precision {level}: {entry['threshold']:.4f} (precision >= {entry['precision_lower_bound']:.3f}, "
                f"recall >= {entry['recall_lower_bound']:.3f}); estimate {est_text}"
            )
    return "\n".join(lines)

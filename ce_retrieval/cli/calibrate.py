"""``ce-retrieval calibrate --export_dir E --labels FILE``: recalibrate a served index on labelled captions of a
new domain and publish it as a new version (:func:`ce_retrieval.serve.recalibrate.recalibrate_index`).

``--labels`` is JSONL (one ``{"caption": "...", "relevant": [gallery ids]}`` per line) or a Karpathy JSON file
(``--split`` keeps one split; ``--karpathy_ids`` says how its images map to the gallery's ids, as ``ce-retrieval
index`` numbered them: ``imgid`` for ``--images <split>``, ``filename`` for ``--images <folder>``); see
:mod:`ce_retrieval.data.relevance_labels`. The gallery is not re-embedded and the model is not retrained: the
captions are embedded with the served version's text encoder and scored against the index's stored embeddings.
"""

from __future__ import annotations

import os

from ce_retrieval.cli.index import describe_thresholds

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from ce_retrieval.data.relevance_labels import KARPATHY_IDS

    parser.add_argument("--export_dir", required=True)
    parser.add_argument(
        "--labels",
        required=True,
        help='labelled captions: JSONL {"caption": ..., "relevant": [gallery ids]} per line, or a Karpathy JSON file',
    )
    parser.add_argument("--split", default=None, help="Karpathy JSON only: use the images of this split")
    parser.add_argument(
        "--karpathy_ids",
        choices=KARPATHY_IDS,
        default="imgid",
        help="Karpathy JSON only: gallery id of an image: its imgid (index --images <split>) or the integer stem of "
        "its filename (index --images <folder>)",
    )
    parser.add_argument("--version", type=int, default=None, help="servable version to recalibrate (default: newest)")
    parser.add_argument(
        "--precision_levels",
        default=None,
        help="comma-separated precisions to offer (default: the levels of the index's previous calibration)",
    )
    parser.add_argument(
        "--delta", type=float, default=None, help="confidence 1 - delta (default: the previous calibration's)"
    )
    parser.add_argument(
        "--relevant_per_query",
        type=float,
        default=None,
        help="relevant gallery items per served query (default: as measured on the labels)",
    )
    parser.add_argument("--batch_size", type=int, default=256)


def run(args) -> int:
    from ce_retrieval.data.relevance_labels import read_labels
    from ce_retrieval.serve.recalibrate import recalibrate_index

    levels = None if args.precision_levels is None else [float(v) for v in args.precision_levels.split(",")]
    try:
        labels = read_labels(args.labels, split=args.split, karpathy_ids=args.karpathy_ids)
        if labels.source["format"] != "karpathy" and args.karpathy_ids != "imgid":
            raise ValueError(f"{args.labels}: --karpathy_ids applies to a Karpathy JSON file, not to JSONL labels")
        done = recalibrate_index(
            os.path.abspath(args.export_dir),
            labels,
            version=args.version,
            levels=levels,
            delta=args.delta,
            relevant_per_query=args.relevant_per_query,
            batch_size=args.batch_size,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        raise SystemExit(f"error: {exc}") from None
    source = done.manifest["recalibration"]
    print(
        f"recalibrated index version {done.from_version} on {source['num_labelled_queries']:,} labelled captions "
        f"({source['num_relevant_pairs']:,} relevant pairs, {os.path.basename(args.labels)}): published version "
        f"{done.version}"
    )
    print(describe_thresholds(done.manifest["thresholds"]))
    before = source["previous_thresholds"]["guaranteed"] or source["previous_thresholds"]["estimated"] or {}
    print(f"version {done.from_version}'s thresholds were: {before}")
    return 0

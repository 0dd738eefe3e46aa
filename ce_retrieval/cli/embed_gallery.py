"""``ce-retrieval embed-gallery --export_dir E --images SOURCE --output_dir O [...] [-- BEAM OPTIONS]``: embed a
gallery with the exported image encoder on Apache Beam (:func:`ce_retrieval.build.pipeline.embed_gallery`).

``--images`` means what it means for ``ce-retrieval index``: a split name of the export's data config (e.g.
``test``), a folder of .jpg/.png files (integer file names become ids) or a TFRecord file pattern. The output is a
folder of checksummed ``embeddings-*.npy`` / ``ids-*.npy`` shards plus ``manifest.json``
(:func:`ce_retrieval.build.pipeline.load_embedded_gallery` reads it back).

Everything after a ``--`` goes to Beam unchanged (``PipelineOptions``), e.g.
``-- --runner FlinkRunner --flink_master host:8081``. ``--workers N`` is the local shortcut for
``-- --direct_num_workers N --direct_running_mode multi_processing`` on the DirectRunner (the default runner).
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True)
    parser.add_argument(
        "--images",
        required=True,
        help="gallery: a split name of the export's data config (e.g. test), a folder of "
        ".jpg/.png files (integer file names become ids) or a TFRecord file pattern",
    )
    parser.add_argument("--output_dir", required=True, help="folder to publish (atomically) with shards + manifest")
    parser.add_argument("--version", type=int, default=None, help="export version (default: newest complete)")
    parser.add_argument("--num_shards", type=int, default=8, help="output shards; shard = splitmix64(id) mod N")
    parser.add_argument("--batch_size", type=int, default=64, help="images per call of the image encoder")
    parser.add_argument(
        "--on_corrupt",
        choices=("skip", "fail"),
        default="skip",
        help="skip: count undecodable images and list them in the manifest; fail: stop, naming the record",
    )
    parser.add_argument("--workers", type=int, default=1, help="DirectRunner workers (processes by default)")
    parser.add_argument(
        "--worker_mode",
        choices=("multi_processing", "multi_threading"),
        default="multi_processing",
        help="how --workers > 1 runs: worker processes (one model load each) or threads of this process",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
    parser.add_argument(
        "beam_args",
        nargs=argparse.REMAINDER,
        help="after `--`: Beam pipeline options passed unchanged, e.g. -- --runner DataflowRunner --project P "
        "--region R --temp_location gs://B/tmp",
    )


def _pipeline_args(args) -> list[str]:
    from ce_retrieval.build.pipeline import direct_runner_args

    beam_args = list(args.beam_args or [])
    if beam_args and beam_args[0] == "--":
        beam_args = beam_args[1:]
    if args.workers == 1:
        return beam_args
    runner = next((a.split("=", 1)[1] for a in beam_args if a.startswith("--runner=")), None)
    if "--runner" in beam_args[:-1]:
        runner = beam_args[beam_args.index("--runner") + 1]
    if runner not in (None, "DirectRunner"):
        raise SystemExit(f"error: --workers is for the DirectRunner; {runner} takes its own parallelism options")
    return direct_runner_args(args.workers, args.worker_mode) + beam_args


def run(args) -> int:
    from ce_retrieval.build.pipeline import embed_gallery
    from ce_retrieval.data.report import DataError

    try:
        manifest = embed_gallery(
            args.images,
            args.export_dir,
            args.output_dir,
            version=args.version,
            num_shards=args.num_shards,
            batch_size=args.batch_size,
            on_corrupt=args.on_corrupt,
            pipeline_args=_pipeline_args(args),
            overwrite=args.overwrite,
        )
    except (DataError, FileNotFoundError, FileExistsError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    seconds = manifest["elapsed_seconds"]
    rate = manifest["count"] / seconds if seconds > 0 else float("nan")
    print(
        f"embedded {manifest['count']} images (d={manifest['embedding_dim']}) into {manifest['num_shards']} shards "
        f"in {args.output_dir}; {manifest['corrupt']['count']} corrupt skipped; {seconds:.1f} s, {rate:.1f} images/s "
        f"on {manifest['runner']}"
    )
    return 0

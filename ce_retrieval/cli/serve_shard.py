"""``ce-retrieval serve-shard --export_dir E --shard i [--host H] [--port P] ...``: one shard of a sharded index
behind HTTP (:func:`ce_retrieval.serve.shard_server.create_shard_app`), for a router (``ce-retrieval serve
--shard_urls ...``), run by uvicorn until interrupted. It keeps the newest two versions of its shard loaded."""

from __future__ import annotations

import logging

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True, help="export whose index/<v>/ are sharded indexes")
    parser.add_argument("--shard", type=int, required=True, help="shard number i (0-based) of index/<v>/shard-i-of-S")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument(
        "--reload_interval", type=float, default=10.0, help="seconds between checks for a new version (0: off)"
    )
    parser.add_argument("--keep_versions", type=int, default=2, help="newest versions kept loaded")
    parser.add_argument("--max_queries", type=int, default=1024, help="query embeddings per request")
    parser.add_argument("--max_k", type=int, default=10_000)
    parser.add_argument("--max_results", type=int, default=100_000, help="cap on threshold hits per query")
    parser.add_argument("--max_body_bytes", type=int, default=16 << 20)
    parser.add_argument("--max_concurrency", type=int, default=4, help="searches running at once")


def run(args) -> int:
    import uvicorn

    from ce_retrieval.serve.shard_server import create_shard_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.shard < 0:
        raise SystemExit(f"--shard must be >= 0, got {args.shard}")
    app = create_shard_app(
        args.export_dir,
        args.shard,
        reload_interval_s=args.reload_interval,
        keep_versions=args.keep_versions,
        max_queries=args.max_queries,
        max_k=args.max_k,
        max_results=args.max_results,
        max_body_bytes=args.max_body_bytes,
        max_concurrency=args.max_concurrency,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=30)
    return 0

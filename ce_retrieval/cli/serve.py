"""``ce-retrieval serve --export_dir E [--host H] [--port P] ...``: the HTTP JSON retrieval service
(:func:`ce_retrieval.serve.service.create_app`) run by uvicorn until interrupted.

With ``--shard_urls URL0,URL1,...`` it is a router in front of shard servers (``ce-retrieval serve-shard``, URL i
serving shard i): the text encoder runs here, each search fans out to the shards under ``--shard_timeout_s``."""

from __future__ import annotations

import argparse
import logging

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--reload_interval", type=float, default=10.0, help="seconds between checks for a new version (0: off)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="per-request search deadline in seconds")
    parser.add_argument("--max_texts", type=int, default=64)
    parser.add_argument("--max_k", type=int, default=1000)
    parser.add_argument("--max_results", type=int, default=1000, help="cap on threshold hits per text")
    parser.add_argument("--max_body_bytes", type=int, default=1 << 20)
    parser.add_argument("--max_concurrency", type=int, default=8, help="searches running at once")
    parser.add_argument(
        "--shard_urls",
        type=_urls,
        default=None,
        metavar="URL[,URL...]",
        help="router mode: base URLs of the shard servers, in shard order (URL i serves shard i)",
    )
    parser.add_argument(
        "--shard_timeout_s",
        type=float,
        default=1.0,
        help="router mode: deadline of each shard's answer; later ones make the response partial (< --timeout)",
    )


def _urls(text: str) -> list[str]:
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise argparse.ArgumentTypeError("give at least one shard URL (comma-separated)")
    return urls


def run(args) -> int:
    import uvicorn

    from ce_retrieval.serve.service import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(
        args.export_dir,
        max_texts=args.max_texts,
        max_k=args.max_k,
        max_results=args.max_results,
        max_body_bytes=args.max_body_bytes,
        timeout_s=args.timeout,
        reload_interval_s=args.reload_interval,
        max_concurrency=args.max_concurrency,
        shard_urls=args.shard_urls,
        shard_timeout_s=args.shard_timeout_s,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=30)
    return 0

"""ce_retrieval.serve: text -> image search over a built export, in process or over HTTP.

    searcher.py      text -> image search over one export version (``Searcher``)
    service.py       FastAPI/uvicorn HTTP JSON service with validation, metrics and hot reload (``create_app``);
                     with ``shard_urls`` a router in front of shard servers
    router.py        fan-out to shard servers with deadlines;  shard_server.py  one shard behind HTTP
    wire.py          the router <-> shard server format (float32 queries, base64) and ``ShardCoverage``
    http_app.py      what both HTTP apps share: request errors, body limits, JSON parsing, the reloading lifespan
    metrics.py       Prometheus text-format request metrics
    recalibrate.py   new thresholds for a served version from labelled captions, published as a new version

Imports point one way (tests/test_package_layering.py): service -> router -> searcher; shard_server and the searcher
load indexes from ``search``; both apps -> http_app; router, searcher, shard_server -> wire. The ``query``,
``serve``, ``serve-shard`` and ``calibrate`` commands are in :mod:`ce_retrieval.cli`.
"""

from ce_retrieval.serve.searcher import QueryResult, Searcher
from ce_retrieval.serve.service import create_app, serve_in_thread

__all__ = ["QueryResult", "Searcher", "create_app", "serve_in_thread"]

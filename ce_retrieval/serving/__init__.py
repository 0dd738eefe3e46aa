"""ce_retrieval.serving: a trained two-tower model as deployable artefacts (see export/README.md).

    export.py      both towers as TF Serving SavedModels, versioned and written atomically (``export_encoders``)
    index.py       ScaNN index of a gallery next to an export, with manifest and calibrated thresholds (``build_index``)
    gallery.py     a loaded index: top-k (ScaNN or exact) and threshold search; model binding checks
    threshold_search.py  approximate threshold search (top-k grown until the k-th score < tau) and its tuning
    partitions.py  ball-bounded k-means leaves that make exact threshold search prunable
    searcher.py    text -> image search over one export version (``Searcher``)
    service.py     FastAPI/uvicorn HTTP JSON service with validation, metrics and hot reload (``create_app``);
                   with ``shard_urls`` a router in front of shard servers
    sharded_index.py  a gallery split into S ordinary index folders, built in parallel (``build_sharded_index``)
    merge.py       exact merge of shards' top-k and threshold answers
    shard_server.py  one shard behind HTTP for a router (``create_shard_app``);  router.py  fan-out with deadlines
    pipeline.py    gallery embedding on Apache Beam into checksummed shards (``embed_gallery``)
    wire.py        the router <-> shard server format (float32 queries, base64) and ``ShardCoverage``
    http_app.py    what both HTTP apps share: request errors, body limits, JSON parsing, the reloading lifespan
    metrics.py     Prometheus text-format request metrics;  layout.py  folder layout of an export

Imports point one way (tests/serving/test_import_graph.py): service -> router -> searcher -> sharded_index ->
index -> gallery; shard_server -> sharded_index; both apps -> http_app; router, searcher, shard_server -> wire.

The ``export``, ``index``, ``embed-gallery``, ``query``, ``serve`` and ``serve-shard`` commands are in
:mod:`ce_retrieval.cli`.
"""

from ce_retrieval.serving.export import ExportPaths, embed_with_keras, export_encoders, load_signature
from ce_retrieval.serving.gallery import GalleryIndex, IndexMismatchError
from ce_retrieval.serving.index import build_index
from ce_retrieval.serving.searcher import QueryResult, Searcher
from ce_retrieval.serving.service import create_app, serve_in_thread

__all__ = [
    "ExportPaths",
    "GalleryIndex",
    "IndexMismatchError",
    "QueryResult",
    "Searcher",
    "build_index",
    "create_app",
    "embed_with_keras",
    "export_encoders",
    "load_signature",
    "serve_in_thread",
]

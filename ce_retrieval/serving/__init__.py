"""ce_retrieval.serving: a trained two-tower model as deployable artefacts (see export/README.md).

    export.py      both towers as TF Serving SavedModels, versioned and written atomically (``ce-retrieval export``)
    index.py       ScaNN index of a gallery next to an export, with manifest and calibrated thresholds (``index``)
    gallery.py     a loaded index: top-k (ScaNN or exact) and exact threshold search; model binding checks
    partitions.py  ball-bounded k-means leaves that make threshold search exact yet prunable
    searcher.py    text -> image search over one export version (``query``)
    service.py     FastAPI/uvicorn HTTP JSON service with validation, metrics and hot reload (``serve``)
    metrics.py     Prometheus text-format request metrics;  layout.py  folder layout and atomic publishing

Submodules are imported on demand so that ``import ce_retrieval`` stays light.
"""

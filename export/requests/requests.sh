#!/usr/bin/env bash
# Example requests against the docker-compose / Kubernetes deployment (run from export/requests/).
set -euo pipefail
TFS="${TFS:-http://localhost:8501}"
SVC="${SVC:-http://localhost:8080}"

# TF Serving REST :predict. Binary inputs travel as {"b64": ...}; the input is named image_bytes (the "_bytes"
# suffix is TF Serving's convention for binary tensors). Both return {"predictions": [[...d floats...], ...]}.
curl -sf -X POST "$TFS/v1/models/text_encoder:predict" -H 'content-type: application/json' -d @text_predict.json
curl -sf -X POST "$TFS/v1/models/image_encoder:predict" -H 'content-type: application/json' -d @image_predict.json
# a specific version:  $TFS/v1/models/text_encoder/versions/3:predict ; model status: $TFS/v1/models/text_encoder

# The retrieval service: top-k, calibrated threshold, raw threshold.
curl -sf -X POST "$SVC/search" -H 'content-type: application/json' -d @search_topk.json
curl -sf -X POST "$SVC/search" -H 'content-type: application/json' -d @search_precision.json
curl -sf -X POST "$SVC/search" -H 'content-type: application/json' -d '{"texts": ["a red car"], "threshold": 0.6}'
curl -sf "$SVC/healthz"
curl -sf "$SVC/metrics" | head -20

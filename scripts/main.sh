#!/usr/bin/env bash
# The main job on the embedded synthetic dataset: train -> evaluate -> export -> index -> query.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec python -m ce_retrieval.cli demo "$@"

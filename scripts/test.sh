#!/usr/bin/env bash
# The test command: lint, then the whole test suite (2 processes). Installs what it needs first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
echo "[test] ruff"
ruff check ce_retrieval tests benchmarks
ruff format --check ce_retrieval tests benchmarks
echo "[test] pytest"
python -m pytest -n "${CE_TEST_WORKERS:-2}" --timeout=900 -q --durations=25 "$@" tests

#!/usr/bin/env bash
# The test command: lint, then the whole test suite (2 processes, each test file on one of them, so a module's
# shared fixtures are built once; files in the order tests/conftest.py gives them, the ones with slow tests first,
# which xdist's default reordering by test count would undo). Installs what it needs first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
echo "[test] ruff"
ruff check ce_retrieval tests benchmarks
ruff format --check ce_retrieval tests benchmarks
echo "[test] pytest"
# One TensorFlow intra-op thread per process: two test processes (and the subprocesses they start) share two cores,
# and each process's default pool of one thread per core made them contend for the cores. Alone, the quick
# calibration-suite plan took 36.0 s with the default pool and 26.8 s with one thread, with the same figures.
export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
python -m pytest -n "${CE_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder --timeout=900 -q --durations=25 "$@" tests

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
# Bytecode caches for the project's modules and pytest's rewritten test files, where the machine's environment turns
# them off (PYTHONDONTWRITEBYTECODE=1): each test process and each subprocess a test starts compiles them again
# otherwise (collecting the suite took 22.1 s without the caches and 18.2 s with them, once each on 2026-11-29).
# The caches sit in __pycache__ folders, which git ignores.
export PYTHONDONTWRITEBYTECODE=
python -m pytest -n "${CE_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder --timeout=900 -q --durations=25 "$@" tests

#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs the pinned stack.
# Sourced by scripts/main.sh and scripts/test.sh; safe to run again (it skips work when the pins are unchanged).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$VENV/.ce_retrieval_pins"
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[env] creating virtual environment in $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[env] installing pinned dependencies (about 2 minutes, 4.7 GB)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt" -r "$ROOT/requirements-dev.txt"
  echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" >/dev/null 2>&1 \
  || "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
export PATH="$VENV/bin:$PATH"
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

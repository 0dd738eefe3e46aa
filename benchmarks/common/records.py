"""Where a benchmark's record goes: ``<out>/<name>.json`` (the figures) and ``<out>/<name>.md`` (the same for a
reader, linked from BENCHMARKS.md). One place for the file layout that ``check_records.py`` reads."""

from __future__ import annotations

import json
import os


def write_json(out: str, name: str, record: dict) -> str:
    """Writes ``<out>/<name>.json`` (``out`` created if missing); returns its path. Benchmarks that save partial
    records while they run call this after each step."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def write_record(out: str, name: str, record: dict, text: str) -> None:
    """Writes ``<out>/<name>.json`` and ``<out>/<name>.md`` and prints the Markdown."""
    write_json(out, name, record)
    with open(os.path.join(out, name + ".md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)

"""Where a benchmark's record goes: ``<out>/<name>.json`` (the figures) and ``<out>/<name>.md`` (the same for a
reader, linked from BENCHMARKS.md). The one writer of every benchmark's record: one place for the file layout that
``check_records.py`` reads."""

from __future__ import annotations

import json
import os


def write_json(out: str, name: str, record) -> str:
    """Writes ``<out>/<name>.json`` (``out`` created if missing; ``""`` is the current folder); returns its path.
    Benchmarks that save partial records while they run call this after each step, and records with no Markdown
    (a JSON read by another script) go through it alone."""
    os.makedirs(out or ".", exist_ok=True)
    path = os.path.join(out, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def write_record(out: str, name: str, record, text: str, echo: bool = True) -> list[str]:
    """Writes ``<out>/<name>.json`` and ``<out>/<name>.md``, prints the Markdown unless ``echo`` is false, and
    returns both paths."""
    path = os.path.join(out, name + ".md")
    json_path = write_json(out, name, record)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    if echo:
        print(text)
    return [json_path, path]

"""Where a benchmark's record goes: ``<out>/<name>.json`` (the figures) and ``<out>/<name>.md`` (the same for a
reader, linked from BENCHMARKS.md). The one writer of every benchmark's record: one place for the file layout that
``check_records.py`` reads."""

from __future__ import annotations

import json
import os


def write_json(out: str, name: str, record) -> str:
    """Writes ``<out>/<name>.json`` (``out`` created if missing; ``""`` is the current folder; NumPy scalars as
    numbers); returns its path. Benchmarks that save partial records while they run call this after each step, and
    records whose JSON and Markdown have different names write each through ``write_json``/``write_markdown``."""
    os.makedirs(out or ".", exist_ok=True)
    path = os.path.join(out, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, default=float)
    return path


def write_markdown(out: str, name: str, text: str) -> str:
    """Writes ``<out>/<name>.md`` (``out`` created if missing); returns its path."""
    os.makedirs(out or ".", exist_ok=True)
    path = os.path.join(out, name + ".md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def write_record(out: str, name: str, record, text: str, echo: bool = True) -> list[str]:
    """Writes ``<out>/<name>.json`` and ``<out>/<name>.md``, prints the Markdown unless ``echo`` is false, and
    returns both paths."""
    paths = [write_json(out, name, record), write_markdown(out, name, text)]
    if echo:
        print(text)
    return paths

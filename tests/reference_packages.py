"""The outside libraries the suite compares ce_retrieval with, and the check that they are all there.

Every one is pinned in a requirements file, so a missing or mismatched one is a broken environment, not an optional
extra: ``tests/conftest.py`` calls :func:`problems` once at start-up and stops the run with the list, instead of
letting ``importorskip`` turn the comparisons into a quiet "N skipped".
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from importlib import metadata

# distribution name as pinned -> module the tests import
REFERENCES = {
    "torch": "torch",
    "pytorch-metric-learning": "pytorch_metric_learning",
    "faiss-cpu": "faiss",
    "tensorflow-similarity": "tensorflow_similarity",
    "scikit-learn": "sklearn",
    "netcal": "netcal",
    "mapie": "mapie",
}
ROOT = pathlib.Path(__file__).resolve().parents[1]


def pins(root: pathlib.Path = ROOT) -> dict[str, str]:
    """``{distribution: version}`` of every ``name==version`` line in ``root/requirements*.txt`` (names lowercased)."""
    out = {}
    for path in sorted(root.glob("requirements*.txt")):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#;]+)", line)
            if m:
                out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def problems(references: dict[str, str] = REFERENCES, root: pathlib.Path = ROOT) -> list[str]:
    """One line per reference package that is not pinned, not importable, or installed at another version."""
    pinned, found = pins(root), []
    for dist, module in references.items():
        want = pinned.get(dist)
        if want is None:
            found.append(f"{dist}: not pinned in {root}/requirements*.txt")
            continue
        if importlib.util.find_spec(module) is None:
            found.append(f"{dist}=={want}: module {module!r} cannot be imported")
            continue
        try:
            have = metadata.version(dist).split("+")[0]  # torch 2.13.0+cpu is the 2.13.0 pin
        except metadata.PackageNotFoundError:
            have = None
        if have != want:
            found.append(f"{dist}: pinned {want}, installed {have}")
    return found

"""Labelled captions for recalibrating a served index: each caption with the gallery ids relevant to it.

Why a format of its own: recalibration (``ce-retrieval calibrate``) needs only captions and which items of the
*existing* gallery they are relevant to; the images are embedded in the index already. Two formats are read:

* **JSONL**, one object per line: ``{"caption": "a dog on a beach", "relevant": [1003, 2817]}`` (blank lines are
  skipped). ``relevant`` lists gallery ids of the index; it may be empty: a caption with no relevant item in the
  gallery takes part with negative pairs only and counts as a query, so the relevant items per query measured on
  the labels (the guarantee's ``r``) include such queries, as the served traffic does.
* **Karpathy JSON** (Flickr30k / COCO ``dataset_*.json``): every ``sentences[].raw`` of an ``images[]`` entry is a
  caption relevant to that image only, optionally only the entries of one ``split``. The image's gallery id is
  numbered as ``ce-retrieval index`` numbered the gallery: ``karpathy_ids="imgid"`` (default) takes ``imgid``,
  else the entry's position in ``images`` (``index --images <split>`` of a Karpathy data config does the same);
  ``karpathy_ids="filename"`` takes the integer stem of ``filename`` (``index --images <folder>``: integer file
  names become ids, e.g. Flickr30k's ``1000092795.jpg``).

:func:`positives_in_gallery` turns the labels into the relevant (caption row, gallery row) pairs of an index,
refusing an id the gallery does not hold with the line that names it; :func:`query_units` groups captions for the
guarantee's clustered bounds: captions with the same relevant ids are one unit (the captions of one Karpathy image,
as the calibration split's query ids group them), a caption with none is a unit of its own. Where an item is
relevant to captions of several units, :func:`ce_retrieval.evaluation.guarantee.measure_rates` clusters the
relevant pairs by item too. (Not the connected components of the relevance graph: with labels that overlap widely,
"every image it fits", they collapse into a few units, too few to estimate a variance from.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from ce_retrieval.data.report import caption_problem

__all__ = ["KARPATHY_IDS", "RelevanceLabels", "positives_in_gallery", "query_units", "read_labels"]

KARPATHY_IDS = ("imgid", "filename")


@dataclasses.dataclass
class RelevanceLabels:
    """Captions, the gallery ids relevant to each (int64, possibly empty) and where each caption was read."""

    captions: list[str]
    relevant: list[np.ndarray]
    where: list[str]  # "labels.jsonl:12" or "dataset.json images[3] sentences[1]", for error messages
    source: dict  # file name, format, split: goes into the index manifest

    def __len__(self) -> int:
        return len(self.captions)


def read_labels(path: str, *, split: str | None = None, karpathy_ids: str = "imgid") -> RelevanceLabels:
    """Labels from a JSONL or Karpathy JSON file (module docstring); ValueError naming the file and line (or
    entry) of the first problem, or saying that the file holds no caption."""
    if karpathy_ids not in KARPATHY_IDS:
        raise ValueError(f"karpathy_ids must be one of {KARPATHY_IDS}, got {karpathy_ids!r}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # several lines: JSONL
    if isinstance(whole, dict) and "images" in whole:
        labels = _read_karpathy(whole, os.path.basename(path), split, karpathy_ids)
    else:
        if split is not None:
            raise ValueError(f"{path}: a split applies to a Karpathy JSON file, not to JSONL labels")
        labels = _read_jsonl(text, os.path.basename(path))
    labels.source["sha256"] = hashlib.sha256(data).hexdigest()
    if not labels.captions:
        where = f" in split {split!r}" if split is not None else ""
        raise ValueError(f"{path}: no labelled caption{where}")
    return labels


def _read_jsonl(text: str, name: str) -> RelevanceLabels:
    captions, relevant, where = [], [], []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"{name}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{at}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict) or set(row) - {"caption", "relevant"} or "caption" not in row:
            raise ValueError(f'{at}: expected {{"caption": "...", "relevant": [gallery ids]}}, got {line[:80]!r}')
        problem = caption_problem(row["caption"])
        if problem:
            raise ValueError(f"{at}: {problem}")
        ids = row.get("relevant")
        if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ValueError(f"{at}: 'relevant' must be a list of integer gallery ids, got {ids!r}")
        captions.append(row["caption"].strip())
        relevant.append(np.unique(np.asarray(ids, np.int64)))
        where.append(at)
    return RelevanceLabels(captions, relevant, where, {"file": name, "format": "jsonl"})


def _karpathy_id(entry: dict, n: int, karpathy_ids: str, at: str) -> int:
    if karpathy_ids == "filename":
        stem = os.path.splitext(os.path.basename(str(entry.get("filename", ""))))[0]
        if not stem.isdigit():
            raise ValueError(f"{at}: filename {entry.get('filename')!r} is not an integer id (use karpathy ids imgid)")
        return int(stem)
    try:
        return int(entry.get("imgid", n))
    except (TypeError, ValueError):
        raise ValueError(f"{at}: imgid {entry.get('imgid')!r} is not an integer") from None


def _read_karpathy(index: dict, name: str, split: str | None, karpathy_ids: str) -> RelevanceLabels:
    if not isinstance(index["images"], list):
        raise ValueError(f"{name}: 'images' must be a list (Karpathy split format)")
    captions, relevant, where = [], [], []
    for n, entry in enumerate(index["images"]):
        at = f"{name} images[{n}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: not an object")
        if split is not None and entry.get("split") != split:
            continue
        image_id = _karpathy_id(entry, n, karpathy_ids, at)
        for k, sentence in enumerate(entry.get("sentences") or []):
            raw = sentence.get("raw") if isinstance(sentence, dict) else None
            problem = caption_problem(raw)
            if problem:
                raise ValueError(f"{at} sentences[{k}]: {problem}")
            captions.append(raw.strip())
            relevant.append(np.array([image_id], np.int64))
            where.append(f"{at} sentences[{k}]")
    source = {"file": name, "format": "karpathy", "split": split, "karpathy_ids": karpathy_ids}
    return RelevanceLabels(captions, relevant, where, source)


def positives_in_gallery(labels: RelevanceLabels, gallery_ids) -> tuple[np.ndarray, np.ndarray]:
    """The relevant pairs ``(caption rows, gallery rows)`` of ``labels`` in a gallery whose row j has id
    ``gallery_ids[j]``; ValueError naming the first caption whose id the gallery does not hold (and how many do)."""
    gallery_ids = np.asarray(gallery_ids, np.int64)
    order = np.argsort(gallery_ids, kind="stable")
    sorted_ids = gallery_ids[order]
    counts = np.array([len(r) for r in labels.relevant], np.int64)
    flat = np.concatenate(labels.relevant) if len(labels.relevant) else np.zeros(0, np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, flat), max(len(sorted_ids) - 1, 0))
    known = (sorted_ids[pos] == flat) if len(sorted_ids) else np.zeros(len(flat), bool)
    rows = np.repeat(np.arange(len(labels), dtype=np.int64), counts)
    if not known.all():
        first = int(np.flatnonzero(~known)[0])
        bad_rows = np.unique(rows[~known])
        raise ValueError(
            f"{labels.where[rows[first]]}: relevant id {int(flat[first])} is not in the gallery "
            f"({len(gallery_ids):,} items); {len(bad_rows)} labelled caption(s) name ids it does not hold"
            + (
                " (choose the gallery's split, or the other Karpathy id rule)"
                if labels.source["format"] == "karpathy"
                else ""
            )
        )
    return rows, order[pos].astype(np.int64)


def query_units(labels: RelevanceLabels) -> np.ndarray:
    """Unit id per caption: captions with the same (non-empty) set of relevant ids share one; a caption with no
    relevant id is a unit of its own."""
    keys = [tuple(r.tolist()) if len(r) else ("none", i) for i, r in enumerate(labels.relevant)]
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)

"""Bookkeeping for loaders of real data: what was read, what was skipped and why (``LoadReport``).

With ``skip_corrupt=True`` a bad caption row (empty, not UTF-8, wrong column count) or a bad image (missing
file, undecodable bytes) is counted and skipped; with ``skip_corrupt=False`` the first one raises
:class:`DataError` naming the file and row. Either way the counts are logged when a scan finishes.
"""

from __future__ import annotations

import dataclasses
import io
import logging

from PIL import Image, UnidentifiedImageError

logger = logging.getLogger("ce_retrieval.data")

# Formats tf.io.decode_image reads (the image tower decodes in-graph, so PIL-only formats are rejected too).
DECODABLE_FORMATS = ("JPEG", "PNG", "GIF", "BMP")
MAX_EXAMPLES_KEPT = 20


class DataError(ValueError):
    """A bad row or image met with ``skip_corrupt=False``; the message names the file and row."""


@dataclasses.dataclass
class LoadReport:
    """Counts of one scan of one split. ``problems`` keeps the first few messages verbatim."""

    source: str
    split: str
    rows: int = 0  # caption rows / records read
    examples: int = 0  # (caption, image) examples kept
    images: int = 0  # unique images kept
    bad_rows: int = 0  # empty / non-UTF-8 / malformed caption rows
    missing_images: int = 0
    corrupt_images: int = 0  # undecodable bytes
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def skipped(self) -> int:
        return self.bad_rows + self.missing_images + self.corrupt_images

    def fail_or_count(self, kind: str, message: str, skip_corrupt: bool) -> None:
        """Raise ``DataError(message)`` unless skipping; else count ``kind`` and remember the message."""
        if not skip_corrupt:
            raise DataError(f"{self.source} [{self.split}]: {message} (set skip_corrupt=True to skip such rows)")
        if kind not in ("bad_rows", "missing_images", "corrupt_images"):
            raise ValueError(f"unknown problem kind {kind!r}")
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.problems) < MAX_EXAMPLES_KEPT:
            self.problems.append(message)

    def log(self) -> None:
        level = logging.WARNING if self.skipped else logging.INFO
        logger.log(
            level,
            "%s [%s]: %d rows, %d examples, %d images kept; skipped %d bad rows, %d missing and %d corrupt images%s",
            self.source,
            self.split,
            self.rows,
            self.examples,
            self.images,
            self.bad_rows,
            self.missing_images,
            self.corrupt_images,
            (": " + "; ".join(self.problems[:3])) if self.problems else "",
        )


def image_problem(data: bytes) -> str | None:
    """None if ``data`` decodes as an image tf.io.decode_image reads; else why not."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format
            image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        return f"undecodable image ({type(exc).__name__}: {exc})"
    if fmt not in DECODABLE_FORMATS:
        return f"image format {fmt} is not one of {DECODABLE_FORMATS}"
    return None


def caption_problem(raw) -> str | None:
    """None if ``raw`` (str or bytes) is a non-empty UTF-8 caption; else why not."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"caption is not valid UTF-8 ({exc})"
    if not isinstance(raw, str):
        return f"caption is a {type(raw).__name__}, not a string"
    if not raw.strip():
        return "empty caption"
    return None

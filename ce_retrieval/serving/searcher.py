"""Text -> image search over an export (used by the ``ce-retrieval query`` command and the service).

``Searcher.load(export_dir)`` takes the newest version that has both encoders and an index, loads the text
encoder SavedModel and the index, and refuses to pair them unless the index was built by that model
(fingerprint, dimension) and the reloaded text encoder reproduces its stored probe embeddings.

Two questions, as in the paper:
  * top-k relevancy      ``search(texts, k=10)``            the k images with the largest s(q, x) = q.x;
  * threshold relevancy  ``search(texts, threshold=tau)``   every image with s(q, x) >= tau, exactly;
                         ``search(texts, precision=0.9)``   tau = the score at which precision reached 0.9 on
                                                            the calibration split (stored in the manifest).
Scores are the calibrated cosine similarities; each hit also reports the highest calibrated precision level
its score clears (``precision_level``), so a client can read a score as "at least 90 % of pairs this high
were relevant on validation data".
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ce_retrieval.serving import layout
from ce_retrieval.serving.gallery import GalleryIndex, IndexMismatchError

PROBE_ATOL = 1e-4


@dataclasses.dataclass
class QueryResult:
    ids: np.ndarray  # int64 [m]
    scores: np.ndarray  # float32 [m], descending
    precision_levels: list  # per hit: highest calibrated precision whose threshold the score clears, or None
    truncated: bool = False  # threshold search returned more than ``limit`` hits; only the best are kept

    def to_json(self) -> dict:
        return {
            "hits": [
                {"id": int(i), "score": round(float(s), 6), "precision_level": p}
                for i, s, p in zip(self.ids, self.scores, self.precision_levels, strict=True)
            ],
            "num_hits": int(len(self.ids)),
            "truncated": self.truncated,
        }


def _validate_texts(texts) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise ValueError(f"texts[{i}] is empty")
    return texts


class Searcher:
    """An immutable (text encoder, index) pair of one export version; safe to share between threads."""

    def __init__(self, export_dir: str, version: int, text_signature, metadata: dict, index: GalleryIndex):
        self.export_dir, self.version = export_dir, version
        self._text_fn, self.metadata, self.index = text_signature, metadata, index
        raw = (index.manifest.get("thresholds") or {}).get("threshold_at_precision") or {}
        self.thresholds = {float(p): float(t) for p, t in raw.items()}

    @classmethod
    def load(cls, export_dir: str, version: int | None = None, *, verify: bool = True) -> Searcher:
        from ce_retrieval.serving.export import TEXT_INPUT, load_signature

        export_dir = os.path.abspath(export_dir)
        servable = layout.servable_versions(export_dir)
        if version is None:
            if not servable:
                raise FileNotFoundError(
                    f"{export_dir} has no version with both encoders and an index "
                    "(run `ce-retrieval export` and `ce-retrieval index`)"
                )
            version = servable[-1]
        elif version not in servable:
            raise FileNotFoundError(f"version {version} of {export_dir} is not servable; servable: {servable}")
        meta = layout.export_metadata(export_dir, layout.TEXT_ENCODER, version)
        index = GalleryIndex.load(layout.version_dir(export_dir, layout.INDEX, version), expected_model=meta)
        _, fn = load_signature(layout.version_dir(export_dir, layout.TEXT_ENCODER, version))
        searcher = cls(export_dir, version, fn, meta, index)
        if verify:
            import tensorflow as tf

            probe = meta["probe"]
            got = fn(**{TEXT_INPUT: tf.constant(probe["texts"])})["embedding"].numpy()
            want = np.asarray(probe["text_embeddings"], dtype=np.float32)
            if got.shape != want.shape or not np.allclose(got, want, atol=PROBE_ATOL):
                raise IndexMismatchError(
                    f"text_encoder/{version} does not reproduce the probe embeddings recorded "
                    "at export: the SavedModel was changed or is corrupt"
                )
        return searcher

    @property
    def logit_scale(self) -> float | None:
        return self.metadata.get("logit_scale")

    def embed(self, texts, batch_size: int = 256) -> np.ndarray:
        """float32 [B, d] unit-norm caption embeddings from the exported text encoder."""
        import tensorflow as tf

        from ce_retrieval.serving.export import TEXT_INPUT

        texts = _validate_texts(texts)
        out = [
            self._text_fn(**{TEXT_INPUT: tf.constant(texts[i : i + batch_size], dtype=tf.string)})["embedding"].numpy()
            for i in range(0, len(texts), batch_size)
        ]
        return np.concatenate(out, axis=0) if out else np.zeros((0, self.index.dim), np.float32)

    def threshold_for_precision(self, precision: float) -> float:
        key = float(precision)
        if key not in self.thresholds:
            available = (
                ", ".join(format(p, "g") for p in sorted(self.thresholds)) or "none (index built without calibration)"
            )
            raise ValueError(f"no calibrated threshold for precision {precision:g}; available: {available}")
        return self.thresholds[key]

    def precision_levels(self, scores: np.ndarray) -> list:
        levels = sorted(self.thresholds.items())
        return [max((p for p, t in levels if s >= t), default=None) for s in np.asarray(scores).tolist()]

    def search(
        self,
        texts,
        k: int | None = None,
        *,
        threshold: float | None = None,
        precision: float | None = None,
        limit: int | None = None,
    ) -> list[QueryResult]:
        """One :class:`QueryResult` per text: top ``k``, or every item with score >= ``threshold`` (or the
        calibrated threshold for ``precision``). ``limit`` caps threshold results (best first; ``truncated``)."""
        if sum(x is not None for x in (k, threshold, precision)) != 1:
            raise ValueError("give exactly one of k, threshold or precision")
        return self.search_embeddings(self.embed(texts), k, threshold=threshold, precision=precision, limit=limit)

    def search_embeddings(
        self,
        queries: np.ndarray,
        k: int | None = None,
        *,
        threshold: float | None = None,
        precision: float | None = None,
        limit: int | None = None,
    ) -> list[QueryResult]:
        if precision is not None:
            threshold = self.threshold_for_precision(precision)
        if k is not None:
            if int(k) < 1:
                raise ValueError(f"k must be >= 1, got {k}")
            ids, scores = self.index.topk(queries, int(k))
            return [QueryResult(i, s, self.precision_levels(s)) for i, s in zip(ids, scores, strict=True)]
        ids, scores = self.index.threshold(queries, float(threshold))
        out = []
        for i, s in zip(ids, scores, strict=True):
            cut = limit is not None and len(i) > limit
            i, s = (i[:limit], s[:limit]) if cut else (i, s)
            out.append(QueryResult(i, s, self.precision_levels(s), truncated=bool(cut)))
        return out

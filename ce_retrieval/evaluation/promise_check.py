"""Do the precision promises of a calibration hold on another split, and what recall do they leave?

A :class:`~ce_retrieval.evaluation.split_calibration.Calibration` made on validation promises, per level p,
"precision >= p on a gallery of M items" with confidence 1 - delta (the guaranteed threshold), and estimates a
threshold for p without any confidence (the point estimate). :func:`check_promises` derives both for the gallery
being evaluated (its own size M, so a gallery with added distractors gets its own, higher thresholds) and counts,
exactly over every query x image pair of the split (``threshold_transfer``), the precision and recall each
achieves:

    kept(p) = [achieved precision >= p]     (None when the threshold returns nothing, or when p was refused)
    recall at guaranteed precision p = recall(guaranteed threshold for p), 0 where p was refused,

the figure a user of threshold retrieval ships: what the objective retrieves under a promise that holds.
"""

from __future__ import annotations

from ce_retrieval.evaluation.transfer import threshold_transfer

__all__ = ["check_promises", "promise_summary"]


def _kept(entry: dict | None):
    if entry is None or entry.get("precision") is None:
        return None
    return bool(entry["precision"] >= entry["promised"] - 1e-12)


def check_promises(calibration, query_emb, doc_emb, query_ids, doc_ids, gallery_size: int | None = None) -> dict:
    """Guaranteed and estimated thresholds of ``calibration`` for this gallery (``gallery_size``, default the
    number of documents), and what each achieves here. Returns ``{"gallery_size", "delta", "levels": {p:
    {"guaranteed": transfer entry or None, "estimated": ..., "refused": reason or None, "best_certified": the
    certified precision bound at p's threshold, or the highest bound of any threshold where p was refused,
    "kept": bool or None,
    "estimate_kept": ..., "recall": recall at the guaranteed threshold (0 when refused), "estimate_recall"}}}``."""
    size = len(doc_emb) if gallery_size is None else int(gallery_size)
    block = calibration.for_gallery(size)
    promise = block["guaranteed"]
    guaranteed = threshold_transfer(promise["threshold_at_precision"], query_emb, doc_emb, query_ids, doc_ids)
    estimated = threshold_transfer(block["threshold_at_precision"], query_emb, doc_emb, query_ids, doc_ids)
    levels = {}
    for key, level in promise["levels"].items():
        g, e = guaranteed["levels"].get(key), estimated["levels"].get(key)
        levels[key] = {
            "guaranteed": g,
            "estimated": e,
            "refused": level.get("refused"),
            # the precision this calibration does certify: p's own bound, or the best one where p was refused
            "best_certified": level.get("precision_lower_bound", level.get("best_precision_lower_bound")),
            "kept": _kept(g),
            "estimate_kept": _kept(e),
            "recall": 0.0 if g is None else g["recall"],
            "estimate_recall": 0.0 if e is None else e["recall"],
        }
    return {"gallery_size": size, "delta": promise["delta"], "levels": levels}


def promise_summary(check: dict | None, levels=(0.5, 0.8, 0.9)) -> dict:
    """Flat figures per level p: ``guaranteed_recall_p`` (recall at guaranteed precision, 0 when refused),
    ``guaranteed_precision_p`` (achieved; None when refused or empty), ``guarantee_kept_p``,
    ``guarantee_refused_p``, ``estimate_recall_p``; None everywhere without a check."""
    out = {}
    for p in levels:
        key = f"{p:g}"
        entry = ((check or {}).get("levels") or {}).get(key)
        g = (entry or {}).get("guaranteed") or {}
        out[f"guaranteed_recall_{key}"] = None if entry is None else entry["recall"]
        out[f"guaranteed_precision_{key}"] = g.get("precision")
        out[f"guarantee_kept_{key}"] = None if entry is None else entry["kept"]
        out[f"guarantee_refused_{key}"] = None if entry is None else entry["refused"] is not None
        out[f"estimate_recall_{key}"] = None if entry is None else entry["estimate_recall"]
    return out

"""The paper's figures as PNG files (matplotlib, Agg backend, no display needed).

* ``plot_score_distributions`` -- Figure 4 right: for up to 1,000 sampled queries, the number of documents at
  each similarity value (a histogram drawn as a line per query), with the 5th and 95th percentile of that
  count across the queries (90% of the queries lie between the two orange lines). A globally calibrated
  model puts the curves of all queries in the same place; otherwise they spread left and right.
* ``plot_pr_curves`` -- Figure 4 left: global precision-recall curves of several runs, AUC in the legend.
* ``plot_reliability`` -- does a threshold calibrated on validation keep its promise on test: promised precision
  (the target it was chosen for) against the precision it achieves, one line per run, the diagonal y = x being
  perfect calibration (points below it: fewer relevant results than promised).
* ``plot_score_separation`` -- the calibration argument in one picture: for each run, side by side, the
  distribution of the scores of all relevant pairs against that of all irrelevant pairs, pooled over every
  query. A global threshold can only work where the two separate *across* queries, not just within each one.
* ``plot_retrieval_sheet`` -- Figure 5: sample queries with their top retrieved images and scores; ground truth
  ticked, results scoring at least the calibrated threshold outlined in blue.
"""

from __future__ import annotations

import io
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ce_retrieval.search.arrays import as_embeddings  # noqa: E402
from ce_retrieval.utils.atomic import atomic_path  # noqa: E402

__all__ = [
    "pooled_pair_scores",
    "plot_pr_curves",
    "plot_reliability",
    "plot_retrieval_sheet",
    "plot_score_distributions",
    "plot_score_separation",
    "select_sheet_queries",
]

_BLUE, _ORANGE, _GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"


def _save(fig, path: str) -> str:
    try:
        with atomic_path(path) as tmp:
            fig.savefig(
                tmp,
                dpi=110,
                bbox_inches="tight",
                format=os.path.splitext(path)[1][1:] or plt.rcParams["savefig.format"],
            )
    finally:
        plt.close(fig)
    return path


def _finish_unit_square(ax, xlabel: str, ylabel: str, title: str, legend_loc: str) -> None:
    """Axes of a precision plot: both axes over [0, 1] (a little headroom for precision 1), labels, title, grid,
    legend."""
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc, fontsize=8)


def score_histograms(query_emb, doc_emb, num_queries: int = 1000, num_bins: int = 100, seed: int = 0):
    """``(edges [B+1], counts [Q, B])``: per sampled query, how many documents fall in each score bin."""
    q = as_embeddings(query_emb, "query_emb")
    d = as_embeddings(doc_emb, "doc_emb")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(q), size=min(int(num_queries), len(q)), replace=False))
    chunk = max(1, (1 << 22) // len(d))
    lo, hi = np.inf, -np.inf
    for r0 in range(0, len(rows), chunk):
        s = q[rows[r0 : r0 + chunk]] @ d.T
        lo, hi = min(lo, float(s.min())), max(hi, float(s.max()))
    if hi <= lo:
        hi = lo + 1e-6
    num_bins = int(min(int(num_bins), max(10, len(d) // 5)))  # a few documents per bin on small galleries
    edges = np.linspace(lo, hi, num_bins + 1)
    counts = np.zeros((len(rows), num_bins), np.int64)
    for r0 in range(0, len(rows), chunk):
        s = q[rows[r0 : r0 + chunk]] @ d.T
        b = np.clip(((s - lo) * (num_bins / (hi - lo))).astype(np.int64), 0, num_bins - 1)  # uniform bins
        offsets = np.arange(len(s))[:, None] * num_bins
        counts[r0 : r0 + len(s)] = np.bincount((b + offsets).ravel(), minlength=len(s) * num_bins).reshape(
            len(s), num_bins
        )
    return edges, counts


def plot_score_distributions(
    query_emb,
    doc_emb,
    path: str,
    num_queries: int = 1000,
    num_bins: int = 100,
    seed: int = 0,
    title: str = "Score distribution per query",
    threshold: float | None = None,
) -> str:
    """Figure 4 (right) for one model; returns ``path``."""
    edges, counts = score_histograms(query_emb, doc_emb, num_queries, num_bins, seed)
    centers = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(7, 4.5))
    alpha = float(np.clip(20.0 / len(counts), 0.03, 0.6))
    ax.plot(centers, counts.T, color=_BLUE, alpha=alpha, linewidth=0.7)
    p5, p95 = np.percentile(counts, [5, 95], axis=0)
    ax.plot(centers, p5, color=_ORANGE, linewidth=2, label="5th percentile")
    ax.plot(centers, p95, color=_ORANGE, linewidth=2, linestyle="--", label="95th percentile")
    if threshold is not None:
        ax.axvline(threshold, color="k", linewidth=1, linestyle=":", label=f"best-F1 threshold {threshold:.3f}")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("similarity score to the query")
    ax.set_ylabel("number of documents (symlog)")
    ax.set_title(f"{title}\n{len(counts)} queries x {int(counts[0].sum())} documents")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, path)


def plot_pr_curves(
    curves: dict, path: str, title: str = "Global precision-recall over all query x document pairs"
) -> str:
    """Figure 4 (left). ``curves``: ``{label: {"recall": [...], "precision": [...], "pr_auc": float (optional)}}``
    or ``{label: [such dicts]}`` for several seeds of one run (drawn in one colour)."""
    if not curves:
        raise ValueError("plot_pr_curves: no curves given")
    fig, ax = plt.subplots(figsize=(6, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, runs) in enumerate(curves.items()):
        runs = runs if isinstance(runs, list | tuple) else [runs]
        aucs = [r["pr_auc"] for r in runs if r.get("pr_auc") is not None]
        name = f"{label} (AUC {100 * np.mean(aucs):.2f})" if aucs else str(label)
        for j, run in enumerate(runs):
            ax.plot(
                run["recall"],
                run["precision"],
                color=colors[i % len(colors)],
                linewidth=1.5,
                alpha=1.0 if len(runs) == 1 else 0.6,
                label=name if j == 0 else None,
            )
    _finish_unit_square(ax, "recall", "precision", title, legend_loc="upper right")
    return _save(fig, path)


def plot_reliability(
    curves: dict,
    path: str,
    title: str = "Thresholds calibrated on validation: promised vs achieved precision on test",
    axes: tuple[str, str] = ("promised precision (target of the calibrated threshold)", "achieved precision"),
) -> str:
    """Reliability diagram; returns ``path``. ``axes``: the x and y labels (a probability map's diagram plots
    predicted probability against the observed share of relevant pairs).

    ``curves``: ``{label: {"promised": [...], "achieved": [...], "std": [...] (optional)}}``, e.g.
    ``transfer.reliability_curve(metrics["transfer"])`` or a mean over seeds with their standard deviation
    (drawn as a shaded band). Points whose ``achieved`` is None (nothing predicted) are skipped. The legend gives
    each run's mean |achieved - promised| over its points.
    """
    if not curves:
        raise ValueError("plot_reliability: no curves given")
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.plot([0, 1], [0, 1], color="0.4", linewidth=1, linestyle="--", label="perfectly calibrated (y = x)")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, curve) in enumerate(curves.items()):
        promised = np.asarray(curve["promised"], np.float64)
        achieved = np.asarray([np.nan if a is None else a for a in curve["achieved"]], np.float64)
        if len(promised) != len(achieved):
            raise ValueError(
                f"plot_reliability: {label!r} has {len(promised)} promised but {len(achieved)} achieved values"
            )
        ok = ~np.isnan(achieved)
        color = colors[i % len(colors)]
        name = (
            f"{label} (mean |error| {np.mean(np.abs(achieved[ok] - promised[ok])):.3f})"
            if ok.any()
            else f"{label} (no points)"
        )
        ax.plot(promised[ok], achieved[ok], color=color, marker="o", markersize=4, linewidth=1.5, label=name)
        if curve.get("std") is not None:
            std = np.asarray([np.nan if v is None else v for v in curve["std"]], np.float64)
            band = ok & ~np.isnan(std)
            ax.fill_between(
                promised[band], (achieved - std)[band], (achieved + std)[band], color=color, alpha=0.2, linewidth=0
            )
    ax.set_aspect("equal")
    _finish_unit_square(ax, axes[0], axes[1], title, legend_loc="upper left")
    return _save(fig, path)


def pooled_pair_scores(
    query_emb, doc_emb, query_ids, doc_ids, max_negatives: int = 2_000_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(positive_scores, negative_scores)`` over all query x document pairs, pooled across queries.

    Every positive is kept; negatives are a uniform sample of at most ``max_negatives`` (streamed in row blocks,
    so memory stays bounded for large galleries)."""
    q = as_embeddings(query_emb, "query_emb")
    d = as_embeddings(doc_emb, "doc_emb")
    qids, dids = np.asarray(query_ids), np.asarray(doc_ids)
    keep = min(1.0, max_negatives / max(1, len(q) * len(d)))
    rng = np.random.default_rng(seed)
    chunk = max(1, (1 << 22) // len(d))
    pos, neg = [], []
    for r0 in range(0, len(q), chunk):
        s = q[r0 : r0 + chunk] @ d.T
        match = qids[r0 : r0 + chunk, None] == dids[None, :]
        pos.append(s[match])
        n = s[~match]
        neg.append(n if keep >= 1.0 else n[rng.random(len(n)) < keep])
    return np.concatenate(pos), np.concatenate(neg)


def plot_score_separation(runs: dict, path: str, title: str = "Scores of all relevant vs all irrelevant pairs") -> str:
    """One panel per run, side by side on a shared score axis; returns ``path``.

    ``runs``: ``{label: {"positives": [...], "negatives": [...], "thresholds": {"0.9": score or None, ...}
    (optional), "note": str (optional)}}``. Each class is drawn as a density (each integrates to 1; log scale, so
    the tail of negatives that reaches the positives stays visible), with the thresholds as vertical lines.
    """
    if not runs:
        raise ValueError("plot_score_separation: no runs given")
    lo = min(float(np.min(r["negatives"])) for r in runs.values())
    hi = max(float(np.max(r["positives"])) for r in runs.values())
    edges = np.linspace(lo, max(hi, lo + 1e-6), 81)
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.2), sharex=True, sharey=True, squeeze=False)
    for ax, (label, run) in zip(axes[0], runs.items(), strict=True):
        pos, neg = np.asarray(run["positives"], np.float64), np.asarray(run["negatives"], np.float64)
        ax.hist(neg, bins=edges, density=True, color=_BLUE, alpha=0.55, label=f"irrelevant pairs ({len(neg):,})")
        ax.hist(pos, bins=edges, density=True, color=_ORANGE, alpha=0.65, label=f"relevant pairs ({len(pos):,})")
        styles = iter([":", "--", "-."])
        for level, t in sorted((run.get("thresholds") or {}).items(), key=lambda kv: float(kv[0])):
            if t is not None:
                ax.axvline(
                    t, color="k", linewidth=1, linestyle=next(styles, ":"), label=f"threshold for precision {level}"
                )
        ax.set_yscale("log")
        ax.set_xlabel("similarity score")
        ax.set_title(f"{label}" + (f"\n{run['note']}" if run.get("note") else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
    axes[0][0].set_ylabel("density (log scale)")
    fig.suptitle(title, fontsize=11, y=1.04)
    return _save(fig, path)


def select_sheet_queries(top_scores: np.ndarray, num_low: int = 3, num_high: int = 3) -> np.ndarray:
    """Queries like the paper's Figure 5: those with the lowest and with the highest top-1 score."""
    order = np.argsort(np.asarray(top_scores), kind="stable")
    low, high = order[: int(num_low)], order[::-1][: int(num_high)]
    return np.concatenate([low, high[~np.isin(high, low)]])


def _thumbnail(data: bytes, size: int):
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data)).convert("RGB")
    except Exception:  # an undecodable image is shown as grey rather than failing the report
        return np.full((size, size, 3), 128, np.uint8)
    img.thumbnail((size, size))
    return np.asarray(img)


def plot_retrieval_sheet(
    captions,
    query_ids,
    images,
    doc_ids,
    indices,
    scores,
    path: str,
    rows=None,
    threshold: float | None = None,
    top_k: int = 5,
    thumb_size: int = 96,
    title: str = "Queries and their top retrieved images",
) -> str:
    """Figure 5: one row per query (caption on the left), its ``top_k`` retrieved images with scores.

    ``indices``/``scores`` are a search result ``[N, >=top_k]`` over ``images`` (index -1: none); ``rows``
    picks the queries (default :func:`select_sheet_queries`). Ground truth is ticked in green; images scoring
    at least ``threshold`` get a blue frame.
    """
    indices, scores = np.asarray(indices), np.asarray(scores)
    query_ids, doc_ids = np.asarray(query_ids), np.asarray(doc_ids)
    top_k = min(int(top_k), indices.shape[1])
    rows = select_sheet_queries(scores[:, 0]) if rows is None else np.asarray(rows)
    fig, axes = plt.subplots(len(rows), top_k, figsize=(1.7 * top_k + 2.2, 1.9 * len(rows)), squeeze=False)
    for r, qi in enumerate(rows):
        for c in range(top_k):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            j = int(indices[qi, c])
            if j < 0 or j >= len(images):
                ax.set_axis_off()
                continue
            ax.imshow(_thumbnail(images[j], thumb_size))
            relevant = j < len(doc_ids) and doc_ids[j] == query_ids[qi]
            above = threshold is not None and scores[qi, c] >= threshold
            label = f"{scores[qi, c]:.3f}" + ("  \u2713 GT" if relevant else "")
            ax.set_title(
                label, fontsize=8, color=_GREEN if relevant else "black", fontweight="bold" if relevant else None
            )
            for spine in ax.spines.values():
                spine.set_edgecolor(_BLUE if above else "#cccccc")
                spine.set_linewidth(4 if above else 1)
        axes[r, 0].set_ylabel(textwrap.fill(str(captions[qi]), 26), fontsize=8, rotation=0, ha="right", va="center")
    note = f"blue frame: score >= {threshold:.3f} (calibrated threshold)" if threshold is not None else ""
    fig.suptitle(f"{title}\nGT = ground truth. {note}", fontsize=10)
    return _save(fig, path)

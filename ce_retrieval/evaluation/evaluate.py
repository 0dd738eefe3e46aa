"""Evaluate two towers on a retrieval split: every figure of the paper's Table 1 plus calibration, as one JSON.

``evaluate_model`` embeds the split (captions -> queries, images -> documents), then computes

* Recall@1/5/10 in both directions and rsum (exact search),
* global average precision / PR-AUC, the best-F1 threshold and the thresholds for target precisions,
* optionally Recall@1/5/10/100 text->image with distractor images appended to the gallery,
* optionally the recall lost by an approximate searcher,
* each query's own best-F1 threshold and their spread (``query_thresholds``, see ``transfer``),
* the operating-point inconsistency (``opis``, both directions, see ``opis``) over the span of this split's
  thresholds for the precisions ``RELIABILITY_LEVELS``,
* optionally, given thresholds calibrated on another split (``calibration_split``, usually validation), the
  precision each achieves on this split (``transfer``: the promise a shipped threshold makes, checked),
* with a calibration split, the score -> P(relevant) map fitted there (``probability``) measured here: its
  reliability diagram and ECE, the Brier score and log loss (skill, reliability / resolution split), the pairs it
  predicts >= 0.5 and >= 0.9 with the precision observed there, and the calibration error per query, averaged per
  query group (by number of relevant images, highest score, caption length),

and, given ``output_dir``, writes ``eval_<split>.json`` (figures, config, git commit, dataset fingerprint,
run name) and the plots (``pr_curve_<split>.png``, ``score_distribution_<split>.png``,
``retrieval_sheet_<split>.png``, with calibration thresholds ``reliability_<split>.png``). Recall and PR
figures are fractions in [0, 1]; reports print percentages.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import subprocess
import time

import numpy as np

from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.embed import embed_split, embed_strings
from ce_retrieval.evaluation.guarantee import DEFAULT_DELTA
from ce_retrieval.evaluation.opis import operating_point_inconsistency, opis_summary
from ce_retrieval.evaluation.probability import (
    CONFIDENT_LEVELS,
    PROBABILITY_AXES,
    ProbabilityMap,
    caption_word_counts,
    reliability,
)
from ce_retrieval.evaluation.promise_check import check_promises, promise_summary
from ce_retrieval.evaluation.retrieval import ann_recall_loss, recall_at_k, recall_with_distractors
from ce_retrieval.evaluation.split_calibration import DEFAULT_LEVELS, calibrate_split
from ce_retrieval.evaluation.transfer import (
    RELIABILITY_LEVELS,
    calibration_summary,
    per_query_thresholds,
    reliability_curve,
    threshold_transfer,
)
from ce_retrieval.search.exact import exact_search
from ce_retrieval.utils.atomic import atomic_write_text

__all__ = ["dataset_fingerprint", "evaluate_embeddings", "evaluate_model", "git_commit"]

SCHEMA_VERSION = 1


def _file_tag(name: str) -> str:
    """A split name usable in a file name: ``synthetic/test`` -> ``test`` (the last path part), other odd
    characters replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name).rstrip("/").split("/")[-1]) or "split"


def dataset_fingerprint(split) -> str:
    """SHA-256 over the split's caption ids, captions, image ids and image bytes (identifies the exact test set)."""
    h = hashlib.sha256()
    h.update(np.asarray(split.caption_ids, np.int64).tobytes())
    h.update(np.asarray(split.image_ids, np.int64).tobytes())
    for caption in split.captions:
        h.update(caption.encode("utf-8") if isinstance(caption, str) else bytes(caption))
        h.update(b"\0")
    for image in split.images:
        h.update(hashlib.sha256(image).digest())
    return h.hexdigest()


def git_commit(path: str | None = None) -> str | None:
    """The git commit of the source tree (``path`` defaults to this package), with ``-dirty`` appended when tracked
    files differ from it (as ``git describe --dirty`` marks them: the figures then came from uncommitted code), or
    None outside a checkout."""
    where = path or os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if changed else head


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def evaluate_embeddings(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    distractor_emb=None,
    ks=(1, 5, 10),
    distractor_ks=(1, 5, 10, 100),
    ann_search_fn=None,
    calibration_thresholds: dict | None = None,
    probability_map: ProbabilityMap | None = None,
    caption_lengths=None,
    split_calibration=None,
) -> dict:
    """All metrics from embeddings: ``{"recall", "calibration", "distractors" (or None), "ann" (or None),
    "query_thresholds", "opis", "transfer" (or None), "probability" (or None)}``.

    ``calibration`` reports thresholds for every precision of ``RELIABILITY_LEVELS``; their span is the range
    over which ``opis`` (:func:`~ce_retrieval.evaluation.opis.operating_point_inconsistency`) integrates.

    ``calibration_thresholds``: ``{precision level: score threshold or None}`` chosen on another split (its
    ``global_pr_auc(...)["threshold_at_precision"]``); ``transfer`` is then ``threshold_transfer`` of them on
    these embeddings.

    ``split_calibration``: a :class:`~ce_retrieval.evaluation.split_calibration.Calibration` made on another split;
    ``promises`` is then :func:`~ce_retrieval.evaluation.promise_check.check_promises` here (guaranteed and
    estimated thresholds for this gallery's size: kept or not, recall at guaranteed precision), and with
    distractors ``promises_with_distractors`` the same on the gallery they extend.

    ``probability_map``: a score -> P(relevant) map fitted on another split; ``probability`` is then its
    ``reliability`` here, per query group also by ``caption_lengths`` (words per query) when given.
    """
    calibration = global_pr_auc(query_emb, doc_emb, query_ids, doc_ids, target_precisions=RELIABILITY_LEVELS)
    metrics = {
        "recall": recall_at_k(query_emb, doc_emb, query_ids, doc_ids, ks=ks),
        "calibration": calibration,
        "distractors": None,
        "ann": None,
        "query_thresholds": per_query_thresholds(query_emb, doc_emb, query_ids, doc_ids),
        "opis": operating_point_inconsistency(
            query_emb, doc_emb, query_ids, doc_ids, calibration["threshold_at_precision"]
        ),
        "transfer": None,
        "probability": None,
        "promises": None,
        "promises_with_distractors": None,
    }
    if split_calibration is not None:
        metrics["promises"] = check_promises(split_calibration, query_emb, doc_emb, query_ids, doc_ids)
        if distractor_emb is not None and len(distractor_emb):
            d_ext = np.concatenate([np.asarray(doc_emb, np.float32), np.asarray(distractor_emb, np.float32)])
            never = _ids_unlike(doc_ids, len(distractor_emb))
            metrics["promises_with_distractors"] = check_promises(
                split_calibration, query_emb, d_ext, query_ids, np.concatenate([np.asarray(doc_ids), never])
            )
    if probability_map is not None:  # fitted on another split: its calibration here
        metrics["probability"] = reliability(
            probability_map, query_emb, doc_emb, query_ids, doc_ids, caption_lengths=caption_lengths
        )
    if calibration_thresholds is not None:
        metrics["transfer"] = threshold_transfer(calibration_thresholds, query_emb, doc_emb, query_ids, doc_ids)
    if distractor_emb is not None:
        metrics["distractors"] = recall_with_distractors(
            query_emb, doc_emb, query_ids, doc_ids, distractor_emb, ks=distractor_ks
        )
    if ann_search_fn is not None:
        metrics["ann"] = ann_recall_loss(query_emb, doc_emb, query_ids, doc_ids, ann_search_fn, ks=distractor_ks)
    return metrics


def summary(metrics: dict) -> dict:
    """Flat headline figures (fractions): ``pr_auc``, ``average_precision``, ``rsum``, ``t2i_r1`` ..., ``dis_t2i_r100``,
    and (None when unavailable) ``achieved_precision_0.5/0.8/0.9``, ``achieved_recall_...``,
    ``calibration_error_...``, ``mean_calibration_error``, ``threshold_spread``, ``relative_threshold_spread``
    (see ``transfer.calibration_summary``), ``opis`` (caption queries), ``i2t_opis`` (image queries), the
    probability map's figures (:func:`probability_summary`) and the promises' (``guaranteed_recall_0.5`` ...:
    :func:`~ce_retrieval.evaluation.promise_check.promise_summary`; ``dis_guaranteed_...`` with distractors)."""
    out = {
        "pr_auc": metrics["calibration"]["pr_auc"],
        "average_precision": metrics["calibration"]["average_precision"],
        "best_f1": metrics["calibration"]["best_f1"]["f1"],
        "rsum": metrics["recall"]["rsum"],
    }
    for direction in ("t2i", "i2t"):
        for k, v in metrics["recall"][direction].items():
            out[f"{direction}_r{k}"] = v
    if metrics.get("distractors"):
        for k, v in metrics["distractors"]["t2i"].items():
            out[f"dis_t2i_r{k}"] = v
    out.update(calibration_summary(metrics.get("transfer"), metrics.get("query_thresholds")))
    out.update(opis_summary(metrics.get("opis")))
    out.update(probability_summary(metrics.get("probability")))
    out.update(promise_summary(metrics.get("promises")))
    with_distractors = promise_summary(metrics.get("promises_with_distractors"))
    out.update({f"dis_{k}": v for k, v in with_distractors.items() if k.startswith(("guaranteed_", "guarantee_"))})
    return out


def _ids_unlike(doc_ids, n: int) -> np.ndarray:
    """``n`` ids that equal no id of ``doc_ids`` (for distractors: relevant to no query)."""
    ids = np.asarray(doc_ids)
    if ids.dtype.kind in "iu":
        return np.arange(int(ids.min()) - n, int(ids.min()), dtype=ids.dtype)
    return np.array([f"__distractor_{i}" for i in range(n)], dtype=object)


def probability_summary(prob: dict | None) -> dict:
    """The probability map's headline figures (None when unavailable): ``probability_ece``, ``probability_ece_top``,
    ``probability_brier``, ``probability_log_loss``, their ``..._skill``, ``probability_reliability``,
    ``probability_resolution``, ``probability_pairs_ge_{c}``, ``probability_precision_ge_{c}`` for c = 0.5, 0.9,
    ``probability_query_error`` and ``probability_query_error_floor`` (mean per-query error over all queries)."""
    prob = prob or {}
    scores, per_query = prob.get("scores") or {}, (prob.get("per_query") or {}).get("all") or {}
    out = {"probability_ece": prob.get("ece"), "probability_ece_top": prob.get("ece_top")}
    for key in ("brier", "log_loss", "brier_skill", "log_loss_skill", "reliability", "resolution"):
        out[f"probability_{key}"] = scores.get(key)
    for level in CONFIDENT_LEVELS:
        confident = (prob.get("confident") or {}).get(f"{level:g}") or {}
        out[f"probability_pairs_ge_{level:g}"] = confident.get("num_pairs")
        out[f"probability_precision_ge_{level:g}"] = confident.get("precision")
    out["probability_query_error"] = per_query.get("error")
    out["probability_query_error_floor"] = per_query.get("floor")
    return out


def evaluate_model(
    text_encoder,
    image_encoder,
    split,
    distractor_images=None,
    output_dir: str | None = None,
    run_name: str = "run",
    config: dict | None = None,
    batch_size: int = 256,
    ks=(1, 5, 10),
    distractor_ks=(1, 5, 10, 100),
    ann_factory=None,
    plots: bool = True,
    num_plot_queries: int = 1000,
    calibration_split=None,
    calibration_thresholds: dict | None = None,
    precision_levels=None,
    delta: float | None = None,
) -> dict:
    """Embed ``split`` with the towers, compute every metric, and (with ``output_dir``) write the JSON and plots.

    Args:
      text_encoder, image_encoder: Keras models, ``[B] tf.string -> [B, d]`` (raw captions / encoded images).
      split: a :class:`ce_retrieval.data.RetrievalSplit`.
      distractor_images: encoded images relevant to no caption, appended to the gallery for Recall@1/5/10/100.
      output_dir: where ``eval_<split>.json`` and the PNGs go (nothing is written when None).
      run_name: groups several seeds of one configuration in ``ce-retrieval report``.
      config: the experiment configuration (JSON-able dict) stored with the results.
      ann_factory: optional ``doc_emb -> search_fn`` (e.g. :class:`ce_retrieval.search.ann.ScannSearch`):
        an approximate index over the split's images whose Recall@K loss against exact search is reported.
      calibration_split: a :class:`RetrievalSplit` (usually validation) on which thresholds for the precisions
        ``RELIABILITY_LEVELS`` are calibrated (``global_pr_auc``); ``metrics["transfer"]`` reports the precision
        they achieve on ``split`` and the JSON's ``calibration_split`` names the split (fingerprint, thresholds).
        The same split is calibrated with :func:`~ce_retrieval.evaluation.split_calibration.calibrate_split`
        (``precision_levels``, default 0.5 / 0.8 / 0.9, confidence 1 - ``delta``, default 0.9): ``metrics
        ["promises"]`` checks its guaranteed thresholds here, and the JSON's ``calibration_split`` carries the
        calibration (``split_calibration``, what ``ce-retrieval index --thresholds_json`` reads).
      calibration_thresholds: the same thresholds given directly (``{level: threshold or None}``) instead.

    Returns the JSON document as a dict (``summary`` holds the headline figures).
    """
    if calibration_split is not None and calibration_thresholds is not None:
        raise ValueError("evaluate_model: give calibration_split or calibration_thresholds, not both")
    start = time.perf_counter()
    query_emb, doc_emb, query_ids, doc_ids = embed_split(text_encoder, image_encoder, split, batch_size)
    distractor_emb = None
    if distractor_images is not None and len(distractor_images):
        distractor_emb = embed_strings(image_encoder, distractor_images, batch_size)
    embed_seconds = time.perf_counter() - start
    fingerprint = dataset_fingerprint(split)
    seconds = {"embed": embed_seconds}
    calibration_source, probability_map, calibration = None, None, None
    if calibration_split is not None:
        t0 = time.perf_counter()
        calibration_thresholds, calibration_source, calibration = _calibrate(
            text_encoder, image_encoder, calibration_split, batch_size, precision_levels, delta
        )
        probability_map = calibration.probability
        calibration_source["same_as_evaluated"] = calibration_source["dataset_fingerprint"] == fingerprint
        seconds["calibrate"] = time.perf_counter() - t0
    metrics = evaluate_embeddings(
        query_emb,
        doc_emb,
        query_ids,
        doc_ids,
        distractor_emb,
        ks=ks,
        distractor_ks=distractor_ks,
        ann_search_fn=None if ann_factory is None else ann_factory(doc_emb),
        calibration_thresholds=calibration_thresholds,
        probability_map=probability_map,
        caption_lengths=None if probability_map is None else caption_word_counts(split.captions),
        split_calibration=calibration,
    )
    result = {
        "schema_version": SCHEMA_VERSION,
        "run_name": run_name,
        "split": split.name,
        "summary": summary(metrics),
        "metrics": metrics,
        "num_captions": len(split.captions),
        "num_images": len(split.images),
        "num_distractors": 0 if distractor_emb is None else len(distractor_emb),
        "embedding_dim": int(query_emb.shape[1]),
        "dataset_fingerprint": fingerprint,
        # Where metrics["transfer"]'s thresholds come from (None: not calibrated, or thresholds given directly).
        "calibration_split": calibration_source,
        "git_commit": git_commit(),
        "config": config,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": {**seconds, "total": time.perf_counter() - start},
        "files": {},
    }
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        if plots:
            result["files"] = _write_plots(
                split,
                query_emb,
                doc_emb,
                metrics,
                output_dir,
                run_name,
                num_plot_queries,
                calibration_source["name"] if calibration_source else None,
            )
        path = os.path.join(output_dir, f"eval_{_file_tag(split.name)}.json")
        atomic_write_text(path, json.dumps(_jsonable(result), indent=1))
        result["files"]["json"] = path
    return _jsonable(result)


def _calibrate(text_encoder, image_encoder, calibration_split, batch_size, levels=None, delta=None):
    """Thresholds for ``RELIABILITY_LEVELS`` calibrated on ``calibration_split`` (the point estimates of the
    reliability diagram), a record of that split (with the probability map and the calibration), and the
    :class:`~ce_retrieval.evaluation.split_calibration.Calibration` (guarantee + probability map) made on it."""
    q, d, qi, di = embed_split(text_encoder, image_encoder, calibration_split, batch_size)
    cal = global_pr_auc(q, d, qi, di, target_precisions=RELIABILITY_LEVELS)
    thresholds = cal["threshold_at_precision"]
    promise = calibrate_split(
        q,
        d,
        qi,
        di,
        levels=DEFAULT_LEVELS if levels is None else levels,
        delta=DEFAULT_DELTA if delta is None else delta,
        source={"split": calibration_split.name},
    )
    return (
        thresholds,
        {
            "name": calibration_split.name,
            "dataset_fingerprint": dataset_fingerprint(calibration_split),
            "num_captions": len(calibration_split.captions),
            "num_images": len(calibration_split.images),
            "pr_auc": cal["pr_auc"],
            "threshold_at_precision": thresholds,
            "probability_map": promise.probability.to_json(),
            "split_calibration": promise.to_json(),
        },
        promise,
    )


def _write_plots(
    split, query_emb, doc_emb, metrics, output_dir, run_name, num_plot_queries, calibration_name=None
) -> dict:
    from ce_retrieval.evaluation import plots

    cal = metrics["calibration"]
    threshold = cal["best_f1"]["threshold"]
    files = {
        "pr_curve": plots.plot_pr_curves(
            {run_name: {**cal["curve"], "pr_auc": cal["pr_auc"]}},
            os.path.join(output_dir, f"pr_curve_{_file_tag(split.name)}.png"),
            title=f"Global precision-recall, {split.name} ({cal['num_pairs']:,} pairs)",
        ),
        "score_distribution": plots.plot_score_distributions(
            query_emb,
            doc_emb,
            os.path.join(output_dir, f"score_distribution_{_file_tag(split.name)}.png"),
            num_queries=num_plot_queries,
            title=f"{run_name}: score distribution per query ({split.name})",
            threshold=threshold,
        ),
    }
    indices, scores = exact_search(query_emb, doc_emb, min(5, len(doc_emb)))
    files["retrieval_sheet"] = plots.plot_retrieval_sheet(
        split.captions,
        split.caption_ids,
        split.images,
        split.image_ids,
        indices,
        scores,
        os.path.join(output_dir, f"retrieval_sheet_{_file_tag(split.name)}.png"),
        threshold=threshold,
        title=f"{run_name}: lowest (top) and highest (bottom) scoring queries, {split.name}",
    )
    if metrics.get("transfer"):
        source = f"on {calibration_name}" if calibration_name else "elsewhere"
        files["reliability"] = plots.plot_reliability(
            {run_name: reliability_curve(metrics["transfer"])},
            os.path.join(output_dir, f"reliability_{_file_tag(split.name)}.png"),
            title=f"Thresholds calibrated {source}: promised vs achieved precision on {split.name}",
        )
    if metrics.get("probability"):
        bins = metrics["probability"]["bins"]
        predicted = [np.nan if v is None else v for v in bins["predicted"]]  # None: an empty bin
        files["probability_reliability"] = plots.plot_reliability(
            {run_name: {"promised": predicted, "achieved": bins["observed"]}},
            os.path.join(output_dir, f"probability_reliability_{_file_tag(split.name)}.png"),
            title=f"P(relevant | score) fitted on {calibration_name}: predicted vs observed on {split.name}",
            axes=PROBABILITY_AXES,
        )
    return files

"""Part 3 of #21's evidence: where and why one objective (CE) loses text->image R@1 against another (SS).

From the suite's runs on disk (test embeddings of every run, the family's sidecar of caption fits), for each
regime and family where both objectives ran, paired by seed:

* **per-query rank changes**: the rank of each caption's labelled image under CE and under SS (rank = 1 + the
  number of images scoring higher); the share of captions CE ranks better / worse, and R@1 won / lost;
* **by caption specificity**: captions bucketed by how many test images they fit (``claim ⊆ facts``, the
  family's ground truth: 1 = specific, many = vague); per bucket, labelled R@1 and *fits-aware* R@1 (the top
  image fits the caption, whatever its id) — a loss on labelled R@1 that fits-aware R@1 does not show is a
  loss on unlabelled positives, not a retrieval error;
* **fits-aware average precision**: the global PR curve's AP with relevance = fits (many-to-many) instead of
  ids, so a model is not charged for scoring an unlabelled but fitting image high;
* **score offsets by specificity**: per caption, its labelled pair's score and its row's mean score, as
  z-scores over all test pairs of that model (so models with different score scales compare);
* **curves against steps**: the paired difference CE − SS of PR-AUC and R@1 at each recorded step (heads: on
  test; scratch: on validation, from the training job's callback).

Writes ``analysis.md``, ``analysis.json`` and ``analysis_curves.png`` under the results folder.
"""

from __future__ import annotations

import json
import os

import numpy as np

from benchmarks.common.records import write_record

BUCKETS = ((1, 1), (2, 3), (4, 10), (11, 50), (51, None))


def _bucket_name(lo, hi) -> str:
    return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f">{lo - 1}")


def _test_captions(out: str, family: str) -> list[str]:
    from ce_retrieval.data import DataConfig, load_retrieval_split

    with open(os.path.join(out, "families", family, "family.json"), encoding="utf-8") as f:
        cfg = DataConfig(**json.load(f)["data_config"])
    split = load_retrieval_split(cfg, "test")
    return split.captions, split.caption_ids


def fits_average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    """Global average precision over every (caption, image) pair with a many-to-many relevance matrix
    (``sklearn.metrics.average_precision_score`` on the flattened pairs)."""
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(relevant.ravel(), scores.ravel()))


def per_query(q, d, q_ids, d_ids, fits_ids: list[set]) -> dict:
    """Per caption: the labelled image's rank, whether the top image fits, the z-scored labelled and row-mean
    scores (over every test pair of this model)."""
    scores = q.astype(np.float32) @ d.astype(np.float32).T
    column = {int(i): k for k, i in enumerate(d_ids.tolist())}
    truth = np.asarray([column.get(int(i), -1) for i in q_ids])
    has = truth >= 0
    positive = np.where(has, scores[np.arange(len(q)), np.maximum(truth, 0)], np.nan)
    rank = np.where(has, 1 + (scores > positive[:, None]).sum(axis=1), np.nan)
    top = d_ids[scores.argmax(axis=1)]
    fits_top = np.asarray([int(t) in f for t, f in zip(top.tolist(), fits_ids, strict=True)])
    mu, sigma = float(scores.mean()), float(scores.std()) or 1.0
    column_of = {int(i): k for k, i in enumerate(d_ids.tolist())}
    fits_matrix = np.zeros(scores.shape, bool)
    for row, fitting in enumerate(fits_ids):
        fits_matrix[row, [column_of[i] for i in fitting if i in column_of]] = True
    return {
        "fits_ap": fits_average_precision(scores, fits_matrix),
        "rank": rank,
        "fits_top": fits_top,
        "z_positive": (positive - mu) / sigma,
        "z_row": (scores.mean(axis=1) - mu) / sigma,
    }


def _load(out: str, regime: str, family: str, name: str, seed: int):
    with np.load(os.path.join(out, "runs", regime, family, f"{name}-seed{seed}.npz")) as z:
        return z["q"], z["d"], z["q_ids"], z["d_ids"]


def compare(out: str, regime: str, family: str, seeds: list[int], a: str = "CE", b: str = "SS") -> dict:
    """The rank-change, specificity and score-offset figures of ``a`` against ``b`` (module docstring)."""
    from benchmarks.quality.families.family_format import read_sidecar

    captions, caption_ids = _test_captions(out, family)
    fits = read_sidecar(os.path.join(out, "families", family), "test")["fits"]
    fits_ids = [set(fits[c]) for c in captions]
    n_fit = np.asarray([len(f) for f in fits_ids])
    per_seed = []
    for seed in seeds:
        runs = {}
        for name in (a, b):
            q, d, qi, di = _load(out, regime, family, name, seed)
            if not np.array_equal(qi, caption_ids):
                raise ValueError(f"{regime}/{family}/{name}-seed{seed}: captions are not in the loader's order")
            runs[name] = per_query(q, d, qi, di, fits_ids)
        per_seed.append(runs)
    buckets = []
    for lo, hi in BUCKETS:
        mask = (n_fit >= lo) & (n_fit <= (hi or n_fit.max(initial=0)))
        if not mask.any():
            continue
        row = {"fits": _bucket_name(lo, hi), "captions": int(mask.sum())}
        for name in (a, b):
            row[name] = {
                "r1": float(np.mean([np.mean(r[name]["rank"][mask] == 1) for r in per_seed])),
                "fits_r1": float(np.mean([np.mean(r[name]["fits_top"][mask]) for r in per_seed])),
                "mean_rank": float(np.mean([np.nanmean(r[name]["rank"][mask]) for r in per_seed])),
                "z_positive": float(np.mean([np.nanmean(r[name]["z_positive"][mask]) for r in per_seed])),
                "z_row": float(np.mean([np.nanmean(r[name]["z_row"][mask]) for r in per_seed])),
            }
        ra = np.stack([r[a]["rank"][mask] for r in per_seed])
        rb = np.stack([r[b]["rank"][mask] for r in per_seed])
        row["better"] = float(np.mean(ra < rb))
        row["worse"] = float(np.mean(ra > rb))
        row["r1_won"] = float(np.mean((ra == 1) & (rb > 1)))
        row["r1_lost"] = float(np.mean((ra > 1) & (rb == 1)))
        buckets.append(row)
    overall = {
        name: {
            "r1": float(np.mean([np.mean(r[name]["rank"] == 1) for r in per_seed])),
            "fits_r1": float(np.mean([np.mean(r[name]["fits_top"]) for r in per_seed])),
            "fits_ap": float(np.mean([r[name]["fits_ap"] for r in per_seed])),
        }
        for name in (a, b)
    }
    return {"regime": regime, "family": family, "a": a, "b": b, "seeds": seeds, "overall": overall, "buckets": buckets}


def curves(docs_a: list[dict], docs_b: list[dict]) -> dict:
    """Paired mean difference a − b at each recorded step (only steps every seed of both recorded)."""
    by_seed_b = {d["config"]["train"]["seed"]: d for d in docs_b}
    pairs = [
        (da, by_seed_b[da["config"]["train"]["seed"]]) for da in docs_a if da["config"]["train"]["seed"] in by_seed_b
    ]
    if not pairs or not all(da.get("curve") and db.get("curve") for da, db in pairs):
        return {}
    steps = sorted(set.intersection(*(set(da["curve"]["step"]) & set(db["curve"]["step"]) for da, db in pairs)))
    out = {"step": steps, "split": pairs[0][0]["curve"].get("split", "test")}
    for key in ("pr_auc", "t2i_r1"):
        diffs, a_mean, b_mean = [], [], []
        for step in steps:
            va = [da["curve"][key][da["curve"]["step"].index(step)] for da, _ in pairs]
            vb = [db["curve"][key][db["curve"]["step"].index(step)] for _, db in pairs]
            diffs.append(float(np.mean(np.subtract(va, vb))))
            a_mean.append(float(np.mean(va)))
            b_mean.append(float(np.mean(vb)))
        out[key] = {"diff": diffs, "a": a_mean, "b": b_mean}
    return out


def _markdown(items: list[dict]) -> str:
    lines = [
        "# Why CE loses text→image R@1 where it does (#21, part 3): evidence from the suite's runs",
        "",
        "Per regime and family, CE against SS paired by seed (means over seeds). *fits*: how many test images the",
        "caption fits by the family's ground truth; *fits-aware R@1*: the top image fits the caption, whatever its",
        "id; *z*: score as a z-score over all test pairs of that model. Rank: of the labelled image (1 = top).",
        "",
    ]
    for item in items:
        c = item["compare"]
        a, b = c["a"], c["b"]
        o = c["overall"]
        lines += [
            f"## {c['regime']} regime, {c['family']} (seeds {c['seeds']})",
            "",
            f"Labelled t→i R@1 {a} {100 * o[a]['r1']:.1f} vs {b} {100 * o[b]['r1']:.1f} "
            f"(Δ {100 * (o[a]['r1'] - o[b]['r1']):+.1f}); fits-aware R@1 {a} {100 * o[a]['fits_r1']:.1f} vs "
            f"{b} {100 * o[b]['fits_r1']:.1f} (Δ {100 * (o[a]['fits_r1'] - o[b]['fits_r1']):+.1f}); "
            f"fits-aware global AP {a} {100 * o[a]['fits_ap']:.1f} vs {b} {100 * o[b]['fits_ap']:.1f}.",
            "",
            f"| fits | captions | R@1 {a} / {b} | fits-aware R@1 {a} / {b} | mean rank {a} / {b} | "
            f"{a} ranks better / worse | R@1 won / lost | z labelled {a} / {b} | z row mean {a} / {b} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in c["buckets"]:
            ra, rb = r[a], r[b]
            lines.append(
                f"| {r['fits']} | {r['captions']} | {100 * ra['r1']:.1f} / {100 * rb['r1']:.1f} | "
                f"{100 * ra['fits_r1']:.1f} / {100 * rb['fits_r1']:.1f} | {ra['mean_rank']:.1f} / {rb['mean_rank']:.1f}"
                f" | {100 * r['better']:.0f}% / {100 * r['worse']:.0f}% | {100 * r['r1_won']:.1f} / "
                f"{100 * r['r1_lost']:.1f} | {ra['z_positive']:.2f} / {rb['z_positive']:.2f} | "
                f"{ra['z_row']:.2f} / {rb['z_row']:.2f} |"
            )
        cv = item["curves"]
        if cv:
            lines += ["", f"Against steps ({cv['split']} split), {a} − {b}, paired mean over seeds:", ""]
            lines.append("| step | " + " | ".join(str(s) for s in cv["step"]) + " |")
            lines.append("|---|" + "---:|" * len(cv["step"]))
            for key, label in (("pr_auc", "Δ PR-AUC"), ("t2i_r1", "Δ t→i R@1")):
                lines.append(f"| {label} | " + " | ".join(f"{100 * v:+.1f}" for v in cv[key]["diff"]) + " |")
        lines.append("")
    if not items:
        lines.append("No regime and family has runs of both objectives yet.")
    return "\n".join(lines) + "\n"


def _plot(path: str, items: list[dict]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_curves = [it for it in items if it["curves"]]
    fig, axes = plt.subplots(2, max(1, len(with_curves)), figsize=(4 * max(1, len(with_curves)), 6), squeeze=False)
    for col, item in enumerate(with_curves):
        c, cv = item["compare"], item["curves"]
        for row, (key, label) in enumerate((("pr_auc", "PR-AUC (%)"), ("t2i_r1", "t→i R@1 (%)"))):
            ax = axes[row][col]
            ax.plot(cv["step"], 100 * np.asarray(cv[key]["a"]), marker="o", label=c["a"])
            ax.plot(cv["step"], 100 * np.asarray(cv[key]["b"]), marker="s", label=c["b"])
            ax.set_title(f"{c['family']}, {c['regime']} ({cv['split']})", fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(results_dir: str, out: str, runs: list[dict], a: str = "CE", b: str = "SS") -> list[str]:
    groups: dict = {}
    for doc in runs:
        groups.setdefault((doc["regime"], doc["family"]), {}).setdefault(doc["run_name"], []).append(doc)
    items = []
    for (regime, family), by_name in sorted(groups.items()):
        if a not in by_name or b not in by_name:
            continue
        seeds = sorted(
            {d["config"]["train"]["seed"] for d in by_name[a]} & {d["config"]["train"]["seed"] for d in by_name[b]}
        )
        items.append({"compare": compare(out, regime, family, seeds, a, b), "curves": curves(by_name[a], by_name[b])})
    os.makedirs(results_dir, exist_ok=True)
    json_path, md_path = write_record(results_dir, "analysis", items, _markdown(items), echo=False)
    files = [md_path, json_path, os.path.join(results_dir, "analysis_curves.png")]
    _plot(files[2], items)
    return files

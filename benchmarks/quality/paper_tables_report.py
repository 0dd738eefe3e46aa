"""Writes the paper-table benchmark's results: table.md, summary.json and the PNG figures (see paper_tables.py)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from benchmarks.common.records import write_json, write_markdown
from ce_retrieval.evaluation import plots
from ce_retrieval.evaluation.report import format_markdown, paired_difference
from ce_retrieval.evaluation.transfer import reliability_curve

_PAIRED = [
    ("pr_auc", "global PR-AUC (points)", 100),
    ("t2i_r1", "R@1 (points)", 100),
    ("dis_t2i_r1", "R@1 with distractors (points)", 100),
    ("achieved_precision_0.5", "precision achieved at the 0.5 threshold (points)", 100),
    ("achieved_recall_0.5", "recall at the 0.5 threshold (points)", 100),
    ("mean_calibration_error", "mean calibration error (points)", 100),
    ("relative_threshold_spread", "relative spread of per-query thresholds", 1),
]
_PAIRS = [("CrossExampleSoftmax", "SampledSoftmax"), ("CrossExampleNegativeMining", "StochasticNegativeMining")]


def _mean_std(values):
    v = np.asarray([x for x in values if x is not None], np.float64)
    return (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0) if len(v) else (None, None)


def plot_curves(docs: dict, path: str) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (loss, runs) in enumerate(docs.items()):
        color = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
        steps = runs[0]["curve"]["step"]
        for ax, key in zip(axes, ("pr_auc", "t2i_r1"), strict=True):
            values = 100 * np.asarray([r["curve"][key] for r in runs], np.float64)
            mean, std = values.mean(0), values.std(0)
            ax.plot(steps, mean, color=color, label=f"{loss} (n={len(runs)})")
            ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
    for ax, label in zip(axes, ("global PR-AUC (%)", "text->image R@1 (%)"), strict=True):
        ax.set_xlabel("training step (batch 512)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Test metrics against steps (mean ± std over seeds): where each objective plateaus", fontsize=10)
    return plots._save(fig, path)


def plot_sweep(rows: list[dict], path: str, xlabel: str, log_x: bool) -> str:
    """PR-AUC of SS and CE (left), and the paired CE - SS gain in PR-AUC and R@1 against the swept value."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    x = [r["value"] for r in rows]
    ss = np.asarray([100 * r["ss_pr_auc"] for r in rows])
    axes[0].plot(x, ss, marker="o", label="SampledSoftmax")
    axes[0].plot(x, ss + np.asarray([100 * r["pr_auc"]["mean"] for r in rows]), marker="o", label="CrossExampleSoftmax")
    axes[0].set_ylabel("global PR-AUC (%), mean over seeds")
    for ax, key, label in zip(axes[1:], ("pr_auc", "t2i_r1"), ("PR-AUC", "R@1"), strict=True):
        mean = [100 * r[key]["mean"] for r in rows]
        std = [100 * (r[key]["std"] or 0.0) for r in rows]
        ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label="CE - SS (paired, mean ± std over seeds)")
        ax.axhline(0, color="0.4", linewidth=1)
        ax.set_ylabel(f"{label} gain of CE over SS (points)")
    for ax in axes:
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return plots._save(fig, path)


def _sweep_table(rows: list[dict], name: str) -> list[str]:
    out = [
        f"| {name} | steps | SS PR-AUC | CE − SS PR-AUC | p | SS R@1 | CE − SS R@1 | p | n |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        pa, r1 = r["pr_auc"], r["t2i_r1"]

        def p(x):
            return "-" if x["p_value"] is None else f"{x['p_value']:.3f}"

        out.append(
            f"| {r['value']:g} | {r['steps']} | {100 * r['ss_pr_auc']:.2f} "
            f"| {100 * pa['mean']:+.2f} ± {100 * (pa['std'] or 0):.2f} | {p(pa)} "
            f"| {100 * r['ss_t2i_r1']:.2f} "
            f"| {100 * r1['mean']:+.2f} ± {100 * (r1['std'] or 0):.2f} | {p(r1)} | {pa['n']} |"
        )
    return out


def write(out: str, docs: dict, sweeps: dict, plan, minutes: float, seconds: dict) -> list[str]:
    results = [d for runs in docs.values() for d in runs]
    files = [plot_curves(docs, os.path.join(out, "curves.png"))]
    lines = ["## Table (test split; mean ± std over seeds)", "", format_markdown(results), ""]
    paired = {}
    lines += [
        "## Paired differences (same seed = same initial heads and batch order)",
        "",
        "| comparison | figure | mean difference | std | n | p (paired t-test) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for a, b in _PAIRS:
        if a in docs and b in docs:
            for key, label, scale in _PAIRED:
                d = paired_difference(results, a, b, key)
                paired[f"{a}-{b}:{key}"] = d
                if d["n"]:
                    p = "-" if d["p_value"] is None else f"{d['p_value']:.2g}"
                    lines.append(
                        f"| {a} − {b} | {label} | {scale * d['mean']:+.3f} "
                        f"| {scale * (d['std'] or 0):.3f} | {d['n']} | {p} |"
                    )
    lines.append("")
    reliability = {}
    for loss, runs in docs.items():
        curves = [reliability_curve(r["metrics"]["transfer"]) for r in runs if r["metrics"].get("transfer")]
        promised = sorted({p for c in curves for p in c["promised"]})
        if not promised:  # no level reached on validation in any seed: drawn as "(no points)"
            reliability[loss] = {"promised": [], "achieved": [], "std": [], "runs_reaching": []}
        else:
            per_run = [dict(zip(c["promised"], c["achieved"], strict=True)) for c in curves]
            achieved = np.asarray([[run.get(p, np.nan) for p in promised] for run in per_run], np.float64)
            with np.errstate(all="ignore"):
                mean, std = np.nanmean(achieved, 0), np.nanstd(achieved, 0)
            reliability[loss] = {
                "promised": promised,
                "achieved": [None if np.isnan(m) else float(m) for m in mean],
                "std": [None if np.isnan(v) else float(v) for v in std],
                "runs_reaching": [int(np.sum(~np.isnan(achieved[:, i]))) for i in range(len(promised))],
            }
    if reliability:
        files.append(plots.plot_reliability(reliability, os.path.join(out, "reliability.png")))
    separation = {}
    for loss in ("SampledSoftmax", "CrossExampleSoftmax"):
        first = docs.get(loss, [{}])[0]
        if "_embeddings" in first:
            pos, neg = plots.pooled_pair_scores(*first["_embeddings"])
            s = first["summary"]
            separation[loss] = {
                "positives": pos,
                "negatives": neg,
                "note": f"seed 0: PR-AUC {100 * s['pr_auc']:.1f}%, R@1 {100 * s['t2i_r1']:.1f}%",
            }
    if separation:
        files.append(
            plots.plot_score_separation(
                separation,
                os.path.join(out, "separation.png"),
                title="Test split, all caption x image pairs: relevant vs irrelevant",
            )
        )
    for name, rows in sweeps.items():
        label = {"batch": "global batch size", "scale": "logit scale λ"}[name]
        files.append(plot_sweep(rows, os.path.join(out, f"sweep_{name}.png"), label, log_x=name == "batch"))
        lines += [
            f"## CE gain against {label} ({plan.sweep_epochs:g} epochs of the training captions, "
            f"{plan.sweep_seeds} paired seeds)",
            "",
            *_sweep_table(rows, label),
            "",
        ]
    lines.append(
        f"Compute recorded for these results: {(seconds['features'] + seconds['runs']) / 60:.1f} min (pretrained "
        f"features {seconds['features'] / 60:.1f} min, {seconds['runs'] / 60:.1f} min of runs); this invocation "
        f"took {minutes:.1f} min (runs found on disk are reused)."
    )
    table = write_markdown(out, "table", "\n".join(lines) + "\n")
    summary = {
        "plan": dataclasses.asdict(plan),
        "minutes": minutes,
        "seconds": seconds,
        "table": {
            loss: {k: _mean_std([r["summary"].get(k) for r in runs]) + (len(runs),) for k in runs[0]["summary"]}
            for loss, runs in docs.items()
        },
        "paired": {k: {kk: vv for kk, vv in v.items() if kk != "pairs"} for k, v in paired.items()},
        "sweeps": sweeps,
        "reliability": reliability,
        "curves": {
            loss: {
                "step": runs[0]["curve"]["step"],
                **{k: np.mean([r["curve"][k] for r in runs], 0).tolist() for k in ("pr_auc", "t2i_r1")},
            }
            for loss, runs in docs.items()
        },
    }
    write_json(out, "summary", summary)
    return [table, *files]

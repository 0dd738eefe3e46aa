"""Writes the paper-table benchmark's results: table.md, summary.json and the PNG figures (see paper_tables.py)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from benchmarks.common.records import write_json, write_markdown
from benchmarks.quality.pairing import paired_by_draw
from ce_retrieval.evaluation import plots
from ce_retrieval.evaluation.report import format_markdown
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
_BASELINE = "SampledSoftmax"
# Every objective against Sampled Softmax, the paper's mining pair, and Cross-Example Softmax against the two
# objectives a user would otherwise pick today.
_EXTRA_PAIRS = [
    ("CrossExampleNegativeMining", "StochasticNegativeMining"),
    ("CrossExampleSoftmax", "SymmetricInfoNCE"),
    ("CrossExampleSoftmax", "SigLIP"),
]


def _pairs(labels) -> list[tuple]:
    pairs = [(a, _BASELINE) for a in labels if a != _BASELINE and _BASELINE in labels]
    return pairs + [(a, b) for a, b in _EXTRA_PAIRS if a in labels and b in labels]


def _per_draw_lines(docs: dict, draws: int) -> list[str]:
    """PR-AUC and t→i R@1 per objective and feature draw (mean over the draw's seeds): how much the draw moves
    every objective together."""
    head = " | ".join(f"draw {k} PR-AUC | draw {k} R@1" for k in range(draws))
    lines = [
        "## Per feature draw (mean over its seeds, %)",
        "",
        f"| objective | {head} | R@1 over all runs: min – max (spread) |",
    ]
    lines.append("|---|" + "---:|" * (2 * draws + 1))
    for label, runs in docs.items():
        cells = []
        for k in range(draws):
            mine = [r["summary"] for r in runs if r["config"]["train"].get("feature_draw", 0) == k]
            for key in ("pr_auc", "t2i_r1"):
                values = [m[key] for m in mine if m.get(key) is not None]
                cells.append(f"{100 * np.mean(values):.2f}" if values else "–")
        r1 = [100 * r["summary"]["t2i_r1"] for r in runs if r["summary"].get("t2i_r1") is not None]
        cells.append(f"{min(r1):.2f} – {max(r1):.2f} ({max(r1) - min(r1):.2f})" if r1 else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def _levels(run: dict) -> dict:
    """A run's promise check per level (``metrics.promises.levels``: ``evaluation.promise_check``)."""
    return (run["metrics"].get("promises") or {}).get("levels") or {}


def _promise_lines(docs: dict) -> list[str]:
    """Precision levels promised from the validation split, per objective, checked on test: for each level how many
    runs the guarantee (confidence 1 − δ) certified and in how many of those the test split got at least the level;
    how many point estimates kept theirs; the highest precision the guarantee could certify; and what the point
    estimate for 0.5 achieved."""
    keys = sorted({k for runs in docs.values() for r in runs for k in _levels(r)}, key=float)
    if not keys:
        return []
    head = " | ".join(f"P ≥ {k}" for k in keys)
    lines = [
        "## Promises of precision (thresholds from validation, checked on test)",
        "",
        "Each level's cell: runs whose guaranteed threshold (confidence 0.9) was certified / of those, runs where test "
        "got at least the level · runs where the point estimate's threshold got at least the level on test.",
        "",
        f"| objective | runs | {head} | highest certifiable precision (min / mean / max) "
        "| point estimate for 0.5: achieved (min–max) |",
        "|---|---:|" + "---:|" * len(keys) + "---:|---:|",
    ]
    for label, runs in docs.items():
        by_level = [_levels(r) for r in runs]
        cells = []
        for k in keys:
            entries = [levels[k] for levels in by_level if k in levels]
            certified = [e for e in entries if e.get("refused") is None]
            kept = sum(1 for e in certified if e.get("kept"))
            estimate = sum(1 for e in entries if e.get("estimate_kept"))
            cells.append(f"{len(certified)} / {kept} · {estimate}")
        # per run: the largest bound over its levels (a refused level holds the highest of any threshold)
        found = [[e["best_certified"] for e in lv.values() if e.get("best_certified") is not None] for lv in by_level]
        best = [max(f) for f in found if f]
        achieved = [((levels.get("0.5") or {}).get("estimated") or {}).get("precision") for levels in by_level]
        achieved = [100 * x for x in achieved if x is not None]
        best_cell = f"{min(best):.3f} / {np.mean(best):.3f} / {max(best):.3f}" if best else "–"
        span = f"{min(achieved):.1f}–{max(achieved):.1f} %" if achieved else "–"
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + f" | {best_cell} | {span} |")
    return lines + ["", _broken_line(docs), ""]


def _broken_line(docs: dict) -> str:
    """Runs with at least one certified promise that test did not keep, by feature draw, and the largest
    shortfall: the per-run event the confidence 1 − δ bounds (every level of a run is promised at once)."""
    runs = [r for rs in docs.values() for r in rs]
    broken, shortfall, certified, kept = {}, 0.0, 0, 0
    for r in runs:
        made = [(float(k), e) for k, e in _levels(r).items() if e.get("refused") is None]
        certified += len(made)
        kept += sum(1 for _, e in made if e.get("kept"))
        missed = [(p, e) for p, e in made if e.get("kept") is False]
        if missed:
            draw = r["config"]["train"].get("feature_draw", 0)
            broken[draw] = broken.get(draw, 0) + 1
            shortfall = max([shortfall] + [p - e["guaranteed"]["precision"] for p, e in missed])
    by_draw = ", ".join(f"{n} on draw {d}" for d, n in sorted(broken.items())) or "none"
    return (
        f"Runs with at least one certified promise not kept on test: {sum(broken.values())} of {len(runs)} "
        f"({by_draw}; {certified} promises certified in all, {kept} kept), largest shortfall {shortfall:.3f}. "
        "The runs share one validation and one test split (the data seed is fixed; draws and seeds change the "
        "features and the heads), so they are not independent checks of the confidence."
    )


def _scale_lines(docs: dict, scales: dict) -> list[str]:
    """The temperature each objective ran at: λ chosen on validation (with the sweep's validation scores), the
    fixed λ, or the learned t and b (mean over runs at the end of training)."""
    lines = ["## Temperature per objective", "", "| objective | λ | how | validation PR-AUC + R@1 per candidate |"]
    lines.append("|---|---:|---|---|")
    for label, runs in docs.items():
        learned = [r["config"]["train"].get("learned") or {} for r in runs]
        if learned and learned[0]:
            names = sorted(learned[0])
            means = {k: float(np.mean([m[k] for m in learned])) for k in names}
            t = np.exp(means["log_temperature"]) if "log_temperature" in means else None
            how = "learned: t " + (f"{t:.2f}" if t is not None else "?") + f", b {means.get('logit_bias', 0):.2f}"
            lines.append(f"| {label} | – | {how} (init 10, −10; mean over runs) | not swept |")
            continue
        choice = scales.get(label, {})
        sweep = choice.get("sweep") or []
        cells = ", ".join(f"λ {r['scale']:g}: {100 * r['score']:.1f}" for r in sweep) or "–"
        how = "chosen on validation (draw 0, seed 0)" if sweep else "fixed"
        lines.append(
            f"| {label} | {choice.get('scale', runs[0]['config']['train'].get('scale')):g} | {how} | {cells} |"
        )
    return lines + [""]


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


def write(
    out: str,
    docs: dict,
    sweeps: dict,
    plan,
    minutes: float,
    seconds: dict,
    scales: dict | None = None,
    machine: dict | None = None,
) -> list:
    results = [d for runs in docs.values() for d in runs]
    files = [plot_curves(docs, os.path.join(out, "curves.png"))]
    draws = getattr(plan, "draws", 1)
    over = f"{draws} feature draws × {plan.seeds} seeds" if draws > 1 else f"{plan.seeds} seeds"
    lines = []
    if machine:
        lines += [
            f"Machine: {machine['cpu']}, {machine['cores']} cores; load average (1 min) {machine['load_min']:.2f}–"
            f"{machine['load_max']:.2f} during this invocation (samples {machine['load_samples']}; runs found on disk "
            f"were trained by an earlier one, and their seconds are their own); {machine['date']}.",
            "",
        ]
    # with several draws the CE − SS lines of format_markdown (seeds as units) would overstate; the draw-unit
    # tests are the paired table below
    lines += [f"## Table (test split; mean ± std over {over})", "", format_markdown(results, paired=draws == 1), ""]
    lines += _scale_lines(docs, scales or {})
    if draws > 1:
        lines += _per_draw_lines(docs, draws)
    lines += _promise_lines(docs)
    paired = {}
    unit = "feature draw (mean over its seeds; one-sample t-test)" if draws > 1 else "seed (paired t-test)"
    lines += [
        f"## Paired differences (same draw and seed = same features, initial heads and batch order; unit: {unit})",
        "",
        "| comparison | figure | mean difference | sd between units | n | p | per draw | sd within a draw |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for a, b in _pairs(list(docs)):
        for key, label, scale in _PAIRED:
            d = paired_by_draw(docs[a], docs[b], key)
            if d is None:
                continue
            paired[f"{a}-{b}:{key}"] = d
            p = "-" if d["p"] is None else f"{d['p']:.2g}"
            per_draw = ", ".join(f"{scale * v:+.2f}" for v in d["draw_diffs"].values()) if draws > 1 else "–"
            within = "–" if d["seed_sd"] is None else f"{scale * d['seed_sd']:.3f}"
            lines.append(
                f"| {a} − {b} | {label} | {scale * d['diff']:+.3f} | {scale * (d['sd'] or 0):.3f} | {d['units']} "
                f"| {p} | {per_draw} | {within} |"
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
        "scales": scales or {},
        "machine": machine or {},
        "minutes": minutes,
        "seconds": seconds,
        "table": {
            loss: {k: _mean_std([r["summary"].get(k) for r in runs]) + (len(runs),) for k in runs[0]["summary"]}
            for loss, runs in docs.items()
        },
        "paired": paired,
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

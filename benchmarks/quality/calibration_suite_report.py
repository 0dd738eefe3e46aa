"""The calibration suite's record: ``suite.json``, ``suite.md`` (a table per regime and family) and a plot per family.

Each cell is the mean ± sample sd over runs; for every objective other than SS, the paired difference to SS
(same feature draw and seed) and its two-sided p-value, with the feature draw as the unit where there are several
(``pairing.paired_by_draw``). Figures are percentages
except OPIS (as measured, ×100). A column that no run has (e.g. OPIS before the metric exists) says so. Recall at
guaranteed precision p: the test recall at the threshold guaranteed on val (confidence 0.9) for precision p on the
test gallery, 0 where the level was refused (``evaluation.promise_check``).
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.common.records import write_record
from benchmarks.quality.pairing import paired_by_draw, run_unit

COLUMNS = (
    ("PR-AUC", "pr_auc"),
    ("t→i R@1", "t2i_r1"),
    ("i→t R@1", "i2t_r1"),
    ("recall @ val thr for P=0.5", "achieved_recall_0.5"),
    ("its achieved precision", "achieved_precision_0.5"),
    ("calibration error", "mean_calibration_error"),
    ("recall @ guaranteed P≥0.5", "guaranteed_recall_0.5"),
    ("recall @ guaranteed P≥0.8", "guaranteed_recall_0.8"),
    ("recall @ guaranteed P≥0.9", "guaranteed_recall_0.9"),
    ("OPIS ×100", "opis"),
)


def _groups(runs: list[dict]) -> dict:
    out: dict = {}
    for doc in runs:
        out.setdefault((doc["regime"], doc["family"]), {}).setdefault(doc["run_name"], []).append(doc)
    return out


def _values(docs, key):
    return [d["summary"].get(key) for d in docs if d["summary"].get(key) is not None]


def table_rows(by_objective: dict, baseline: str = "SS") -> list[dict]:
    """One row per objective: ``{"objective", "scale", key: {"mean", "sd", "n", "diff", "diff_sd", "p", "pairs",
    "by"}}`` (diff/p vs ``baseline``, :func:`paired_by_draw`)."""
    rows = []
    for name, docs in by_objective.items():
        # λ in the label only where it was chosen on validation (a sweep); otherwise every objective has the default
        scales = sorted(
            {d["config"]["train"].get("scale") for d in docs if d["config"]["train"].get("scales")} - {None}
        )
        row = {"objective": name, "units": sorted(run_unit(d) for d in docs), "scale": scales[0] if scales else None}
        row["seeds"] = sorted({u[1] for u in row["units"]})
        row["draws"] = sorted({u[0] for u in row["units"]})
        for _, key in COLUMNS:
            v = np.asarray(_values(docs, key), np.float64)
            cell = {
                "mean": float(v.mean()) if len(v) else None,
                "sd": float(v.std(ddof=1)) if len(v) > 1 else None,
                "n": len(v),
            }
            if name != baseline and baseline in by_objective and len(v):
                d = paired_by_draw(docs, by_objective[baseline], key)
                if d is not None:
                    cell.update(diff=d["diff"], diff_sd=d["sd"], p=d["p"], pairs=d["units"], by=d["by"])
                    cell["seed_sd"] = d["seed_sd"]
            row[key] = cell
        rows.append(row)
    return rows


def _cell(cell: dict) -> str:
    if cell["mean"] is None:
        return "–"
    text = f"{100 * cell['mean']:.1f}" + (f" ± {100 * cell['sd']:.1f}" if cell["sd"] is not None else "")
    if cell.get("diff") is not None:
        p, sd = cell.get("p"), cell.get("diff_sd")
        text += f" (Δ {100 * cell['diff']:+.1f}" + (f" ± {100 * sd:.1f}" if sd is not None else "")
        text += f", p {p:.2g})" if p is not None else ")"
    return text


def markdown(outcome: dict, tables: dict, plan, minutes: float, machine: dict | None = None) -> str:
    machine = machine or {}
    lines = [
        "# Calibration suite (#21): objectives x dataset families x regimes, paired seeds",
        "",
        f"Plan: families {', '.join(plan.families)}; {plan.seeds} paired seeds"
        + (f" ({plan.seeds_of('scratch')} in the scratch regime)" if plan.seeds_of("scratch") != plan.seeds else "")
        + f"; heads regime "
        f"{plan.heads_steps} steps at batch {plan.heads_batch}; scratch regime "
        f"{plan.scratch_epochs} x {plan.scratch_steps_per_epoch} steps at batch {plan.scratch_batch}. "
        f"Wall time of this invocation {minutes:.1f} min for {len(outcome['runs'])} runs (cached runs are read, "
        "not re-trained).",
        "",
        *(
            [
                f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; load average (1 min) "
                f"{machine.get('load_min', 0):.1f}–{machine.get('load_max', 0):.1f} during the run; "
                f"{machine.get('date', '?')}.",
                "",
            ]
            if machine
            else []
        ),
        f"Cells: mean ± sd over {plan.feature_draws} feature draw(s) × {plan.seeds} seeds, in % (OPIS ×100); "
        "Δ = paired mean difference to SS (same draw and seed) ± the sd of the unit differences; with several "
        "feature draws the draw is the unit "
        "(p: one-sample t-test of the per-draw mean differences, n = draws; the record also has the sd between "
        "draws and within a draw), with one draw the seed (paired t-test). Test split; thresholds chosen on the "
        "validation split"
        + (
            f"; λ per objective chosen on validation from {', '.join(f'{x:g}' for x in plan.scales)} "
            "(PR-AUC + t→i R@1, draw 0, seed 0; learned temperatures not swept)."
            if plan.scales
            else "."
        ),
        "",
    ]
    for item in outcome["skipped"]:
        lines.append(f"- {item['regime']}/{item['family']}/{item['objective']}: **not available** — {item['reason']}")
    if outcome["skipped"]:
        lines.append("")
    present = {key for doc in outcome["runs"] for _, key in COLUMNS if key in doc["summary"]}
    for (regime, family), rows in tables.items():
        lines += [f"## {regime} regime, {family}", ""]
        lines.append("| objective | " + " | ".join(label for label, _ in COLUMNS) + " |")
        lines.append("|---|" + "---:|" * len(COLUMNS))
        for row in rows:
            label = row["objective"] + (f" (λ {row['scale']:g})" if row.get("scale") is not None else "")
            lines.append(f"| {label} | " + " | ".join(_cell(row[key]) for _, key in COLUMNS) + " |")
        lines.append("")
    lines.append(
        "–: no value; the recall and achieved precision at the threshold for precision 0.5 are missing where no "
        "threshold reaches precision 0.5 on the validation split."
    )
    missing = [label for label, key in COLUMNS if key not in present]
    if missing:
        lines.append(f"**Not available** in this checkout (no run's evaluation reports it): {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def plot_family(path: str, family: str, groups: dict) -> str:
    """PR-AUC against text->image R@1, one panel per regime: seeds as dots, the mean as a large marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r, f in groups if f == family]
    fig, axes = plt.subplots(1, max(1, len(regimes)), figsize=(5.5 * max(1, len(regimes)), 4.5), squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=False):
        for k, (name, docs) in enumerate(groups[(regime, family)].items()):
            x = 100 * np.asarray([d["summary"]["t2i_r1"] for d in docs])
            y = 100 * np.asarray([d["summary"]["pr_auc"] for d in docs])
            color = f"C{k % 10}"
            ax.scatter(x, y, s=14, color=color, alpha=0.5)
            ax.scatter([x.mean()], [y.mean()], s=90, color=color, edgecolor="black", label=name)
        ax.set_xlabel("text→image R@1 (%)")
        ax.set_ylabel("global PR-AUC (%)")
        ax.set_title(f"{family}, {regime} regime")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results_dir: str, outcome: dict, plan, minutes: float, machine: dict | None = None) -> list[str]:
    os.makedirs(results_dir, exist_ok=True)
    groups = _groups(outcome["runs"])
    tables = {key: table_rows(by_objective) for key, by_objective in groups.items()}
    record = {
        "plan": repr(plan),
        "minutes": minutes,
        "machine": machine or {},
        "skipped": outcome["skipped"],
        "tables": {f"{regime}/{family}": rows for (regime, family), rows in tables.items()},
        "runs": [
            {k: d[k] for k in ("regime", "family", "run_name", "summary", "curve", "seconds")}
            | {
                "seed": d["config"]["train"]["seed"],
                "feature_draw": d["config"]["train"].get("feature_draw", 0),
                "scale": d["config"]["train"].get("scale"),
                "learned": d["config"]["train"].get("learned"),
            }
            for d in outcome["runs"]
        ],
    }
    files = write_record(results_dir, "suite", record, markdown(outcome, tables, plan, minutes, machine), echo=False)
    for family in sorted({f for _, f in groups}):
        files.append(plot_family(os.path.join(results_dir, f"{family}.png"), family, groups))
    return files

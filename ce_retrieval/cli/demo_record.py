"""The main job's record: what ``ce-retrieval demo`` measured, on which machine, and where it sits among seeds.

Training is deterministic given the seed *on one machine*; another CPU (other instruction sets, hence other
oneDNN/Eigen kernels and summation orders) trains a slightly different model from the same seed, and those
differences grow over 500 steps. So the README states the demo's figures as a range over seeds
(``python -m benchmarks.quality.demo_seeds --package`` measures it and writes it to ``demo_range.json`` beside this
module), and every demo run writes ``<workdir>/record.json`` + ``record.md`` (date, machine, load, seed, the
headline figures) and prints where each figure sits in that range.

A headline figure per run: global PR-AUC, text→image R@1/5/10, image→text R@1, R@1 and R@100 with the distractors,
how many of the 19 precision levels (0.05 … 0.95) a threshold reaches on validation, and for precision 0.5 the
threshold chosen on validation with the precision and recall it achieves on test.
"""

from __future__ import annotations

import datetime
import json
import os
import platform

__all__ = ["FIGURES", "fmt", "headline", "load_range", "machine", "markdown", "position_lines", "write"]

RANGE_FILE = os.path.join(os.path.dirname(__file__), "demo_range.json")
# key -> (label, unit); "%" values are fractions in the reports and printed × 100
FIGURES = {
    "pr_auc": ("global PR-AUC", "%"),
    "t2i_r1": ("text->image R@1", "%"),
    "t2i_r5": ("text->image R@5", "%"),
    "t2i_r10": ("text->image R@10", "%"),
    "i2t_r1": ("image->text R@1", "%"),
    "dis_t2i_r1": ("text->image R@1 with distractors", "%"),
    "dis_t2i_r100": ("text->image R@100 with distractors", "%"),
    "levels_reached": ("precision levels reachable on val (of 19)", ""),
    "threshold_0.5": ("val threshold for precision 0.5", ""),
    "achieved_precision_0.5": ("  precision it achieves on test", "%"),
    "achieved_recall_0.5": ("  recall it achieves on test", "%"),
    "guaranteed_recall_0.5": ("recall at guaranteed precision 0.5 (0: refused)", "%"),
    "guaranteed_precision_0.5": ("  precision achieved there", "%"),
    "guaranteed_recall_0.8": ("recall at guaranteed precision 0.8 (0: refused)", "%"),
    "guaranteed_precision_0.8": ("  precision achieved there", "%"),
}
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def headline(report: dict) -> dict:
    """The headline figures of one evaluation report (``evaluate_model``'s dict or its ``eval_test.json``)."""
    s = report["summary"]
    out = {k: s.get(k) for k in FIGURES if k in s}
    levels = ((report.get("metrics") or {}).get("transfer") or {}).get("levels") or {}
    out["levels_reached"] = sum(v is not None for v in levels.values())
    thresholds = (report.get("calibration_split") or {}).get("threshold_at_precision") or {}
    out["threshold_0.5"] = thresholds.get("0.5")
    return {k: out.get(k) for k in FIGURES}


def machine() -> dict:
    """What makes a CPU run differ from another machine's: CPU model, instruction sets, cores, library versions."""
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), None)
        flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
        info["cpu"] = model or platform.processor()
        info["cpu_flags"] = [f for f in CPU_FLAGS if f in flags]
    except OSError:
        info["cpu"] = platform.processor()
    import numpy as np
    import tensorflow as tf

    info["tensorflow"], info["numpy"] = tf.__version__, np.__version__
    info["gpus"] = len(tf.config.list_physical_devices("GPU"))
    info["tf_intra_op_threads"] = intra_op_threads()
    return info


def intra_op_threads() -> str:
    """TensorFlow's intra-op thread setting (``TF_NUM_INTRAOP_THREADS``, or "default": one per core). Part of what
    "one machine" means: the thread count sets how kernels split their sums, and a 500-step training from scratch
    amplifies that last-bit difference into another model (benchmarks/results/demo_seeds_1thread.md)."""
    return os.environ.get("TF_NUM_INTRAOP_THREADS", "").strip() or "default"


def write(workdir: str, cfg, reports: dict, seconds: float) -> dict:
    """Writes ``record.json`` and ``record.md`` under ``workdir``, prints where the figures sit in the shipped range,
    and returns the record."""
    first = next(iter(reports.values()))
    record = {
        "kind": "ce_retrieval demo record",
        "schema_version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": first.get("git_commit"),
        "config": cfg.name,
        "seed": int(cfg.train.seed),
        "data_seed": int(cfg.data.seed),
        "steps": int(cfg.train.epochs) * int(cfg.train.steps_per_epoch or 0),
        "batch_size": int(cfg.train.batch_size),
        "loss": cfg.loss.name,
        "machine": machine(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(float(seconds), 1),
        "runs": {name: headline(r) for name, r in reports.items()},
    }
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "record.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(workdir, "record.md"), "w") as f:
        f.write(markdown(record))
    print(f"\n[demo] record: {os.path.join(workdir, 'record.json')} (+ record.md)")
    shipped = load_range()
    if shipped:
        print(
            f"[demo] where these figures sit among the seeds {shipped['seeds']} measured on "
            f"{shipped['machine'].get('cpu')} ({shipped['date'][:10]}; another CPU trains a slightly different model):"
        )
        theirs = shipped["machine"].get("tf_intra_op_threads", "default")
        ours = record["machine"]["tf_intra_op_threads"]
        if theirs != ours:
            print(
                f"[demo] note: this run's TensorFlow intra-op threads ({ours}) differ from the range's ({theirs}): "
                "that alone trains another model (TF_NUM_INTRAOP_THREADS)"
            )
        for key in ("config", "steps", "batch_size"):
            if key in shipped and shipped[key] != record[key]:
                print(
                    f"[demo] note: this run's {key} ({record[key]}) differs from the range's ({shipped[key]}): the "
                    "range describes another setting"
                )
        for line in position_lines(record, shipped):
            print("  " + line)
    return record


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.1f}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(record: dict) -> str:
    """A short Markdown version of the record: when, where, how loaded, and the figures side by side."""
    names = list(record["runs"])
    m = record["machine"]
    lines = [
        f"# ce-retrieval demo, seed {record['seed']} ({record['date']})",
        "",
        f"Config {record['config']}, {record['steps']} steps at batch {record['batch_size']}, data seed "
        f"{record['data_seed']}, commit {record['git_commit']}. Machine: {m.get('cpu')}, {m.get('cpu_count')} "
        f"cores, flags {' '.join(m.get('cpu_flags', []))}, TensorFlow {m.get('tensorflow')} (intra-op threads "
        f"{m.get('tf_intra_op_threads', 'default')}), {m.get('gpus')} GPU. "
        f"Load average (1, 5, 15 min) at the end: {record['load_average_1_5_15']}; {record['seconds']} s.",
        "",
        "| test split | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for key, (label, unit) in FIGURES.items():
        cells = [fmt(record["runs"][n].get(key), unit) for n in names]
        lines.append(f"| {label.strip()}{' (%)' if unit == '%' else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def load_range(path: str | None = None) -> dict | None:
    """The shipped range over seeds (``benchmarks/quality/demo_seeds.py --package``), or None when there is none."""
    path = path or RANGE_FILE
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def position_lines(record: dict, shipped: dict) -> list[str]:
    """One line per run and figure: the value, the range [min, max] over the shipped seeds, and inside/below/above."""
    lines = []
    for name, figures in record["runs"].items():
        ranges = shipped["runs"].get(name)
        if ranges is None:
            lines.append(f"{name}: no range shipped for this loss")
            continue
        for key, (label, unit) in FIGURES.items():
            lo, hi = ranges.get(key, (None, None))
            value = figures.get(key)
            if value is None or lo is None:
                where = "not comparable (no value)" if value is None or lo is not None else "no range"
            else:
                where = "inside" if lo <= value <= hi else ("BELOW" if value < lo else "ABOVE")
            lines.append(f"{name}: {label.strip()} {fmt(value, unit)} in [{fmt(lo, unit)}, {fmt(hi, unit)}]: {where}")
    return lines

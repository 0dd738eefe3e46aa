"""``ce-retrieval report a.json b.json ...``: evaluation JSONs side by side in the layout of the paper's Table 1.

Rows are runs (files sharing a ``run_name`` are seeds of one run: the cell shows mean ± sample standard
deviation over them); columns are PR AUC, text->image Recall@1/5/10 on the test set, Recall@1/5/10/100 with
distractors, and rsum (R@1/5/10 summed over both directions). Numbers are percentages, as in the paper. ``--markdown out.md`` writes the same table in
Markdown, ``--plot out.png`` the PR curves of all runs in one figure (paper Figure 4, left).
"""
from __future__ import annotations

import json
import sys

import numpy as np

__all__ = ["add_arguments", "format_table", "group_runs", "load_results", "run"]

_TEST = [("pr_auc", "PR AUC"), ("t2i_r1", "@1"), ("t2i_r5", "@5"), ("t2i_r10", "@10")]
_DIS = [("dis_t2i_r1", "@1"), ("dis_t2i_r5", "@5"), ("dis_t2i_r10", "@10"), ("dis_t2i_r100", "@100")]
_TAIL = [("rsum", "rsum")]


def load_results(paths) -> list[dict]:
    results = []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"report: cannot read {path}: {exc}") from exc
        if "summary" not in doc:
            raise SystemExit(f"report: {path} is not an evaluation JSON (no 'summary'); make it with `ce-retrieval evaluate`")
        doc.setdefault("run_name", path)
        doc["_path"] = str(path)
        results.append(doc)
    return results


def group_runs(results: list[dict]) -> dict[str, list[dict]]:
    """``{run_name: [results]}`` in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for doc in results:
        groups.setdefault(str(doc["run_name"]), []).append(doc)
    return groups


def _cell(values, scale: float) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    values = np.asarray(values, np.float64) * scale
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"


def _rows(groups):
    rows = []
    for name, docs in groups.items():
        cells = []
        for key, _ in _TEST + _DIS + _TAIL:
            cells.append(_cell([d["summary"].get(key) for d in docs], 100.0))
        rows.append((name, str(len(docs)), cells))
    return rows


def _distractor_title(results) -> str:
    counts = sorted({int(d.get("num_distractors") or 0) for d in results})
    if counts == [0]:
        return "with distractors (none)"
    return "+" + "/".join(f"{c:,}" for c in counts) + " distractors"


def format_table(results: list[dict]) -> str:
    """The plain-text table (two header lines like the paper's Table 1)."""
    rows = _rows(group_runs(results))
    headers = ["Run", "n"] + [h for _, h in _TEST + _DIS + _TAIL]
    widths = [max(len(headers[i]), *(len(r[0]) if i == 0 else len(r[1]) if i == 1 else len(r[2][i - 2]) for r in rows))
              for i in range(len(headers))]
    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    test_span = sum(widths[3:6]) + 4
    dis_span = sum(widths[6:10]) + 6
    top = " " * (sum(widths[:3]) + 6) + "Recall on test set".center(test_span) + "  " + _distractor_title(results).center(dis_span)
    out = [top.rstrip(), line(headers), "-" * len(line(headers))]
    out += [line([name, n, *cells]) for name, n, cells in rows]
    notes = []
    if len({d.get("dataset_fingerprint") for d in results}) > 1:
        notes.append("note: the files were evaluated on different datasets (dataset_fingerprint differs)")
    if any(len(docs) > 1 for docs in group_runs(results).values()):
        notes.append("cells: mean ± sample standard deviation over the n files of a run")
    notes.append("numbers in %; recall is text->image; rsum = sum of R@1/5/10 in both directions")
    return "\n".join(out + notes)


def format_markdown(results: list[dict]) -> str:
    rows = _rows(group_runs(results))
    dis = _distractor_title(results)
    headers = ["Run", "n", "PR AUC", "R@1", "R@5", "R@10"] + [f"R{h} dis." for _, h in _DIS] + ["rsum"]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    out += ["| " + " | ".join([name, n, *cells]) + " |" for name, n, cells in rows]
    notes = (f"Numbers in %; recall is text->image; \"dis.\": {dis}; rsum = R@1/5/10 summed over both directions; "
             "mean ± sample std over the n evaluation files of a run.")
    return "\n".join(out) + "\n\n" + notes + "\n"


def plot_report(results: list[dict], path: str) -> str:
    from ce_retrieval.evaluation.plots import plot_pr_curves

    curves = {}
    for name, docs in group_runs(results).items():
        runs = []
        for d in docs:
            cal = d.get("metrics", {}).get("calibration") or {}
            if cal.get("curve"):
                runs.append({"recall": cal["curve"]["recall"], "precision": cal["curve"]["precision"], "pr_auc": cal.get("pr_auc")})
        if runs:
            curves[name] = runs
    if not curves:
        raise SystemExit("report: no PR curves in the given files")
    return plot_pr_curves(curves, path)


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", help="eval_<split>.json files written by `ce-retrieval evaluate`")
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--plot", default=None, help="also write the PR curves of all runs to this PNG")


def run(args) -> int:
    results = load_results(args.files)
    print(format_table(results))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_markdown(results))
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        plot_report(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0

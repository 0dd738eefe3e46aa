"""``ce-retrieval report a.json b.json ... [--markdown M] [--plot P] [--reliability R] [--probability Q]``:
evaluation JSONs side by side in the layout of the paper's Table 1 (the table, its columns and the plots are
:mod:`ce_retrieval.evaluation.report`'s), then the probability maps' calibration error per run
(:mod:`ce_retrieval.evaluation.probability_report`)."""

from __future__ import annotations

import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", help="eval_<split>.json files written by `ce-retrieval evaluate`")
    parser.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--plot", default=None, help="also write the PR curves of all runs to this PNG")
    parser.add_argument(
        "--reliability",
        default=None,
        help="also write promised vs achieved precision of all runs (calibration transfer) to this PNG",
    )
    parser.add_argument(
        "--probability",
        default=None,
        help="also write the reliability diagrams of all runs' P(relevant | score) maps to this PNG",
    )


def run(args) -> int:
    from ce_retrieval.evaluation.probability_report import format_probability, plot_probability_report
    from ce_retrieval.evaluation.report import (
        format_markdown,
        format_table,
        load_results,
        plot_reliability_report,
        plot_report,
    )

    results = load_results(args.files)
    print(format_table(results))
    probability = format_probability(results)
    if probability:
        print("\n" + probability)
    if args.markdown:
        from ce_retrieval.utils.atomic import atomic_write_text

        atomic_write_text(args.markdown, format_markdown(results))
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        plot_report(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.reliability:
        plot_reliability_report(results, args.reliability)
        print(f"wrote {args.reliability}", file=sys.stderr)
    if args.probability:
        plot_probability_report(results, args.probability)
        print(f"wrote {args.probability}", file=sys.stderr)
    return 0

"""``ce-retrieval query --export_dir E --text "..." [--k K | --threshold T | --precision P | --min_probability M]
[--exact] [--estimate]``: text -> image search over the newest servable export version
(:class:`ce_retrieval.serve.searcher.Searcher`), printed hit by hit."""

from __future__ import annotations

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--text", action="append", required=True, help="a caption to search with (repeatable)")
    parser.add_argument("--version", type=int, default=None, help="export version (default: newest servable)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--k", type=int, default=None, help="top-k search (default 5)")
    mode.add_argument("--threshold", type=float, default=None, help="every image with score >= this cosine score")
    mode.add_argument(
        "--precision",
        type=float,
        default=None,
        help="every image above the threshold guaranteed for this precision (with the index's confidence)",
    )
    mode.add_argument(
        "--min_probability", type=float, default=None, help="every image whose P(relevant | score) >= this"
    )
    parser.add_argument("--limit", type=int, default=100, help="at most this many threshold hits per text")
    parser.add_argument("--exact", action="store_true", help="exact threshold search (default: the index's)")
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="with --precision: the point estimate's threshold instead of the guaranteed one (no confidence)",
    )


def _promise(searcher, args) -> str:
    if args.estimate:
        return f" (estimated for precision {args.precision:g}, no confidence)"
    return f" (guaranteed for precision {args.precision:g} with confidence {searcher.guarantee['confidence']:g})"


def run(args) -> int:
    from ce_retrieval.serve.searcher import PromiseRefused, Searcher

    searcher = Searcher.load(args.export_dir, args.version)
    threshold_modes = (args.threshold, args.precision, args.min_probability)
    k = args.k if args.k is not None or any(m is not None for m in threshold_modes) else 5
    guarantee = not args.estimate
    if args.precision is not None:
        try:
            tau = searcher.threshold_for_precision(args.precision, guarantee)
        except PromiseRefused as exc:
            print(f"error: {exc}")
            return 2
    results = searcher.search(
        args.text,
        k,
        threshold=args.threshold,
        precision=args.precision,
        min_probability=args.min_probability,
        limit=args.limit,
        exact=args.exact,
        guarantee=guarantee,
    )
    if args.precision is None:
        tau = args.threshold
    if args.min_probability is not None:
        tau = searcher.threshold_for_probability(args.min_probability)
    print(
        f"export version {searcher.version}, {len(searcher.index)} gallery items"
        + (f", threshold {tau:.4f}" if tau is not None else "")
        + (_promise(searcher, args) if args.precision is not None else "")
    )
    for text, res in zip(args.text, results, strict=True):
        print(f"{text!r}: {len(res.ids)} hit(s){' (truncated)' if res.truncated else ''}")
        probs = res.probabilities or [None] * len(res.ids)
        for rank, (i, s, p, pr) in enumerate(zip(res.ids, res.scores, res.precision_levels, probs, strict=True), 1):
            level = f"  precision>={p:g}" if p is not None else ""
            chance = f"  P(relevant) {pr:.3f}" if pr is not None else ""
            print(f"  {rank:>3}. id {int(i):>10}  score {float(s):.4f}{level}{chance}")
    return 0

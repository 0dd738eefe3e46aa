"""``ce-retrieval losses``: train the small demo embedding (``losses/demo.py``) with each chosen loss and print
recall@1 before and after, so a loss can be sanity-checked in seconds on CPU.

    ce-retrieval losses --loss SampledSoftmax CrossExampleSoftmax --steps 200 --seed 0
"""
from __future__ import annotations

import argparse

PAPER_LOSSES = ["SampledSoftmax", "StochasticNegativeMining", "CrossExampleSoftmax", "CrossExampleNegativeMining"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loss", nargs="+", default=PAPER_LOSSES, metavar="NAME",
        help="loss class names (see --list); default: the paper's four",
    )
    parser.add_argument("--steps", type=int, default=150, help="training steps (batches)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--list", action="store_true", help="list the available losses and exit")


def run(args) -> int:
    from ce_retrieval import losses
    from ce_retrieval.losses.demo import DemoConfig, train_and_evaluate

    if args.list:
        print("\n".join(losses.available()))
        return 0
    unknown = [name for name in args.loss if name not in losses.available()]
    if unknown:
        print(f"unknown loss(es) {', '.join(unknown)}; available: {', '.join(losses.available())}")
        return 2
    if args.steps < 1 or args.batch_size < 2:
        print("--steps must be >= 1 and --batch-size >= 2")
        return 2
    config = DemoConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size)
    print("| loss | recall@1 before | recall@1 after | final loss |")
    print("|---|---:|---:|---:|")
    for name in args.loss:
        result = train_and_evaluate(name, config)
        print(
            f"| {name} | {result['recall_at_1_before']:.3f} | {result['recall_at_1_after']:.3f} "
            f"| {result['final_loss']:.4f} |",
            flush=True,
        )
    return 0

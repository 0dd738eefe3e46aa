"""Same-process A/B benchmarks: the alternating order of their runs and the experiment config they measure.

Runs alternate A B B A A B ... so that a drift of the machine's speed during the run (another tenant, thermal state)
falls on both kinds alike; each benchmark reports medians per kind.
"""

from __future__ import annotations


def abba(kinds: tuple[str, str], repeats: int) -> list[str]:
    """``repeats`` runs of each of the two kinds, in the order A B B A A B B A ..."""
    if len(kinds) != 2 or repeats < 1:
        raise ValueError(f"abba needs two kinds and repeats >= 1, got {kinds!r} and {repeats}")
    return [kinds[(i // 2 + i) % 2] for i in range(2 * repeats)]


def add_config_arguments(parser) -> None:
    """``--config`` (a shipped config's name or a path) and ``--params_override`` (e.g. the tests' tiny model)."""
    parser.add_argument("--config", default="synthetic_demo")
    parser.add_argument("--params_override", default="", help="e.g. the tests' tiny model, for a smoke run")


def load_config(args):
    """The ``ExperimentConfig`` of ``--config`` with ``--params_override``, and a label for the record."""
    from ce_retrieval import configs
    from ce_retrieval.cli.train import resolve_config

    overrides = [args.params_override] if args.params_override else []
    label = args.config + (f" with {args.params_override}" if args.params_override else "")
    return configs.load_experiment(resolve_config(args.config), overrides), label

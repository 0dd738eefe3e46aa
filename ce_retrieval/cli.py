"""The ``ce-retrieval`` command line: a thin dispatcher. Each subcommand lives with its subsystem and exposes
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when their command runs."""
from __future__ import annotations

import argparse
import importlib
import sys

import ce_retrieval  # noqa: F401  (selects legacy Keras before TensorFlow loads)

COMMANDS = {
    "demo": ("ce_retrieval.demo", "the main job on the synthetic dataset: train, evaluate, export, index, query"),
    "train": ("ce_retrieval.training.cli", "train a two-tower model from a config"),
    "evaluate": ("ce_retrieval.evaluation.cli", "Recall@K and global PR-AUC of a trained model on a split"),
    "report": ("ce_retrieval.evaluation.report", "side-by-side table (paper Table 1 layout) of evaluation JSONs"),
    "export": ("ce_retrieval.serving.export", "export text and image encoders as TF Serving SavedModels"),
    "index": ("ce_retrieval.serving.index", "build a ScaNN index of a gallery next to an export"),
    "query": ("ce_retrieval.serving.searcher", "search an exported index with captions"),
    "serve": ("ce_retrieval.serving.service", "HTTP JSON retrieval service over an export"),
    "losses": ("ce_retrieval.losses.cli", "train a small embedding on generated data with a chosen loss"),
    "dml-compare": (
        "ce_retrieval.training.dml_comparison",
        "train small embeddings with several metric-learning losses and compare labelled retrieval metrics",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ce-retrieval", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"ce_retrieval {ce_retrieval.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            parser.error(f"command {name!r} is not available in this build ({module_name} is missing)")
        raise
    sub = argparse.ArgumentParser(prog=f"ce-retrieval {name}", description=help_text)
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

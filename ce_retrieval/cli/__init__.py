"""The ce-retrieval command line: one module per command, each only parsing arguments and printing results.

Each command module (``train``, ``evaluate``, ``report``, ``export``, ``index``, ``calibrate``, ``query``, ``serve``,
``demo``, ``embed-gallery`` in ``embed_gallery``, ``serve-shard`` in ``serve_shard``)
exposes ``add_arguments(parser)`` and ``run(args) -> int`` and holds only argument parsing, wiring and printing;
the work is done by the library functions it calls. Modules are imported only when their command runs.
``python -m ce_retrieval.cli`` and the ``ce-retrieval`` console script both call :func:`main`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# The command owns its process: it selects Keras 2 for tf.keras before TensorFlow loads, which keras-cv (the image
# tower's backbone) needs. The library itself never sets it (ce_retrieval/__init__.py).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ce_retrieval  # noqa: E402

__all__ = ["COMMANDS", "DEFAULT_SEED", "SEEDED_COMMANDS", "build_parser", "main"]

COMMANDS = {
    "demo": ("ce_retrieval.cli.demo", "the main job on the synthetic dataset: train, evaluate, export, index, query"),
    "train": ("ce_retrieval.cli.train", "train a two-tower model from a config"),
    "evaluate": ("ce_retrieval.cli.evaluate", "Recall@K and global PR-AUC of a trained model on a split"),
    "report": ("ce_retrieval.cli.report", "side-by-side table (paper Table 1 layout) of evaluation JSONs"),
    "export": ("ce_retrieval.cli.export", "export text and image encoders as TF Serving SavedModels"),
    "index": ("ce_retrieval.cli.index", "build a ScaNN index of a gallery next to an export"),
    "calibrate": (
        "ce_retrieval.cli.calibrate",
        "recalibrate an index's guaranteed thresholds on labelled captions of a new domain (a new version)",
    ),
    "query": ("ce_retrieval.cli.query", "search an exported index with captions"),
    "serve": ("ce_retrieval.cli.serve", "HTTP JSON retrieval service over an export (or a router over shard servers)"),
    "embed-gallery": (
        "ce_retrieval.cli.embed_gallery",
        "embed a gallery with the exported image encoder on Apache Beam, into checksummed shards",
    ),
    "serve-shard": ("ce_retrieval.cli.serve_shard", "serve one shard of a sharded index to a router (`serve`)"),
}
# Commands that rebuild a trained model (its layers, then its weights) seed here, from DEFAULT_SEED, before they
# build a layer. ``train`` and ``demo`` are seeded by ``training.train`` from their config (``train.seed``,
# ``train.deterministic``), after its distribution strategy, which must split the CPU before TensorFlow starts; the
# other commands load SavedModels or indexes and build no layer.
SEEDED_COMMANDS = ("evaluate", "export")
DEFAULT_SEED = 0


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
    from ce_retrieval.utils.cuda_probe import probe_devices_quietly

    probe_devices_quietly()  # CPU-only machines: drop TensorFlow's cuInit failure line, and only that line
    if name in SEEDED_COMMANDS:
        from ce_retrieval.utils.seeding import seed_everything

        seed_everything(DEFAULT_SEED, deterministic=False)  # no promise of bit-identical results to keep
    return int(module.run(args) or 0)

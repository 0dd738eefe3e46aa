"""``ce-retrieval export --model_dir D --export_dir E [--version V] [--no_verify]``: both towers of a trained
model as TF Serving SavedModels with the model's (learned) scoring parameters
(:func:`ce_retrieval.build.export.export_model`, which ``ce-retrieval demo`` uses too)."""

from __future__ import annotations

import dataclasses
import os

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--model_dir", required=True, help="a trained model directory (see ce_retrieval.training)")
    parser.add_argument("--export_dir", required=True, help="where <tower>/<version>/ SavedModels are written")
    parser.add_argument("--version", type=int, default=None, help="version number (default: one more than the newest)")
    parser.add_argument("--no_verify", action="store_true", help="skip reloading the SavedModels before publishing")


def run(args) -> int:
    from ce_retrieval.build.export import export_model
    from ce_retrieval.training import load_trained  # lazy: the training stack is only needed here

    cfg, model = load_trained(args.model_dir)
    config = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}
    paths = export_model(
        model,
        args.export_dir,
        args.version,
        metadata={"model_dir": os.path.abspath(args.model_dir), "config": config},
        verify=not args.no_verify,
    )
    print(f"exported version {paths.version}:\n  {paths.text_encoder}\n  {paths.image_encoder}")
    if paths.metadata["custom_ops"]:
        print("  custom ops a TF Serving build must link: " + ", ".join(paths.metadata["custom_ops"]))
    return 0

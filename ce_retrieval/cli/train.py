"""``ce-retrieval train --config configs/synthetic_demo.yaml --model_dir runs/demo [--params_override ...]``.

Running the same command again on the same ``model_dir`` resumes an interrupted run (BackupAndRestore). The
training itself is :func:`ce_retrieval.training.train`; :func:`resolve_config` maps a built-in config name
(a file in the project's ``configs/`` folder) to its path and is shared with the ``demo`` command."""

from __future__ import annotations

import os

from ce_retrieval import configs

__all__ = ["CONFIG_DIR", "add_arguments", "resolve_config", "run"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def resolve_config(name_or_path: str) -> str:
    """A YAML path as given, or the name of a file in the project's ``configs/`` folder (``synthetic_demo``)."""
    if os.path.exists(name_or_path):
        return name_or_path
    for candidate in (name_or_path, f"{name_or_path}.yaml"):
        path = os.path.join(CONFIG_DIR, candidate)
        if os.path.exists(path):
            return path
    available = (
        sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml")) if os.path.isdir(CONFIG_DIR) else []
    )
    raise FileNotFoundError(f"config {name_or_path!r} not found (built-in configs: {', '.join(available)})")


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="synthetic_demo", help="YAML file or built-in config name")
    parser.add_argument("--model_dir", required=True, help="where checkpoints, logs and the resolved config go")
    parser.add_argument(
        "--params_override",
        action="append",
        default=[],
        help="'a.b=1,c.d=x' or a YAML mapping; may be repeated (applied in order)",
    )


def run(args) -> int:
    from ce_retrieval.training import train

    cfg = configs.load_experiment(resolve_config(args.config), args.params_override)
    summary = train(cfg, args.model_dir)
    print(
        f"[train] done: {summary['steps']} steps in {summary['seconds']:.1f} s; "
        f"model_dir {os.path.abspath(args.model_dir)}"
    )
    return 0

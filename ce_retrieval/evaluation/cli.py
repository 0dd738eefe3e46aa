"""``ce-retrieval evaluate --model_dir D --split test [--distractors N] [--output_dir O]``.

Loads a trained model (``ce_retrieval.training.load_trained``), the split (``ce_retrieval.data.
load_retrieval_split``) and, with ``--distractors N``, N synthetic distractor images
(``ce_retrieval.data.synthetic.distractor_images``), then runs :func:`evaluate_model`: ``eval_<split>.json``
and the plots go to ``--output_dir`` (default ``<model_dir>/eval``). Those loaders live in other subsystems
and are imported only when the command runs.
"""
from __future__ import annotations

import dataclasses
import os

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--model_dir", required=True, help="a training model_dir (config.yaml, checkpoints/)")
    parser.add_argument("--split", default="test", help="dataset split to evaluate (default: test)")
    parser.add_argument("--distractors", type=int, default=0, help="number of distractor images added to the gallery")
    parser.add_argument("--output_dir", default=None, help="where eval_<split>.json and the plots go (default: <model_dir>/eval)")
    parser.add_argument("--run_name", default=None, help="groups seeds in `ce-retrieval report` (default: the model_dir name)")
    parser.add_argument("--batch_size", type=int, default=256, help="embedding batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic distractor images")
    parser.add_argument("--no_plots", action="store_true", help="write the JSON only")
    parser.add_argument("--ann", action="store_true", help="also report the Recall@K lost by a ScaNN index of the images")


def _config_dict(cfg):
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    if hasattr(cfg, "as_dict"):
        return cfg.as_dict()
    return cfg if isinstance(cfg, dict) else repr(cfg)


def _scann_factory():
    from ce_retrieval.evaluation.ann import ScannSearch

    return ScannSearch


def run(args) -> int:
    from ce_retrieval.data import load_retrieval_split
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.training import load_trained

    if args.distractors < 0:
        raise SystemExit(f"--distractors must be >= 0, got {args.distractors}")
    cfg, model = load_trained(args.model_dir)
    split = load_retrieval_split(cfg.data, args.split)
    distractors = None
    if args.distractors:
        from ce_retrieval.data.synthetic import distractor_images

        image_size = getattr(cfg.data, "image_size", None)
        kwargs = {} if image_size is None else {"image_size": image_size}
        distractors = distractor_images(args.distractors, seed=args.seed, **kwargs)
    output_dir = args.output_dir or os.path.join(args.model_dir, "eval")
    run_name = args.run_name or os.path.basename(os.path.normpath(args.model_dir))
    result = evaluate_model(
        model.text_encoder,
        model.image_encoder,
        split,
        distractor_images=distractors,
        output_dir=output_dir,
        run_name=run_name,
        config=_config_dict(cfg),
        batch_size=args.batch_size,
        plots=not args.no_plots,
        ann_factory=_scann_factory() if args.ann else None,
    )
    s = result["summary"]
    print(
        f"{run_name} [{split.name}]: PR-AUC {100 * s['pr_auc']:.2f}  AP {100 * s['average_precision']:.2f}  "
        f"R@1/5/10 {100 * s['t2i_r1']:.2f}/{100 * s['t2i_r5']:.2f}/{100 * s['t2i_r10']:.2f}  rsum {100 * s['rsum']:.1f}"
    )
    print(f"wrote {result['files'].get('json')}")
    return 0

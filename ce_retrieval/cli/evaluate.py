"""``ce-retrieval evaluate --model_dir D --split test [--distractors N] [--output_dir O]``.

Loads a trained model (``ce_retrieval.training.load_trained``), the split (``ce_retrieval.data.
load_retrieval_split``) and, with ``--distractors N``, N synthetic distractor images
(``ce_retrieval.data.synthetic.distractor_images``), then runs
:func:`ce_retrieval.evaluation.evaluate.evaluate_model`: ``eval_<split>.json``
and the plots go to ``--output_dir`` (default ``<model_dir>/eval``). Those loaders live in other subsystems
and are imported only when the command runs.

``--calibration_split S`` calibrates thresholds for the precisions 0.05 ... 0.95 on split S and reports the
precision they achieve on ``--split`` (``metrics.transfer``, ``reliability_<split>.png``). The default is ``val``
when another split is evaluated (skipped with a warning if the dataset has no such split); ``none`` turns it off.
"""

from __future__ import annotations

import os
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--model_dir", required=True, help="a training model_dir (config.yaml, checkpoints/)")
    parser.add_argument("--split", default="test", help="dataset split to evaluate (default: test)")
    parser.add_argument("--distractors", type=int, default=0, help="number of distractor images added to the gallery")
    parser.add_argument(
        "--output_dir", default=None, help="where eval_<split>.json and the plots go (default: <model_dir>/eval)"
    )
    parser.add_argument(
        "--run_name", default=None, help="groups seeds in `ce-retrieval report` (default: the model_dir name)"
    )
    parser.add_argument("--batch_size", type=int, default=256, help="embedding batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic distractor images")
    parser.add_argument("--no_plots", action="store_true", help="write the JSON only")
    parser.add_argument(
        "--ann", action="store_true", help="also report the Recall@K lost by a ScaNN index of the images"
    )
    parser.add_argument(
        "--calibration_split",
        default=None,
        help="split whose calibrated thresholds are checked on --split (default: val unless --split is val; "
        "'none' turns it off)",
    )


def _scann_factory():
    from ce_retrieval.search.ann import ScannSearch

    return ScannSearch


def _calibration_split(args, cfg, load_retrieval_split):
    """The calibration split asked for (None when off); the implicit default ``val`` is skipped if missing."""
    name = args.calibration_split
    if name is not None and name.lower() == "none":
        return None
    if name is not None:
        return load_retrieval_split(cfg.data, name)
    if args.split == "val":
        return None
    try:
        return load_retrieval_split(cfg.data, "val")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"warning: no calibration on 'val' ({exc}); pass --calibration_split to choose a split", file=sys.stderr)
        return None


def run(args) -> int:
    from ce_retrieval.configs import to_dict
    from ce_retrieval.data import load_retrieval_split
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.training import load_trained

    if args.distractors < 0:
        raise SystemExit(f"--distractors must be >= 0, got {args.distractors}")
    cfg, model = load_trained(args.model_dir)
    split = load_retrieval_split(cfg.data, args.split)
    calibration_split = _calibration_split(args, cfg, load_retrieval_split)
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
        config=to_dict(cfg),
        batch_size=args.batch_size,
        plots=not args.no_plots,
        ann_factory=_scann_factory() if args.ann else None,
        calibration_split=calibration_split,
    )
    s = result["summary"]
    print(
        f"{run_name} [{split.name}]: PR-AUC {100 * s['pr_auc']:.2f}  AP {100 * s['average_precision']:.2f}  "
        f"R@1/5/10 {100 * s['t2i_r1']:.2f}/{100 * s['t2i_r5']:.2f}/{100 * s['t2i_r10']:.2f}  rsum {100 * s['rsum']:.1f}"
    )
    if calibration_split is not None:
        achieved = "/".join(
            "-" if s.get(f"achieved_precision_{c}") is None else f"{100 * s[f'achieved_precision_{c}']:.1f}"
            for c in ("0.5", "0.8", "0.9")
        )
        error = s.get("mean_calibration_error")
        print(
            f"  thresholds calibrated on {calibration_split.name}: precision promised 50/80/90 -> achieved {achieved}  "
            f"mean |error| {'-' if error is None else f'{100 * error:.2f}'} points"
        )
    print(f"wrote {result['files'].get('json')}")
    return 0

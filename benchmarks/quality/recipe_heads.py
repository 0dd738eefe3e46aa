"""Recipe candidates in the calibration suite's heads regime (frozen features + trained heads), paired with SS and
CE over seeds on every family (issue 21, part 3).

    nice python -m benchmarks.quality.recipe_heads --cache runs/suite_cache --out runs/recipe_heads \
        --recipe 'Mix0.5={"loss": "MixedSoftmax", "kwargs": {"cross_weight": 0.5}}' --seeds 3

Runs :func:`benchmarks.calibration_suite.run_plan` (heads regime only) once per recipe, each in its own
``<out>/<label>`` with the families and features linked from ``--cache`` (a suite ``--out`` folder: feature
pretraining is not repeated when its key matches). ``--image_epochs/--caption_epochs`` give the feature
pretraining those passes (13 and 3 match the suite branch's cache). SS and CE are trained in the first recipe's
folder only. Prints per family and seed PR-AUC and t→i R@1; ``benchmarks/quality/recipe_report.py`` writes the record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def main(argv=None) -> int:
    from benchmarks.quality import calibration_suite as cs
    from benchmarks.quality import suite_objectives as so
    from benchmarks.quality.family_features import PretrainConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", required=True)
    p.add_argument("--out", default="runs/recipe_heads")
    p.add_argument("--recipe", action="append", default=[], help='label={"loss": ..., "kwargs": {...}}')
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--families", nargs="*", default=list(cs.FAMILIES))
    p.add_argument("--image_epochs", type=int, default=13)
    p.add_argument("--caption_epochs", type=int, default=3)
    p.add_argument("--scale", type=float, default=None, help="λ of the recipes (default 20; SS, CE keep 20)")
    p.add_argument("--baselines", action="store_true", help="also train SS and CE in every recipe's folder")
    p.add_argument("--no_baselines", action="store_true", help="train no SS and CE (another invocation did)")
    args = p.parse_args(argv)
    if args.scale is not None:
        _recipe_scale(so, args.scale)
    pretrain = PretrainConfig(image_epochs=args.image_epochs, caption_epochs=args.caption_epochs)
    for k, spec in enumerate(args.recipe):
        label, text = spec.split("=", 1)
        folder = os.path.join(args.out, label)
        os.makedirs(folder, exist_ok=True)
        for sub in ("families", "features"):
            link = os.path.join(folder, sub)
            if not os.path.exists(link):
                os.symlink(os.path.abspath(os.path.join(args.cache, sub)), link)
        plan = dataclasses.replace(
            cs.DEFAULT,
            families=tuple(args.families),
            regimes=("heads",),
            seeds=args.seeds,
            pretrain=pretrain,
            heads_objectives=("SS", "CE") if (k == 0 and not args.no_baselines) or args.baselines else (),
        )
        result = cs.run_plan(plan, folder, recipe=so.recipe_objective(json.loads(text)))
        for doc in result["runs"]:
            s = doc["summary"]
            print(
                f"{label} {doc['family']} {doc['run_name']} seed {doc['config']['train']['seed']}: "
                f"PR-AUC {100 * s['pr_auc']:.2f} t2i R@1 {100 * s['t2i_r1']:.2f}",
                flush=True,
            )
    return 0


def _recipe_scale(so, scale: float) -> None:
    """The heads regime builds every objective with λ = ``so.SCALE``; give the recipe slot λ = ``scale`` (its
    objective is built by ``recipe_objective``, the named objectives keep theirs)."""
    named = [id(o) for o in so.OBJECTIVES.values()]  # by identity: a recipe may equal a named objective
    heads_loss = so.heads_loss

    def scaled(objective, scale_=so.SCALE):
        return heads_loss(objective, scale_ if id(objective) in named else scale)

    so.heads_loss = scaled


if __name__ == "__main__":
    raise SystemExit(main())

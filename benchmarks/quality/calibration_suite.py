"""The calibration suite (#21): every objective a user would weigh, on dataset families that differ in kind, in
two regimes, over paired seeds.

Families (``benchmarks.quality.families.families``, written to disk in a real format and read by the real loaders): the
shapes (TFRecords), vague captions (Karpathy JSON: captions that fit many images) and digit scenes (Karpathy
JSON: scikit-learn's handwritten digits, two per scene). Objectives: ``suite_objectives.OBJECTIVES`` (SS, SNM,
CE, CENM, CLIP, SigLIP, SS+TCM, CE+TCM, and the ``recipe`` slot); one not yet in the project is skipped with a
"not available" line. Regimes:

* ``heads`` — the converged regime of ``paper_tables.py``: the demo towers pretrained on the family's attributes
  and frozen (``family_features.py``), projection heads trained with the objective (``heads.py``), batch 512;
* ``scratch`` — the demo budget through the real training job (``ce_retrieval.training.train`` with the demo
  config, only ``data`` replaced by the family's loader config and ``loss`` by the objective), 5 x 100 steps at
  batch 64, the best-validation checkpoint (``load_trained``), as ``ce-retrieval demo`` does.

Runs with the same seed share initial weights and batch order, so every objective's difference to SS is paired.
Each run is evaluated on test with thresholds calibrated on val (``heads.evaluate_arrays``: PR-AUC, R@1 both
ways, recall and achieved precision at the threshold chosen for precision 0.5, calibration error, OPIS).

Outputs: ``--out`` (default ``runs/calibration_suite``) holds the families, features, one JSON per run and the
test embeddings (for ``--analyse``); ``--results`` (default ``benchmarks/results/calibration_suite``) gets
``suite.json``, ``suite.md`` (a table per regime and family: mean ± sd over seeds, paired difference to SS and
its p-value) and ``<family>.png``; with ``--analyse`` also ``analysis.md`` / ``analysis.json`` / ``analysis_*.png``
(``calibration_analysis.py``: why CE loses text->image R@1 where it does).

    python -m benchmarks.quality.calibration_suite                       # default plan: 14.3 min, 2 idle cores (<= 45)
    python -m benchmarks.quality.calibration_suite --plan full           # both regimes on every family (~27 min)
    python -m benchmarks.quality.calibration_suite --regimes heads       # the converged regime only (cheap)
    python -m benchmarks.quality.calibration_suite --quick --out /tmp/cs --results /tmp/cs/results   # smoke (< 1 min)
    python -m benchmarks.quality.calibration_suite --analyse             # part 3's evidence from the runs on disk
    python -m benchmarks.quality.calibration_suite --promise_distractors 50000   # + what guarantee_coverage.py reads
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
from benchmarks.common.machine import LoadSampler, machine_info  # noqa: E402
from benchmarks.quality import suite_objectives as so  # noqa: E402
from benchmarks.quality.families.families import FAMILIES, FamilySize  # noqa: E402
from benchmarks.quality.family_features import PretrainConfig  # noqa: E402

REGIMES = ("heads", "scratch")
# Costs on 2 idle cores for the plan's estimate, from the default plan's record (benchmarks/results/
# calibration_suite_default: 14.3 min; a family with its tower pretraining ~60 s, a heads run of 400 steps ~4.3 s
# with its evaluations, a scratch run of 500 steps ~55 s). Check them against the seconds each run records.
EST_SECONDS = {"family": 5.0, "features": 55.0, "heads_per_step": 0.008, "scratch_per_step": 0.1, "eval": 1.0}


@dataclasses.dataclass(frozen=True)
class Plan:
    families: tuple = FAMILIES
    size: FamilySize = FamilySize()
    seeds: int = 3
    regimes: tuple = REGIMES
    heads_objectives: tuple = tuple(so.OBJECTIVES)
    heads_steps: int = 600
    heads_batch: int = 512
    heads_eval_every: int = 100
    jit_compile: bool = True
    pretrain: PretrainConfig = PretrainConfig()
    scratch_objectives: tuple = ("SS", "CE")
    scratch_families: tuple | None = None  # None: every family of the plan
    scratch_epochs: int = 5
    scratch_steps_per_epoch: int = 100
    scratch_batch: int = 64
    scratch_overrides: tuple = ()  # extra "a.b=v" overrides of the demo config (the quick plan's tiny model)
    scratch_seeds: int | None = None  # seeds of the scratch regime (None: ``seeds``; the quick plan's smoke: 1)
    # Independent draws of the frozen features (tower pretraining seeds 0..D-1): the heads regime's unit of variance
    feature_draws: int = 1
    # λ candidates: each objective with a fixed λ is trained at the one its validation figures (PR-AUC + t->i R@1,
    # draw 0, seed 0) prefer; () keeps suite_objectives.SCALE. Learned temperatures (SigLIP) are not swept.
    scales: tuple = ()

    def estimate_minutes(self) -> float:
        e = EST_SECONDS
        per_family = e["family"]
        if "heads" in self.regimes:
            per_family += e["features"] + self.seeds * len(self.heads_objectives) * (
                self.heads_steps * e["heads_per_step"] + e["eval"]
            )
        minutes = len(self.families) * per_family / 60
        if "scratch" in self.regimes:
            steps = self.scratch_epochs * self.scratch_steps_per_epoch
            per_run = steps * e["scratch_per_step"] + (self.scratch_epochs + 1) * e["eval"]
            minutes += len(self.scratch_on()) * self.seeds_of("scratch") * len(self.scratch_objectives) * per_run / 60
        return minutes

    def seeds_of(self, regime: str) -> int:
        return self.scratch_seeds if regime == "scratch" and self.scratch_seeds is not None else self.seeds

    def scratch_on(self) -> tuple:
        return tuple(f for f in self.families if self.scratch_families is None or f in self.scratch_families)


# The default plan fits the 45-minute budget (measured: 14.3 min on 2 idle cores): every objective in the converged
# regime on every family, and the demo-budget regime for SS and CE on the digits (the family where #21 saw CE lose
# text->image R@1). FULL adds the demo-budget regime on every family and 600 heads steps (about 27 min).
DEFAULT = Plan(heads_steps=400, scratch_families=("digits",))
FULL = Plan()


QUICK = Plan(
    families=("digits",),
    size=FamilySize(num_train=24, num_val=8, num_test=8, captions_per_image=2, image_size=32),
    seeds=2,
    heads_objectives=("SS", "CE", "SigLIP", "CE+TCM"),
    heads_steps=6,
    heads_batch=16,
    heads_eval_every=3,
    jit_compile=False,
    pretrain=PretrainConfig(image_epochs=1, caption_epochs=1, pretrain_batch=16, num_distractors=4),
    scratch_objectives=("SS", "CE"),
    scratch_families=None,
    scratch_epochs=1,
    scratch_steps_per_epoch=3,
    scratch_batch=8,
    scratch_overrides=(  # the demo towers, smaller: one text layer, two image stages (a scratch run is mostly tracing)
        "model.embedding_dim=16,model.text.hidden_size=16,model.text.num_layers=1,model.text.intermediate_size=32,"
        "model.image.image_size=32,model.image.stackwise_filters=[4,8],model.image.stackwise_blocks=[1,1],"
        "model.image.stackwise_strides=[1,2],train.backup_every_steps=100",
    ),
    scratch_seeds=1,  # the seed loop is the heads regime's: one scratch run per objective exercises the training job
)


PLANS = {"default": DEFAULT, "full": FULL, "quick": QUICK}


def _family(plan: Plan, family: str, out: str):
    from benchmarks.quality.families.families import build_family

    folder = os.path.join(out, "families", family)
    return folder, build_family(family, folder, plan.size)


def _save_run(path: str, doc: dict, result: dict) -> None:
    """The run's JSON and its embeddings (float16): test (``q``, ``d`` and ids), val (``val_*``) and the promise
    distractors (``promise_d``) when the run has them."""
    import numpy as np

    os.makedirs(os.path.dirname(path), exist_ok=True)
    q, d, qi, di = result["embeddings"]
    arrays = {"q": q.astype(np.float16), "d": d.astype(np.float16), "q_ids": qi, "d_ids": di}
    if result.get("val_embeddings") is not None:
        vq, vd, vqi, vdi = result["val_embeddings"]
        arrays.update(val_q=vq.astype(np.float16), val_d=vd.astype(np.float16), val_q_ids=vqi, val_d_ids=vdi)
    if result.get("promise_distractors") is not None:
        arrays["promise_d"] = np.asarray(result["promise_distractors"]).astype(np.float16)
    np.savez(path[:-5] + ".tmp.npz", **arrays)
    os.replace(path[:-5] + ".tmp.npz", path[:-5] + ".npz")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def _doc(regime, family, label, objective, seed, result, seconds, extra) -> dict:
    from ce_retrieval.evaluation.evaluate import _jsonable

    return _jsonable(
        {
            "schema_version": 1,
            "run_name": label,
            "regime": regime,
            "family": family,
            "split": f"{family}/test",
            "summary": result["summary"],
            "metrics": result["metrics"],
            "curve": result.get("curve"),
            "calibration_split": {"name": "val"},
            "config": {"objective": objective.describe(), "train": {"seed": seed, **extra}},
            "seconds": {"total": seconds},
        }
    )


def choose_scale(plan: Plan, objective, features: dict, seed: int = 0) -> tuple[float, list[dict]]:
    """The λ of ``plan.scales`` whose heads score best on the validation split, and the sweep
    (``scale_choice.choose_scale`` at the plan's batch, steps and compilation; the test split is never read)."""
    from benchmarks.quality.scale_choice import choose_scale as choose

    batch = min(plan.heads_batch, len(features["train_text_ids"]))
    return choose(
        objective, features, plan.scales, seed=seed, batch=batch, steps=plan.heads_steps, jit_compile=plan.jit_compile
    )


def _train_heads(plan: Plan, objective, features: dict, seed: int, scale: float, **kwargs) -> tuple[dict, list]:
    """``heads.train_heads`` with the plan's batch, steps and compilation and ``objective`` at λ = ``scale``;
    returns the result and the loss's extra (learned) variables."""
    from benchmarks.quality import heads

    loss_fn, extra = so.heads_loss(objective, scale)
    result = heads.train_heads(
        features,
        loss_fn,
        seed=seed,
        batch=min(plan.heads_batch, len(features["train_text_ids"])),
        steps=plan.heads_steps,
        jit_compile=plan.jit_compile,
        extra_variables=extra,
        **kwargs,
    )
    return result, extra


def run_heads(
    plan: Plan, family: str, label: str, objective, seed: int, features, scale: float = so.SCALE, draw: int = 0
) -> tuple[dict, dict]:
    t0 = time.perf_counter()
    result, extra = _train_heads(
        plan, objective, features, seed, scale, eval_every=min(plan.heads_eval_every, plan.heads_steps)
    )
    learned = {v.name.split(":")[0]: float(v.numpy()) for v in extra}
    info = {
        "batch_size": plan.heads_batch,
        "steps": plan.heads_steps,
        "learned": learned,
        "scale": None if objective.learned_scale_bias else scale,
        "scales": list(plan.scales),
        "feature_draw": draw,
    }
    return _doc("heads", family, label, objective, seed, result, time.perf_counter() - t0, info), result


def _demo_config(plan: Plan, data_cfg, objective, seed: int):
    from ce_retrieval import configs
    from ce_retrieval.cli.train import resolve_config

    cfg = configs.load_experiment(resolve_config("synthetic_demo"), list(plan.scratch_overrides))
    cfg = dataclasses.replace(cfg, data=data_cfg)
    cfg = configs.merge(
        cfg,
        {
            "train": {
                "seed": seed,
                "batch_size": plan.scratch_batch,
                "epochs": plan.scratch_epochs,
                "steps_per_epoch": plan.scratch_steps_per_epoch,
                "verbose": 0,
            },
            "evaluation": {"every_n_epochs": 1},
        },
    )
    return configs.merge(cfg, so.scratch_overrides(objective)) if objective else cfg


def run_scratch(plan: Plan, family: str, label: str, objective, seed: int, out: str, data_cfg, distractors):
    from benchmarks.quality import heads
    from ce_retrieval import data
    from ce_retrieval.evaluation.embed import embed_split, embed_strings
    from ce_retrieval.training import load_trained, train

    t0 = time.perf_counter()
    cfg = _demo_config(plan, data_cfg, objective, seed)
    model_dir = os.path.join(out, "models", family, f"{label}-seed{seed}")
    summary = train(cfg, model_dir, print_fn=lambda *_: None)
    _, model = load_trained(model_dir)
    val = embed_split(model.text_encoder, model.image_encoder, data.load_retrieval_split(cfg.data, "val"))
    test = embed_split(model.text_encoder, model.image_encoder, data.load_retrieval_split(cfg.data, "test"))
    recall_distractors, promise_distractors = distractors
    result = heads.evaluate_arrays(
        val,
        test,
        embed_strings(model.image_encoder, recall_distractors),
        None if promise_distractors is None else embed_strings(model.image_encoder, promise_distractors),
    )
    history = summary["history"]
    epochs = len(history.get("val_pr_auc", []))
    result["curve"] = {
        "step": [(e + 1) * plan.scratch_steps_per_epoch for e in range(epochs)],
        "pr_auc": history.get("val_pr_auc", []),
        "t2i_r1": history.get("val_t2i_r1", []),
        "loss": history.get("loss", []),
        "split": "val",
    }
    info = {"batch_size": plan.scratch_batch, "steps": summary["steps"], "train_seconds": summary["seconds"]}
    return _doc("scratch", family, label, objective, seed, result, time.perf_counter() - t0, info), result


def _matches(doc: dict, plan: Plan, regime: str, objective) -> bool:
    """Whether a run on disk was trained as ``plan`` asks (else it is trained again)."""
    train = doc["config"]["train"]
    if regime == "heads":
        wanted = (plan.heads_batch, plan.heads_steps)
        if train.get("scales", []) != list(plan.scales):
            return False
    else:
        wanted = (plan.scratch_batch, plan.scratch_epochs * plan.scratch_steps_per_epoch)
    return (train["batch_size"], train["steps"]) == wanted and doc["config"]["objective"] == json.loads(
        json.dumps(objective.describe())
    )


def _objectives(names, recipe) -> dict:
    out = {}
    for name in names:
        if name == so.RECIPE:
            if recipe is not None:
                out[name] = recipe
            continue
        if name not in so.OBJECTIVES:
            raise ValueError(f"unknown objective {name!r}; known: {', '.join([*so.OBJECTIVES, so.RECIPE])}")
        out[name] = so.OBJECTIVES[name]
    return out


def _regime_state(plan: Plan, regime: str, family: str, data_cfg, folder: str, out: str, draw: int, log):
    """What a regime's runs share: the frozen features of feature draw ``draw`` (heads), or the distractor images
    (scratch: recall distractors, promise distractors or None)."""
    from benchmarks.quality.families.families import family_distractors
    from benchmarks.quality.family_features import build_family_features

    if regime == "heads":
        cache = os.path.join(out, "features", family) + ("" if draw == 0 else f"-draw{draw}")
        pretrain = dataclasses.replace(plan.pretrain, pretrain_seed=plan.pretrain.pretrain_seed + draw)
        if draw:  # the coverage study reads draw 0's runs only
            pretrain = dataclasses.replace(pretrain, num_promise_distractors=0)
        return build_family_features(family, data_cfg, folder, pretrain, cache, log, plan.scratch_overrides)
    extra = plan.pretrain.num_promise_distractors
    return (
        family_distractors(family, plan.pretrain.num_distractors, plan.size.seed, plan.size.image_size),
        family_distractors(family, extra, plan.size.seed + 1, plan.size.image_size) if extra else None,
    )


def _scale_for(plan: Plan, out: str, family: str, label: str, objective, features, draw: int, log):
    """λ for ``objective`` on ``family``: chosen once (draw 0, seed 0) on validation and cached in
    ``<out>/scales/<family>/<label>.json``; the same for every draw and seed."""
    path = os.path.join(out, "scales", family, f"{label}.json")
    key = {"scales": list(plan.scales), "steps": plan.heads_steps, "batch": plan.heads_batch}
    if os.path.exists(path):
        with open(path) as f:
            cached = json.load(f)
        if cached.get("key") == key:
            return cached["scale"], cached["sweep"]
    if draw != 0:
        raise RuntimeError(f"{family}/{label}: λ is chosen on feature draw 0 first")
    scale, sweep = choose_scale(plan, objective, features)
    if sweep:
        log(f"[suite] {family}/{label}: λ {scale:g} chosen on val from {[r['scale'] for r in sweep]}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"key": key, "scale": scale, "sweep": sweep}, f, indent=1)
    return scale, sweep


def run_plan(plan: Plan, out: str, recipe=None, rerun: bool = False, log=print) -> dict:
    """Every run of the plan (cached per run JSON unless ``rerun``): ``{"runs": [doc...], "skipped": [...]}``."""
    docs, skipped = [], []
    for family in plan.families:
        folder, data_cfg = _family(plan, family, out)
        for regime in plan.regimes:
            if regime == "scratch" and family not in plan.scratch_on():
                continue
            names = plan.heads_objectives if regime == "heads" else plan.scratch_objectives
            objectives = _objectives(names + ((so.RECIPE,) if recipe is not None else ()), recipe)
            base = _demo_config(plan, data_cfg, None, 0) if regime == "scratch" else None
            draws = range(plan.feature_draws) if regime == "heads" else range(1)
            for draw in draws:
                state = None
                for label, objective in objectives.items():
                    reason = so.unavailable(objective, regime, base)
                    if reason:
                        if draw == 0:
                            line = f"{regime}/{family}/{label}: not available: {reason}"
                            skipped.append({"regime": regime, "family": family, "objective": label, "reason": reason})
                            log(f"[suite] {line}")
                        continue
                    scale = None
                    for seed in range(plan.seeds_of(regime)):
                        name = f"{label}-seed{seed}" if draw == 0 else f"{label}-draw{draw}-seed{seed}"
                        path = os.path.join(out, "runs", regime, family, f"{name}.json")
                        if os.path.exists(path) and not rerun:
                            with open(path) as f:
                                cached = json.load(f)
                            if _matches(cached, plan, regime, objective):
                                docs.append(cached)
                                continue
                        if state is None:
                            state = _regime_state(plan, regime, family, data_cfg, folder, out, draw, log)
                        if regime == "heads":
                            if scale is None:
                                scale, sweep = _scale_for(plan, out, family, label, objective, state, draw, log)
                            doc, result = run_heads(plan, family, label, objective, seed, state, scale, draw)
                            doc["scale_sweep"] = sweep
                        else:
                            doc, result = run_scratch(plan, family, label, objective, seed, out, data_cfg, state)
                        _save_run(path, doc, result)
                        s = doc["summary"]
                        log(
                            f"[suite] {regime}/{family}/{name}: PR-AUC {100 * s['pr_auc']:.2f}, "
                            f"t2i R@1 {100 * s['t2i_r1']:.2f}, i2t R@1 {100 * s['i2t_r1']:.2f} "
                            f"({doc['seconds']['total']:.0f} s)"
                        )
                        docs.append(doc)
    return {"runs": docs, "skipped": skipped}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/calibration_suite")
    parser.add_argument("--results", default=os.path.join("benchmarks", "results", "calibration_suite"))
    parser.add_argument("--plan", choices=sorted(PLANS), default="default", help="default (<= 45 min), full, quick")
    parser.add_argument(
        "--quick", action="store_true", help="= --plan quick: one tiny family, 2 seeds (1 scratch), few steps"
    )
    parser.add_argument("--families", nargs="*", choices=FAMILIES, default=None)
    parser.add_argument("--regimes", nargs="*", choices=REGIMES, default=None)
    parser.add_argument("--objectives", nargs="*", default=None, help="heads-regime objectives (default: the plan's)")
    parser.add_argument("--scratch_objectives", nargs="*", default=None, help="scratch-regime objectives")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--scratch_seeds", type=int, default=None, help="scratch-regime seeds (default: --seeds)")
    parser.add_argument("--heads_steps", type=int, default=None)
    parser.add_argument("--feature_draws", type=int, default=None, help="independent frozen-feature draws (heads)")
    parser.add_argument("--scales", type=float, nargs="*", default=None, help="λ candidates chosen on validation")
    parser.add_argument(
        "--promise_distractors",
        type=int,
        default=None,
        help="save N more distractor embeddings per run for guarantee_coverage.py (100x the test gallery: 50000)",
    )
    parser.add_argument("--recipe", default=None, help='JSON: {"loss": name, "kwargs": {...}, "regularizer": name}')
    parser.add_argument("--rerun", action="store_true", help="train again where a run's JSON exists")
    parser.add_argument("--analyse", action="store_true", help="also write part 3's evidence (calibration_analysis)")
    args = parser.parse_args(argv)
    plan = PLANS["quick" if args.quick else args.plan]
    changes = {
        "families": tuple(args.families) if args.families else None,
        "regimes": tuple(args.regimes) if args.regimes else None,
        "heads_objectives": tuple(args.objectives) if args.objectives else None,
        "scratch_objectives": tuple(args.scratch_objectives) if args.scratch_objectives else None,
        "seeds": args.seeds,
        "scratch_seeds": args.scratch_seeds,
        "heads_steps": args.heads_steps,
        "feature_draws": args.feature_draws,
        "scales": tuple(args.scales) if args.scales is not None else None,
    }
    plan = dataclasses.replace(plan, **{k: v for k, v in changes.items() if v is not None})
    if args.promise_distractors is not None:
        plan = dataclasses.replace(
            plan, pretrain=dataclasses.replace(plan.pretrain, num_promise_distractors=args.promise_distractors)
        )
    recipe = so.recipe_objective(json.loads(args.recipe)) if args.recipe else None
    print(f"[suite] plan: {plan}\n[suite] estimated {plan.estimate_minutes():.0f} min on 2 idle cores", flush=True)
    start, loads = time.perf_counter(), []
    sampler = LoadSampler(loads)
    sampler.start()
    try:
        outcome = run_plan(plan, args.out, recipe, args.rerun)
    finally:
        sampler.stop.set()
    minutes = (time.perf_counter() - start) / 60
    machine = machine_info(loads)

    from benchmarks.quality import calibration_suite_report

    files = calibration_suite_report.write(args.results, outcome, plan, minutes, machine)
    if args.analyse:
        from benchmarks.quality import calibration_analysis

        files += calibration_analysis.write(args.results, args.out, outcome["runs"])
    print(f"[suite] {len(outcome['runs'])} runs, {minutes:.1f} min; " + ", ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The paper's Table 1 where training converges: the paper's six objectives, and the two a user weighs them against
today (symmetric InfoNCE, SigLIP), fine-tuned from pretrained towers, paired seeds and feature draws.

Regime (closest to the paper that converges on 2 CPU cores; see BENCHMARKS.md): the demo model's towers are
pretrained, each on its own modality, to classify scene attributes (the analogue of ImageNet ResNet-50 and
BERT: generic, unaligned features; ``pretrained_features.py``), frozen, and their features cached. Every run
then trains projection heads on top (``heads.py``) with one objective at the paper's settings: global batch 512,
negative fraction 0.5 for the mining losses, until the test metrics plateau. λ is 20 for all, or, with
``--scales``, each objective's own choice on the validation split (``scale_choice.py``: draw 0, seed 0; SigLIP's
learned t and b are not swept). Runs with the same seed and feature draw share initial weights and batch order,
so differences are paired; with ``--draws D`` the towers are pretrained D times (seeds 0..D-1) and the draw is
the unit of the paired tests (``pairing.py``): a head seed cannot vary what the features hold.

Outputs under ``--out`` (default ``runs/paper_tables``): ``runs/<objective>[-draw<k>]-seed<s>.json`` (evaluation
JSONs that ``ce-retrieval report`` reads; each with its learning curve), ``scales/`` (the λ choices); under
``--results`` (default ``--out``): ``table.md`` (the table, the temperatures, paired differences with
p-values, the sweeps), ``curves.png`` (PR-AUC and R@1 against steps per objective), ``sweep_batch.png`` and
``sweep_scale.png`` (CE gain against batch size and λ, draw 0), ``reliability.png`` and ``separation.png``
(promised vs achieved precision; pooled score distributions of SS and CE), and ``summary.json``.

    python -m benchmarks.quality.paper_tables --no_sweeps            # 8 objectives at their best, 3 draws x 3 seeds
    python -m benchmarks.quality.paper_tables --draws 1 --seeds 5 --scales --losses SampledSoftmax \
        StochasticNegativeMining LargeMarginSoftmax AngularSoftmax CrossExampleSoftmax CrossExampleNegativeMining
                                                                     # the first table: one draw, λ 20 (about 30 min)
    python -m benchmarks.quality.paper_tables --smoke --out /tmp/pt  # a tiny run of every stage (seconds; in the tests)
    python -m benchmarks.quality.paper_tables --full                 # the whole two-tower model, paper settings (GPU)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
from benchmarks.quality import heads  # noqa: E402
from benchmarks.quality import suite_objectives as so  # noqa: E402
from benchmarks.quality.pretrained_features import FeatureConfig, build_features  # noqa: E402

PAPER_LOSSES = {
    "SampledSoftmax": {},
    "StochasticNegativeMining": {"negative_fraction": 0.5},
    "LargeMarginSoftmax": {},
    "AngularSoftmax": {},
    "CrossExampleSoftmax": {},
    "CrossExampleNegativeMining": {"negative_fraction": 0.5},
}
# Every objective the table can hold: the paper's six, and the two a user weighs them against today (symmetric
# InfoNCE, CLIP's loss, at τ = 1/λ; SigLIP's sigmoid loss with its learned t and b, init 10 and −10).
OBJECTIVES = {
    **{name: so.Objective(name, tuple(sorted(kwargs.items()))) for name, kwargs in PAPER_LOSSES.items()},
    "SymmetricInfoNCE": so.OBJECTIVES["CLIP"],
    "SigLIP": so.OBJECTIVES["SigLIP"],
}
PAIRED_KEYS = (
    "pr_auc",
    "t2i_r1",
    "dis_t2i_r1",
    "achieved_precision_0.5",
    "mean_calibration_error",
    "relative_threshold_spread",
)


@dataclasses.dataclass
class Plan:
    seeds: int = 3
    steps: int = 1200
    batch: int = 512
    scale: float = 20.0
    eval_every: int = 100
    jit_compile: bool = True
    sweep_seeds: int = 2
    sweep_epochs: float = 8.0  # passes over the training captions, the same for every batch size
    sweep_batches: tuple = (64, 256, 1024, 4096)
    sweep_scales: tuple = (5.0, 10.0, 20.0, 40.0)
    features: FeatureConfig = dataclasses.field(default_factory=FeatureConfig)
    # Independent draws of the frozen features (tower pretraining seeds 0..D-1): the unit of variance of the paired
    # differences when D > 1 (``pairing.paired_by_draw``); each draw trains every objective with ``seeds`` seeds.
    draws: int = 3
    # λ candidates: each objective with a fixed λ runs at the one its validation figures prefer (draw 0, seed 0,
    # ``scale_choice.choose_scale``); () keeps ``scale`` for all. Learned temperatures (SigLIP) are not swept.
    scales: tuple = (5.0, 10.0, 20.0, 40.0)
    # Precision levels promised from the validation split and checked on test (the guaranteed threshold at
    # confidence 0.9 and the point estimate), below the 0.5 / 0.8 / 0.9 of the service: what these features certify.
    promise_levels: tuple = (0.1, 0.2, 0.3, 0.4, 0.5, 0.8, 0.9)


SMOKE = Plan(
    seeds=1,
    draws=2,
    scales=(10.0, 40.0),
    steps=20,
    batch=64,
    eval_every=10,
    jit_compile=False,
    sweep_seeds=2,
    sweep_epochs=1.0,
    sweep_batches=(256,),
    sweep_scales=(10.0,),
    features=FeatureConfig(
        num_train_images=200,
        num_val_images=40,
        num_test_images=40,
        num_distractors=20,
        image_epochs=1,
        caption_epochs=1,
        pretrain_batch=64,
    ),
)


def _record(label: str, seed: int, result: dict, plan: Plan, batch: int, scale, steps: int, draw: int) -> dict:
    """An evaluation-JSON document (what ``ce-retrieval report`` reads) plus the learning curve."""
    from ce_retrieval.evaluation.evaluate import _jsonable

    objective = OBJECTIVES[label]
    return _jsonable(
        {
            "schema_version": 1,
            "run_name": label,
            "split": "synthetic/test (pretrained-feature regime)",
            "summary": result["summary"],
            "metrics": result["metrics"],
            "curve": result["curve"],
            "num_distractors": plan.features.num_distractors,
            "calibration_split": {"name": "val"},
            "dataset_fingerprint": _features_of(plan, draw).key(),
            "config": {
                "loss": {"name": objective.loss, "kwargs": {"scale": scale, **objective.loss_kwargs}},
                "objective": objective.describe(),
                "train": {
                    "seed": seed,
                    "batch_size": batch,
                    "steps": steps,
                    "feature_draw": draw,
                    "scale": scale,
                    "scales": list(plan.scales),
                    "learned": result.get("learned", {}),
                },
                "features": dataclasses.asdict(_features_of(plan, draw)),
            },
            "seconds": {"train": result["seconds"]},
        }
    )


def _features_of(plan: Plan, draw: int) -> FeatureConfig:
    """Feature draw ``draw``: the towers pretrained with seed ``pretrain_seed + draw`` (draw 0 is the plan's)."""
    return dataclasses.replace(plan.features, pretrain_seed=plan.features.pretrain_seed + draw)


def _feature_dir(out: str, draw: int) -> str:
    return os.path.join(out, "features" if draw == 0 else f"features-draw{draw}")


RECORDED_SECONDS: list[float] = []  # every run of this invocation, cached or not (its recorded training time)


def run(
    features,
    label: str,
    seed: int,
    plan: Plan,
    out: str,
    batch: int,
    scale,
    steps: int,
    tag: str = "",
    rerun: bool = False,
    keep_embeddings: bool = False,
    draw: int = 0,
) -> dict:
    """One training of ``label`` (a key of :data:`OBJECTIVES`) at λ = ``scale`` on feature draw ``draw``; a run
    on disk trained the same way is read instead."""
    name = f"{label}{tag}-seed{seed}" if draw == 0 else f"{label}{tag}-draw{draw}-seed{seed}"
    path = os.path.join(out, "runs", f"{name}.json")
    objective = OBJECTIVES[label]
    scale = None if objective.learned_scale_bias else scale
    if os.path.exists(path) and not rerun and not keep_embeddings:
        with open(path) as f:
            doc = json.load(f)
        train = doc["config"]["train"]
        levels = set((doc["metrics"].get("promises") or {}).get("levels") or {})
        same = train.get("scale", plan.scale) == scale and (train["batch_size"], train["steps"]) == (batch, steps)
        same = same and doc.get("dataset_fingerprint") == _features_of(plan, draw).key()  # the same features
        if same and levels >= {f"{p:g}" for p in plan.promise_levels}:
            RECORDED_SECONDS.append(doc["seconds"].get("total", doc["seconds"]["train"]))
            return doc
    t0 = time.perf_counter()
    loss_fn, extra = so.heads_loss(objective, so.SCALE if scale is None else scale)
    result = heads.train_heads(
        features,
        loss_fn,
        seed=seed,
        batch=batch,
        steps=steps,
        eval_every=min(plan.eval_every, steps),
        jit_compile=plan.jit_compile,
        extra_variables=extra,
        promise_levels=plan.promise_levels,
    )
    result["learned"] = {v.name.split(":")[0]: float(v.numpy()) for v in extra}
    doc = _record(label, seed, result, plan, batch, scale, steps, draw)
    doc["seconds"]["total"] = time.perf_counter() - t0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)
    RECORDED_SECONDS.append(doc["seconds"]["total"])
    s = doc["summary"]
    print(
        f"[paper_tables] {name}: PR-AUC {100 * s['pr_auc']:.2f}  R@1 {100 * s['t2i_r1']:.2f}  "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    if keep_embeddings:
        doc["_embeddings"] = result["embeddings"]
    return doc


def choose_scales(features, plan: Plan, out: str, labels) -> dict:
    """λ per objective, chosen on the validation split of feature draw 0 with seed 0 (``scale_choice``), cached in
    ``<out>/scales/<label>.json``: ``{label: {"scale", "sweep"}}``. Without candidates every objective keeps
    ``plan.scale``."""
    from benchmarks.quality.scale_choice import choose_scale

    chosen = {}
    key = {"scales": list(plan.scales), "steps": plan.steps, "batch": plan.batch, "features": plan.features.key()}
    for label in labels:
        path = os.path.join(out, "scales", f"{label}.json")
        if os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            if cached.get("key") == key:
                chosen[label] = {"scale": cached["scale"], "sweep": cached["sweep"]}
                continue
        if not plan.scales:
            chosen[label] = {"scale": plan.scale, "sweep": []}
            continue
        scale, sweep = choose_scale(
            OBJECTIVES[label],
            features,
            plan.scales,
            seed=0,
            batch=plan.batch,
            steps=plan.steps,
            jit_compile=plan.jit_compile,
        )
        if sweep:
            print(f"[paper_tables] {label}: λ {scale:g} chosen on val from {list(plan.scales)}", flush=True)
        chosen[label] = {"scale": scale, "sweep": sweep}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"key": key, **chosen[label]}, f, indent=1)
        os.replace(path + ".tmp", path)
    return chosen


def _paired(a_docs, b_docs, key):
    from ce_retrieval.evaluation.report import paired_difference

    return paired_difference(a_docs + b_docs, a_docs[0]["run_name"], b_docs[0]["run_name"], key)


def sweep(features, plan: Plan, out: str, name: str, values, make, rerun: bool) -> list[dict]:
    """CE - SS paired over ``sweep_seeds`` at each value; ``make(value) -> (batch, scale)``. Every point trains
    for ``sweep_epochs`` passes over the training captions (fewer steps for larger batches)."""
    rows = []
    for value in values:
        batch, scale = make(value)
        steps = max(1, int(round(plan.sweep_epochs * len(features["train_text_ids"]) / batch)))
        docs = {
            loss: [
                run(features, loss, s, plan, out, batch, scale, steps, f"-{name}{value:g}", rerun)
                for s in range(plan.sweep_seeds)
            ]
            for loss in ("SampledSoftmax", "CrossExampleSoftmax")
        }
        row = {"value": value, "steps": steps}
        for key in ("pr_auc", "t2i_r1"):
            row[key] = _paired(docs["CrossExampleSoftmax"], docs["SampledSoftmax"], key)
            row[f"ss_{key}"] = sum(d["summary"][key] for d in docs["SampledSoftmax"]) / plan.sweep_seeds
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/paper_tables", help="features, runs and (without --results) the record")
    parser.add_argument("--results", default=None, help="where table.md, summary.json and the figures go (--out)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: every stage in seconds")
    parser.add_argument(
        "--full", action="store_true", help="train the whole two-tower model at the paper's settings instead"
    )
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--draws", type=int, default=None, help="independent frozen-feature draws (default 3)")
    parser.add_argument(
        "--scales", type=float, nargs="*", default=None, help="λ candidates chosen on validation (none: λ 20 for all)"
    )
    parser.add_argument(
        "--losses", nargs="*", choices=list(OBJECTIVES), default=None, help="default: all (--full: the paper's six)"
    )
    parser.add_argument("--no_sweeps", action="store_true")
    parser.add_argument("--rerun", action="store_true", help="train again even where a run's JSON exists")
    args = parser.parse_args(argv)
    if args.full:
        from benchmarks.quality import paper_tables_full

        return paper_tables_full.main(args)
    args.losses = args.losses or list(OBJECTIVES)
    changes = {"seeds": args.seeds, "steps": args.steps, "draws": args.draws}
    if args.scales is not None:
        changes["scales"] = tuple(args.scales)
    plan = dataclasses.replace(SMOKE if args.smoke else Plan(), **{k: v for k, v in changes.items() if v is not None})
    results = args.results or args.out
    from benchmarks.common.machine import LoadSampler, machine_info

    loads: list = []
    sampler = LoadSampler(loads)
    sampler.start()
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    features = build_features(plan.features, _feature_dir(args.out, 0))
    feature_seconds = time.perf_counter() - start
    chosen = choose_scales(features, plan, args.out, args.losses)

    docs: dict = {label: [] for label in args.losses}
    for draw in range(plan.draws):
        if draw:
            features = build_features(_features_of(plan, draw), _feature_dir(args.out, draw))
        for label in args.losses:
            for s in range(plan.seeds):
                keep = draw == 0 and s == 0 and label in ("SampledSoftmax", "CrossExampleSoftmax")
                scale = chosen[label]["scale"]
                doc = run(features, label, s, plan, args.out, plan.batch, scale, plan.steps, "", args.rerun, keep, draw)
                docs[label].append(doc)
    table_seconds = time.perf_counter() - start - feature_seconds
    sweeps = {}
    if not args.no_sweeps:
        features = build_features(plan.features, _feature_dir(args.out, 0))
        sweeps["batch"] = sweep(
            features, plan, args.out, "batch", plan.sweep_batches, lambda b: (int(b), plan.scale), args.rerun
        )
        sweeps["scale"] = sweep(
            features, plan, args.out, "scale", plan.sweep_scales, lambda s: (plan.batch, float(s)), args.rerun
        )
    minutes = (time.perf_counter() - start) / 60
    sampler.stop.set()

    from benchmarks.quality import paper_tables_report

    recorded_features = 0.0
    for draw in range(plan.draws):
        with open(os.path.join(_feature_dir(args.out, draw), "features.json")) as f:
            recorded_features += json.load(f)["seconds"]
    files = paper_tables_report.write(
        results,
        docs,
        sweeps,
        plan,
        minutes=minutes,
        seconds={"features": recorded_features, "runs": sum(RECORDED_SECONDS), "table": table_seconds},
        scales=chosen,
        machine=machine_info(loads),
    )
    print(f"[paper_tables] {sum(len(v) for v in docs.values())} table runs, {minutes:.1f} min; " + ", ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The paper's Table 1 where training converges: six objectives fine-tuned from pretrained towers, paired seeds.

Regime (closest to the paper that converges on 2 CPU cores; see BENCHMARKS.md): the demo model's towers are
pretrained once, each on its own modality, to classify scene attributes (the analogue of ImageNet ResNet-50 and
BERT: generic, unaligned features; ``pretrained_features.py``), frozen, and their features cached. Every run
then trains projection heads on top (``heads.py``) with one objective at the paper's settings: global batch 512,
lambda = 20, negative fraction 0.5 for the mining losses, until the test metrics plateau. Runs with the same
seed share initial weights and batch order, so CE - SS differences are paired.

Outputs under ``--out`` (default ``runs/paper_tables``): ``runs/<loss>-seed<k>.json`` (evaluation JSONs that
``ce-retrieval report`` reads; each with its learning curve), ``table.md`` (the table, paired CE - SS
differences with p-values, the sweeps), ``curves.png`` (PR-AUC and R@1 against steps per objective),
``sweep_batch.png`` and ``sweep_scale.png`` (CE gain against batch size and lambda), ``reliability.png`` and
``separation.png`` (evidence: promised vs achieved precision; pooled score distributions of SS and CE), and
``summary.json``.

    python -m benchmarks.quality.paper_tables                        # the whole benchmark (about 30 min on 2 cores)
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
from benchmarks.quality.pretrained_features import FeatureConfig, build_features  # noqa: E402

PAPER_LOSSES = {
    "SampledSoftmax": {},
    "StochasticNegativeMining": {"negative_fraction": 0.5},
    "LargeMarginSoftmax": {},
    "AngularSoftmax": {},
    "CrossExampleSoftmax": {},
    "CrossExampleNegativeMining": {"negative_fraction": 0.5},
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
    seeds: int = 5
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


SMOKE = Plan(
    seeds=2,
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


def _record(loss: str, seed: int, result: dict, plan: Plan, batch: int, scale: float, steps: int) -> dict:
    """An evaluation-JSON document (what ``ce-retrieval report`` reads) plus the learning curve."""
    from ce_retrieval.evaluation.evaluate import _jsonable

    return _jsonable(
        {
            "schema_version": 1,
            "run_name": loss,
            "split": "synthetic/test (pretrained-feature regime)",
            "summary": result["summary"],
            "metrics": result["metrics"],
            "curve": result["curve"],
            "num_distractors": plan.features.num_distractors,
            "calibration_split": {"name": "val"},
            "dataset_fingerprint": plan.features.key(),
            "config": {
                "loss": {"name": loss, "kwargs": {"scale": scale, **PAPER_LOSSES.get(loss, {})}},
                "train": {"seed": seed, "batch_size": batch, "steps": steps},
                "features": dataclasses.asdict(plan.features),
            },
            "seconds": {"train": result["seconds"]},
        }
    )


RECORDED_SECONDS: list[float] = []  # every run of this invocation, cached or not (its recorded training time)


def run(
    features,
    loss: str,
    seed: int,
    plan: Plan,
    out: str,
    batch: int,
    scale: float,
    steps: int,
    tag: str = "",
    rerun: bool = False,
    keep_embeddings: bool = False,
) -> dict:
    path = os.path.join(out, "runs", f"{loss}{tag}-seed{seed}.json")
    if os.path.exists(path) and not rerun and not keep_embeddings:
        with open(path) as f:
            doc = json.load(f)
        RECORDED_SECONDS.append(doc["seconds"].get("total", doc["seconds"]["train"]))
        return doc
    t0 = time.perf_counter()
    result = heads.train_heads(
        features,
        heads.make_loss(loss, scale, **PAPER_LOSSES.get(loss, {})),
        seed=seed,
        batch=batch,
        steps=steps,
        eval_every=min(plan.eval_every, steps),
        jit_compile=plan.jit_compile,
    )
    doc = _record(loss, seed, result, plan, batch, scale, steps)
    doc["seconds"]["total"] = time.perf_counter() - t0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)
    RECORDED_SECONDS.append(doc["seconds"]["total"])
    s = doc["summary"]
    print(
        f"[paper_tables] {loss}{tag} seed {seed}: PR-AUC {100 * s['pr_auc']:.2f}  R@1 {100 * s['t2i_r1']:.2f}  "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    if keep_embeddings:
        doc["_embeddings"] = result["embeddings"]
    return doc


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
    parser.add_argument("--out", default="runs/paper_tables")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: every stage in seconds")
    parser.add_argument(
        "--full", action="store_true", help="train the whole two-tower model at the paper's settings instead"
    )
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--losses", nargs="*", default=list(PAPER_LOSSES))
    parser.add_argument("--no_sweeps", action="store_true")
    parser.add_argument("--rerun", action="store_true", help="train again even where a run's JSON exists")
    args = parser.parse_args(argv)
    if args.full:
        from benchmarks.quality import paper_tables_full

        return paper_tables_full.main(args)
    plan = dataclasses.replace(
        SMOKE if args.smoke else Plan(),
        **{k: v for k, v in (("seeds", args.seeds), ("steps", args.steps)) if v is not None},
    )
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    features = build_features(plan.features, os.path.join(args.out, "features"))
    feature_seconds = time.perf_counter() - start

    docs = {
        loss: [
            run(
                features,
                loss,
                s,
                plan,
                args.out,
                plan.batch,
                plan.scale,
                plan.steps,
                rerun=args.rerun,
                keep_embeddings=(s == 0 and loss in ("SampledSoftmax", "CrossExampleSoftmax")),
            )
            for s in range(plan.seeds)
        ]
        for loss in args.losses
    }
    table_seconds = time.perf_counter() - start - feature_seconds
    sweeps = {}
    if not args.no_sweeps:
        sweeps["batch"] = sweep(
            features, plan, args.out, "batch", plan.sweep_batches, lambda b: (int(b), plan.scale), args.rerun
        )
        sweeps["scale"] = sweep(
            features, plan, args.out, "scale", plan.sweep_scales, lambda s: (plan.batch, float(s)), args.rerun
        )
    minutes = (time.perf_counter() - start) / 60

    from benchmarks.quality import paper_tables_report

    with open(os.path.join(args.out, "features", "features.json")) as f:
        recorded_features = json.load(f)["seconds"]
    files = paper_tables_report.write(
        args.out,
        docs,
        sweeps,
        plan,
        minutes=minutes,
        seconds={"features": recorded_features, "runs": sum(RECORDED_SECONDS), "table": table_seconds},
    )
    print(f"[paper_tables] {sum(len(v) for v in docs.values())} table runs, {minutes:.1f} min; " + ", ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

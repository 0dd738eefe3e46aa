"""Promises on a new domain (#29 part 4): a model trained on one dataset family, served on another, with the
thresholds of its own validation split and after ``ce-retrieval calibrate`` on 50, 200 and 1,000 labelled queries.

The model: the frozen-feature regime of the calibration suite (``family_features.py``, ``heads.py``): the demo
towers pretrained on the *training* family's attributes (shapes by default), heads trained with a project loss
(SS by default). Its guaranteed thresholds are calibrated on the training family's validation split, as
``ce-retrieval index --calibration_split val`` does, and derived for the served gallery's size. It is served on
the *served* family (vague captions by default: same words, captions that fit many images) with the served
family's test images as the gallery and its test captions as the queries; a caption is relevant to its own image
(the family loader's ground truth), or with ``--relevance fits`` to every image it fits (several relevant ids).

Recalibration runs the command's own code at the embedding level: ``relevance_labels`` (positives, query units)
and ``recalibrate.calibrate_on_index`` on ``n`` captions drawn at random from the served queries, then
``Calibration.for_gallery``. A promise is checked on the captions *not* drawn (the served population held out):
the pooled precision of "score >= threshold" over them against the gallery must reach its level. Per size, over
``--resamples`` draws: the share of draws whose every certified level kept its promise (the guarantee says at least
1 - delta, up to the held-out set's own sampling noise), the share of draws certifying each level, and the
precision and recall served; the point estimate fitted on the same labels beside it (no guarantee).

    python -m benchmarks.quality.recalibration                 # shapes -> vague, 50 draws per size: 3.1 min on 2 cores
    python -m benchmarks.quality.recalibration --train_family vague --served_family shapes          # the other way
    python -m benchmarks.quality.recalibration --quick --out /tmp/rc --results /tmp/rc/results   # smoke (< 1 min)

Records: ``benchmarks/results/recalibration_<train>_to_<served>.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
from benchmarks.common.machine import LoadSampler, machine_info  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from benchmarks.quality.families.families import FAMILIES, FamilySize  # noqa: E402
from benchmarks.quality.family_features import PretrainConfig  # noqa: E402

LABELS_SOURCE = {"file": "served queries (in memory)", "format": "jsonl"}
OFFSET = 1 << 40  # ids of the served family's split are moved past the training family's in the heads' test set


@dataclasses.dataclass(frozen=True)
class Plan:
    train_family: str = "shapes"
    served_family: str = "vague"
    train_size: FamilySize = FamilySize()
    served_size: FamilySize = FamilySize(num_train=200, num_val=50, num_test=1000)
    pretrain: PretrainConfig = PretrainConfig(num_distractors=8)
    objective: str = "SS"
    heads_steps: int = 400
    heads_batch: int = 512
    jit_compile: bool = True
    overrides: tuple = ()  # of the demo config the towers are built from (the quick plan's tiny model)
    sizes: tuple = (50, 200, 1000)
    resamples: int = 50
    # the levels this frozen-feature model can promise in its own domain (the calibration suite's heads reach
    # precision 0.5 only near 2 % recall): 0.05 and 0.1 are certified on the training family's test gallery
    levels: tuple = (0.05, 0.1, 0.2)
    delta: float = 0.1
    relevance: str = "own"  # "own": a caption's own image; "fits": every image it fits (sidecar)
    seed: int = 0


QUICK = Plan(
    train_size=FamilySize(num_train=24, num_val=8, num_test=8, captions_per_image=2, image_size=32),
    served_size=FamilySize(num_train=8, num_val=8, num_test=30, captions_per_image=2, image_size=32),
    pretrain=PretrainConfig(image_epochs=1, caption_epochs=1, pretrain_batch=16, num_distractors=4),
    heads_steps=6,
    heads_batch=16,
    jit_compile=False,
    overrides=(
        "model.embedding_dim=16,model.text.hidden_size=16,model.text.num_layers=1,model.text.intermediate_size=32,"
        "model.image.image_size=32,model.image.stackwise_filters=[4,8,8,8]",
    ),
    sizes=(20,),
    resamples=3,
    levels=(0.3, 0.5),
)


# ----------------------------------------------------------------------------------------------- the model
def cross_family_features(plan: Plan, out: str, log=print) -> dict:
    """Frozen features of the training family's train / val / test splits and of the served family's test split
    (``served_*``), all from the towers pretrained on the training family (as ``build_family_features`` pretrains
    them, which embeds one family only); cached in ``<out>/features.npz`` under the plan's key."""
    import hashlib

    key = hashlib.sha256(
        json.dumps(
            [
                plan.train_family,
                plan.served_family,
                dataclasses.asdict(plan.train_size),
                dataclasses.asdict(plan.served_size),
                dataclasses.asdict(plan.pretrain),
                list(plan.overrides),
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    path = os.path.join(out, "features.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            if str(z["key"]) == key:
                return {**{k: z[k] for k in z.files if k != "key"}, "cached": True}
    from benchmarks.quality.families.families import build_family, family_distractors
    from benchmarks.quality.families.family_format import read_sidecar
    from benchmarks.quality.family_features import _towers
    from benchmarks.quality.pretrained_features import _embed, _pretrain
    from ce_retrieval import data
    from ce_retrieval.utils.seeding import seed_everything

    t0 = time.perf_counter()
    train_dir = os.path.join(out, "families", plan.train_family)
    served_dir = os.path.join(out, "families", plan.served_family)
    train_cfg = build_family(plan.train_family, train_dir, plan.train_size)
    served_cfg = build_family(plan.served_family, served_dir, plan.served_size)
    splits = {s: data.load_retrieval_split(train_cfg, s) for s in ("train", "val", "test")}
    splits["served"] = data.load_retrieval_split(served_cfg, "test")
    seed_everything(plan.pretrain.pretrain_seed)
    text, image = _towers(train_cfg, os.path.join(out, "vocab"), plan.overrides)
    train = splits["train"]
    targets = read_sidecar(train_dir, "train", train.image_ids)["attributes"]
    position = {image_id: k for k, image_id in enumerate(train.image_ids.tolist())}
    caption_targets = targets[[position[i] for i in train.caption_ids.tolist()]]
    pc = plan.pretrain
    _pretrain(image, np.asarray(train.images, dtype=object), targets, pc, pc.image_epochs, "image", log)
    _pretrain(text, np.asarray(train.captions, dtype=object), caption_targets, pc, pc.caption_epochs, "text", log)
    feats = {}
    for name, split in splits.items():
        feats[f"{name}_text"] = _embed(text, split.captions)
        feats[f"{name}_text_ids"] = np.asarray(split.caption_ids, np.int64)
        feats[f"{name}_image"] = _embed(image, split.images)
        feats[f"{name}_image_ids"] = np.asarray(split.image_ids, np.int64)
    order = np.argsort(feats["train_image_ids"])  # heads.train_heads looks images up with searchsorted
    feats["train_image"], feats["train_image_ids"] = feats["train_image"][order], feats["train_image_ids"][order]
    size = plan.train_size
    feats["distractor_image"] = _embed(
        image, family_distractors(plan.train_family, pc.num_distractors, seed=size.seed, image_size=size.image_size)
    )
    fits = read_sidecar(served_dir, "test")["fits"]
    feats["served_captions"] = np.asarray(splits["served"].captions, dtype=object).astype(str)
    feats["served_fits"] = np.asarray(json.dumps({c: fits.get(c, []) for c in set(splits["served"].captions)}))
    feats["seconds"] = np.float64(time.perf_counter() - t0)
    os.makedirs(out, exist_ok=True)
    np.savez(path + ".tmp.npz", key=key, **feats)
    os.replace(path + ".tmp.npz", path)
    log(f"[recalibration] features: {feats['seconds']:.0f} s")
    return {**feats, "cached": False}


def served_embeddings(plan: Plan, feats: dict, log=print) -> dict:
    """The heads trained on the training family, and the embeddings of its val and test splits and of the served
    split. ``heads.train_heads`` returns the embeddings of its ``test`` split only, so that split is the three
    of them stacked (ids moved apart by ``OFFSET``) and split again here."""
    from benchmarks.quality import heads
    from benchmarks.quality import suite_objectives as so

    parts = ("val", "test", "served")
    stacked = dict(feats)
    for kind in ("text", "image"):
        stacked[f"test_{kind}"] = np.concatenate([feats[f"{p}_{kind}"] for p in parts])
        stacked[f"test_{kind}_ids"] = np.concatenate(
            [feats[f"{p}_{kind}_ids"] + k * OFFSET for k, p in enumerate(parts)]
        )
    loss_fn, extra = so.heads_loss(so.OBJECTIVES[plan.objective])
    result = heads.train_heads(
        stacked,
        loss_fn,
        seed=plan.seed,
        batch=min(plan.heads_batch, len(feats["train_text_ids"])),
        steps=plan.heads_steps,
        eval_every=plan.heads_steps,
        jit_compile=plan.jit_compile,
        extra_variables=extra,
    )
    q, d, qi, di = result["embeddings"]
    out = {}
    for k, p in enumerate(parts):
        qm, dm = (qi >= k * OFFSET) & (qi < (k + 1) * OFFSET), (di >= k * OFFSET) & (di < (k + 1) * OFFSET)
        out[p] = (q[qm], d[dm], qi[qm] - k * OFFSET, di[dm] - k * OFFSET)
    log(f"[recalibration] heads ({plan.objective}, {plan.heads_steps} steps): {result['seconds']:.0f} s")
    return out


# ------------------------------------------------------------------------------------------- the promises
def relevant_sets(plan: Plan, feats: dict, served) -> list[np.ndarray]:
    """Per served caption, the gallery ids relevant to it: its own image, or (``fits``) every image it fits."""
    own = served[2]
    if plan.relevance == "own":
        return [np.array([i], np.int64) for i in own]
    fits = json.loads(str(feats["served_fits"]))
    return [np.union1d(fits[c], [i]).astype(np.int64) for c, i in zip(feats["served_captions"], own, strict=True)]


class Truth:
    """Pooled precision and recall of "score >= t" over a subset of the served captions against the gallery."""

    def __init__(self, q, d, gallery_ids, relevant):
        from ce_retrieval.data.relevance_labels import RelevanceLabels, positives_in_gallery

        self.scores = q @ d.T
        labels = RelevanceLabels([""] * len(q), relevant, [str(i) for i in range(len(q))], dict(LABELS_SOURCE))
        rows, cols = positives_in_gallery(labels, gallery_ids)
        self.relevant = np.zeros(self.scores.shape, bool)
        self.relevant[rows, cols] = True

    def __call__(self, t: float | None, rows: np.ndarray) -> dict | None:
        if t is None:
            return None
        s, rel = self.scores[rows], self.relevant[rows]
        hits = s >= t
        tp, returned = int(np.sum(hits & rel)), int(hits.sum())
        return {
            "precision": tp / returned if returned else None,
            "recall": tp / max(int(rel.sum()), 1),
            "returned_per_query": returned / len(rows),
        }


def kept(block: dict, truth: Truth, rows: np.ndarray) -> dict:
    """Per level: the threshold, its served precision / recall on ``rows``, and whether the promise held (a level
    with no threshold, or nothing returned, holds: nothing was promised or nothing served)."""
    out = {}
    for level, t in block.items():
        served = truth(t, rows)
        ok = served is None or served["precision"] is None or served["precision"] >= float(level)
        out[level] = {"threshold": t, **(served or {}), "kept": bool(ok)}
    return out


def run(plan: Plan, out: str, log=print) -> dict:
    from ce_retrieval.data.relevance_labels import RelevanceLabels
    from ce_retrieval.evaluation.split_calibration import calibrate_split
    from ce_retrieval.search.gallery import GalleryIndex
    from ce_retrieval.serve.recalibrate import calibrate_on_index

    feats = cross_family_features(plan, out, log)
    emb = served_embeddings(plan, feats, log)
    q, d, _, gallery_ids = emb["served"]
    m = len(gallery_ids)
    relevant = relevant_sets(plan, feats, emb["served"])
    truth = Truth(q, d, gallery_ids, relevant)
    everyone = np.arange(len(q))
    gallery = GalleryIndex("", {}, d, gallery_ids, None)
    record = {"plan": dataclasses.asdict(plan), "gallery_size": m, "served_queries": len(q), "sizes": {}}
    record["features"] = {"seconds": float(feats.get("seconds", np.nan)), "cached": bool(feats["cached"])}

    validation = calibrate_split(*emb["val"], levels=plan.levels, delta=plan.delta)
    own = validation.for_gallery(m)
    test_q, test_d, test_qi, test_di = emb["test"]
    own_test = validation.for_gallery(len(test_di))
    in_domain = Truth(test_q, test_d, test_di, [np.array([i]) for i in test_qi])
    record["in_domain"] = kept(own_test["guaranteed"]["threshold_at_precision"], in_domain, np.arange(len(test_q)))
    record["before"] = {
        "guaranteed": kept(own["guaranteed"]["threshold_at_precision"], truth, everyone),
        "estimated": kept(own["estimated"]["threshold_at_precision"], truth, everyone),
        "relevant_per_query_assumed": own["guaranteed"]["relevant_per_query"],
        "relevant_per_query_served": float(truth.relevant.sum() / len(q)),
    }
    rng = np.random.default_rng(plan.seed)
    for n in plan.sizes:
        if n >= len(q):
            log(f"[recalibration] size {n}: skipped, the served split has {len(q)} captions")
            continue
        draws = []
        for _ in range(plan.resamples):
            pick = np.sort(rng.choice(len(q), size=n, replace=False))
            held_out = np.setdiff1d(everyone, pick)
            labels = RelevanceLabels(
                [str(i) for i in pick], [relevant[i] for i in pick], [str(i) for i in pick], dict(LABELS_SOURCE)
            )
            block = calibrate_on_index(q[pick], gallery, labels, levels=plan.levels, delta=plan.delta).for_gallery(m)
            draws.append(
                {
                    "guaranteed": kept(block["guaranteed"]["threshold_at_precision"], truth, held_out),
                    "estimated": kept(block["estimated"]["threshold_at_precision"], truth, held_out),
                }
            )
        record["sizes"][str(n)] = summarise(draws, plan)
        g = record["sizes"][str(n)]["guaranteed"]
        log(f"[recalibration] {n} labelled queries: every promise kept in {g['all_kept']:.2f} of {len(draws)} draws")
    return record


def summarise(draws: list[dict], plan: Plan) -> dict:
    """Per kind (guaranteed / estimated): the share of draws keeping every promise, and per level the share
    certified (given a threshold), kept, and the mean precision and recall served where certified."""
    out = {}
    for kind in ("guaranteed", "estimated"):
        rows = [d[kind] for d in draws]
        levels = {}
        for level in rows[0]:
            given = [r[level] for r in rows if r[level]["threshold"] is not None]
            prec = [g["precision"] for g in given if g.get("precision") is not None]
            levels[level] = {
                "certified": len(given) / len(rows),
                "kept": float(np.mean([r[level]["kept"] for r in rows])),
                "precision_mean": float(np.mean(prec)) if prec else None,
                "precision_min": float(np.min(prec)) if prec else None,
                "recall_mean": float(np.mean([g["recall"] for g in given])) if given else None,
            }
        out[kind] = {"all_kept": float(np.mean([all(v["kept"] for v in r.values()) for r in rows])), "levels": levels}
    out["draws"] = len(draws)
    return out


# ------------------------------------------------------------------------------------------------- report
def _cell(level: dict) -> str:
    if level["threshold"] is None:
        return "refused"
    p = "nothing returned" if level.get("precision") is None else f"prec {level['precision']:.3f}"
    return f"τ {level['threshold']:.3f}: {p}, rec {level['recall']:.3f}" + ("" if level["kept"] else " **broken**")


def report(record: dict, minutes: float, machine: dict) -> str:
    plan, before = record["plan"], record["before"]
    levels = [f"{float(p):g}" for p in plan["levels"]]
    lines = [
        "# Promises on a new domain: recalibration with a few labels",
        "",
        f"Model trained on **{plan['train_family']}** (frozen-feature towers + {plan['objective']} heads, "
        f"{plan['heads_steps']} steps), served on **{plan['served_family']}**: gallery of {record['gallery_size']:,} "
        f"test images, {record['served_queries']:,} test captions as the served queries, relevance: "
        f"{plan['relevance']}. Confidence 1 - δ = {1 - plan['delta']:g}. "
        f"{minutes:.1f} min on {machine['cores']} cores ({machine['cpu']}, load average {machine['load_min']:.1f} to "
        f"{machine['load_max']:.1f}), {machine['date']}; the towers' pretraining and features took "
        f"{record['features']['seconds']:.0f} s"
        + (" (in an earlier run of this plan: cached)." if record["features"]["cached"] else "."),
        "",
        "## Before: the thresholds of the training family's validation split",
        "",
        "| thresholds | " + " | ".join(levels) + " |",
        "|---|" + "---|" * len(levels),
        "| guaranteed, on the training family's test split (in domain) | "
        + " | ".join(_cell(record["in_domain"][p]) for p in levels)
        + " |",
    ]
    for kind in ("guaranteed", "estimated"):
        lines.append(
            f"| {kind}, on the served family | " + " | ".join(_cell(record["before"][kind][p]) for p in levels) + " |"
        )
    lines += [
        "",
        f"Relevant items per query assumed by the validation calibration: {before['relevant_per_query_assumed']:.2f}; "
        f"served: {before['relevant_per_query_served']:.2f}.",
        "",
        "## After `ce-retrieval calibrate` on n labelled served queries",
        "",
        "Per n, over random draws of the labelled queries; promises checked on the served queries not drawn. "
        "Cells: share of draws certifying the level, mean precision served (minimum), mean recall.",
        "",
        "| n | thresholds | every promise kept | " + " | ".join(levels) + " |",
        "|---|---|---|" + "---|" * len(levels),
    ]
    for n, s in record["sizes"].items():
        for kind in ("guaranteed", "estimated"):
            cells = []
            for p in levels:
                c = s[kind]["levels"][p]
                if c["precision_mean"] is None:
                    cells.append(f"{c['certified']:.2f}")
                else:
                    cells.append(
                        f"{c['certified']:.2f}: prec {c['precision_mean']:.3f} ({c['precision_min']:.3f}), "
                        f"rec {c['recall_mean']:.3f}"
                    )
            lines.append(f"| {n} | {kind} | {s[kind]['all_kept']:.2f} of {s['draws']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The guarantee: every promise kept in at least 1 - δ of the draws (up to the held-out queries' own "
        "sampling noise); the point estimate fitted on the same labels makes no such promise.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/recalibration")
    parser.add_argument("--results", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--quick", action="store_true", help="tiny families and model, one size, 3 draws")
    parser.add_argument("--train_family", choices=FAMILIES, default=None)
    parser.add_argument("--served_family", choices=FAMILIES, default=None)
    parser.add_argument("--relevance", choices=("own", "fits"), default=None)
    parser.add_argument("--resamples", type=int, default=None)
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--levels", type=float, nargs="*", default=None, help="precision levels to promise")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    changes = {
        "train_family": args.train_family,
        "served_family": args.served_family,
        "relevance": args.relevance,
        "resamples": args.resamples,
        "sizes": tuple(args.sizes) if args.sizes else None,
        "levels": tuple(args.levels) if args.levels else None,
    }
    plan = dataclasses.replace(plan, **{k: v for k, v in changes.items() if v is not None})
    start, loads = time.perf_counter(), []
    sampler = LoadSampler(loads)
    sampler.start()
    try:
        record = run(plan, args.out)
    finally:
        sampler.stop.set()
    minutes = (time.perf_counter() - start) / 60
    record["machine"] = machine_info(loads)
    record["minutes"] = minutes
    name = f"recalibration_{plan.train_family}_to_{plan.served_family}"
    write_record(args.results, name, record, report(record, minutes, record["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The main job (``ce-retrieval demo``, README's first command): train → evaluate → export → index → query.

On the embedded synthetic dataset by default, a few minutes on a CPU. Each stage is the same code path the
individual commands use (``train``, ``evaluate``, ``export``, ``index``, ``query``); this module only wires
them into one run under ``--workdir``:

    <workdir>/model/     trained model_dir (config.yaml, checkpoints/, logs/; resumes if interrupted)
    <workdir>/eval/      eval_test.json + PNG plots (PR curve, score distributions, retrieval sheet)
    <workdir>/export/    text_encoder/<v>/, image_encoder/<v>/ SavedModels + index/<v>/ (ScaNN + manifest)
"""
from __future__ import annotations

import os
import time

DEFAULT_QUERIES = 4


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="synthetic_demo", help="YAML file or built-in config name")
    parser.add_argument("--workdir", default="runs/demo", help="where the model, evaluation and export go")
    parser.add_argument("--params_override", action="append", default=[], help="config overrides (see `train`)")
    parser.add_argument("--retrain", action="store_true", help="train again even if workdir/model is complete")
    parser.add_argument("--queries", nargs="*", default=None, help="captions to search for (default: test captions)")


def run(args) -> int:
    import numpy as np

    from ce_retrieval import configs, data
    from ce_retrieval.evaluation.calibration import global_pr_auc
    from ce_retrieval.evaluation.embed import embed_split, embed_strings
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.serving.export import export_encoders
    from ce_retrieval.serving.index import build_index
    from ce_retrieval.serving.searcher import Searcher
    from ce_retrieval.training import load_trained, train
    from ce_retrieval.training.cli import resolve_config

    t0 = time.perf_counter()
    workdir = os.path.abspath(args.workdir)
    model_dir, eval_dir, export_dir = (os.path.join(workdir, p) for p in ("model", "eval", "export"))
    cfg = configs.load_experiment(resolve_config(args.config), args.params_override)

    _stage(1, "train", f"{cfg.name}: {cfg.loss.name} on the {cfg.data.name} dataset -> {model_dir}")
    if args.retrain or not os.path.exists(os.path.join(model_dir, "train_summary.json")):
        train(cfg, model_dir)
    else:
        print("[demo] model already trained (use --retrain to train again)")
    cfg, model = load_trained(model_dir)

    _stage(2, "evaluate", f"test split, {cfg.evaluation.distractors} distractors -> {eval_dir}")
    test = data.load_retrieval_split(cfg.data, "test")
    distractors = None
    if cfg.evaluation.distractors:
        from ce_retrieval.data.synthetic import distractor_images

        distractors = distractor_images(cfg.evaluation.distractors, seed=cfg.data.seed + 7919, image_size=cfg.data.image_size)
    report = evaluate_model(
        model.text_encoder, model.image_encoder, test, distractor_images=distractors, output_dir=eval_dir,
        run_name=cfg.loss.name, config=configs.to_dict(cfg), batch_size=cfg.evaluation.batch_size,
    )
    _print_metrics(report)

    _stage(3, "export", f"SavedModels for TF Serving -> {export_dir}")
    paths = export_encoders(
        model.text_encoder, model.image_encoder, export_dir,
        metadata={"config": configs.to_dict(cfg), "checkpoint": getattr(model, "checkpoint_path", None)},
        logit_scale=float(cfg.model.logit_scale),
    )
    print(f"[demo] exported version {paths.version}: {paths.text_encoder}, {paths.image_encoder}")

    _stage(4, "index", "ScaNN index of the test gallery, thresholds calibrated on the validation split")
    val = data.load_retrieval_split(cfg.data, cfg.evaluation.split)
    val_q, val_d, val_qids, val_dids = embed_split(model.text_encoder, model.image_encoder, val)
    calibration = global_pr_auc(val_q, val_d, val_qids, val_dids)
    gallery, gallery_ids = embed_strings(model.image_encoder, test.images), test.image_ids
    manifest = build_index(gallery, gallery_ids, export_dir, version=paths.version, thresholds=calibration,
                           queries=val_q, gallery_info={"split": "test"})
    print(f"[demo] index: {manifest.get('num_items', len(gallery_ids))} images, "
          f"thresholds {manifest.get('thresholds')}, ANN recall@10 {manifest.get('ann_recall_at_10')}")

    _stage(5, "query", "the exported artefacts behind the HTTP retrieval service (POST /search on 127.0.0.1)")
    import httpx

    from ce_retrieval.serving.service import create_app, serve_in_thread

    captions = args.queries or _sample_captions(test, DEFAULT_QUERIES, cfg.data.seed)
    truth = {c: int(i) for c, i in zip(test.captions, test.caption_ids, strict=True)}
    with serve_in_thread(create_app(export_dir)) as url:
        print(f"[demo] service up at {url}: GET /healthz -> {httpx.get(url + '/healthz', timeout=30).status_code}")
        reply = httpx.post(url + "/search", json={"texts": captions, "k": 5}, timeout=120)
        reply.raise_for_status()
        for item in reply.json()["results"]:
            text = item["text"]
            print(f'\n  "{text}"' + (f"  (true image {truth[text]})" if text in truth else ""))
            for rank, hit in enumerate(item["hits"], 1):
                mark = " <- true image" if truth.get(text) == hit["id"] else ""
                level = f", precision>={hit['precision_level']:g}" if hit.get("precision_level") is not None else ""
                print(f"    {rank}. image {hit['id']:>10d}  score {hit['score']:.3f}{level}{mark}")
        thresholds = Searcher.load(export_dir).thresholds
        levels = sorted(thresholds)
        if levels:
            reply = httpx.post(url + "/search", json={"texts": captions, "precision": levels[-1]}, timeout=120)
            reply.raise_for_status()
            counts = [r["num_hits"] for r in reply.json()["results"]]
            print(f"\n[demo] threshold relevancy: every image above the score calibrated for precision {levels[-1]:g} "
                  f"(tau = {thresholds[levels[-1]]:.3f}): hits per query {counts}")
        else:
            print("\n[demo] no precision level was reached on the validation split, so no calibrated threshold exists")
    print(f"\n[demo] done in {time.perf_counter() - t0:.0f} s. Artefacts under {workdir}")
    return 0 if np.isfinite(report["summary"]["pr_auc"]) else 1


def _stage(i: int, name: str, what: str) -> None:
    print(f"\n=== [{i}/5] {name}: {what}", flush=True)


def _sample_captions(split, n: int, seed: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    picks = rng.choice(len(split.captions), size=min(n, len(split.captions)), replace=False)
    return [split.captions[i] for i in sorted(picks)]


def _print_metrics(report: dict) -> None:
    m = report["summary"]
    print(f"[demo] threshold relevancy: global PR-AUC {m['pr_auc']:.4f}, AP {m['average_precision']:.4f}, best F1 {m['best_f1']:.4f}")
    print(f"[demo] top-k relevancy: text->image R@1/5/10 {m['t2i_r1']:.3f}/{m['t2i_r5']:.3f}/{m['t2i_r10']:.3f}, "
          f"image->text R@1/5/10 {m['i2t_r1']:.3f}/{m['i2t_r5']:.3f}/{m['i2t_r10']:.3f}, rsum {m['rsum']:.3f}")
    if "dis_t2i_r1" in m:
        print(f"[demo] with {report['num_distractors']} distractors: R@1/5/10/100 {m['dis_t2i_r1']:.3f}/{m['dis_t2i_r5']:.3f}/"
              f"{m['dis_t2i_r10']:.3f}/{m['dis_t2i_r100']:.3f}")
    print(f"[demo] plots: {', '.join(report['files'].values())}")

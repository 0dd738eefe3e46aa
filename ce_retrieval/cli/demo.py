"""The main job (``ce-retrieval demo``, README's first command): train → evaluate → export → index → query.

On the embedded synthetic dataset by default, a few minutes on a CPU. Each stage is the same code path the
individual commands use (``train``, ``evaluate``, ``export``, ``index``, ``query``); this module only wires
them into one run under ``--workdir``. Besides the configured model (Cross-Example Softmax by default) it trains
baselines the same way (``--baseline``; Sampled Softmax, SigLIP's sigmoid loss and symmetric InfoNCE by default:
same config, seed, data and steps; only the loss and its temperature differ: each softmax at the λ chosen for it on
the validation split (``benchmarks/results/demo_scale.md``, ``demo_scale_infonce.md``), SigLIP learning its own t
and b from t = 10 and the b chosen there, -5 (``demo_scale_siglip.md``)) and
ends the evaluation with all of them side by side: global PR-AUC, recall, the precision that thresholds calibrated
on the validation split actually achieve on the test split and the recall at guaranteed precision.

    <workdir>/model/            trained model_dir (config.yaml, checkpoints/, logs/; resumes if interrupted)
    <workdir>/baseline/model/   the first baseline, trained the same way (others: baseline_<loss>/model/)
    <workdir>/eval/             eval_test.json (+ baseline/eval_test.json, ...), PNG plots (PR curves, score
                                distributions, reliability, retrieval sheet) and calibration_side_by_side.png
    <workdir>/export/           text_encoder/<v>/, image_encoder/<v>/ SavedModels + index/<v>/ (ScaNN + manifest)
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

__all__ = ["add_arguments", "run"]

DEFAULT_QUERIES = 4
DEFAULT_BASELINES = "SampledSoftmax@20,SigmoidLoss@b=-5,SymmetricInfoNCE@5"


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="synthetic_demo", help="YAML file or built-in config name")
    parser.add_argument("--workdir", default="runs/demo", help="where the model, evaluation and export go")
    parser.add_argument("--params_override", action="append", default=[], help="config overrides (see `train`)")
    parser.add_argument("--retrain", action="store_true", help="train again even if workdir/model is complete")
    parser.add_argument("--queries", nargs="*", default=None, help="captions to search for (default: test captions)")
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINES,
        help="comma-separated losses of the comparison models trained the same way, each optionally at its own λ "
        "('SampledSoftmax@10'; without @, model.logit_scale) and, for SigLIP, its initial bias ('SigmoidLoss@b=-5'); "
        "'none' skips them. Default: Sampled Softmax at λ 20, SigLIP (t and b learned, b from -5) and symmetric "
        "InfoNCE at λ 5, each chosen on the validation split for the synthetic demo with its image warm-up: the best "
        "mean score among the settings whose R@1 spreads by at most 10 points over 5 seeds "
        "(benchmarks/results/demo_scale_warmup_goal.md)",
    )


def run(args) -> int:
    import numpy as np

    from ce_retrieval import configs
    from ce_retrieval.cli import demo_record
    from ce_retrieval.cli.train import resolve_config
    from ce_retrieval.training import load_trained

    t0 = time.perf_counter()
    workdir = os.path.abspath(args.workdir)
    model_dir, eval_dir, export_dir = (os.path.join(workdir, p) for p in ("model", "eval", "export"))
    cfg = configs.load_experiment(resolve_config(args.config), args.params_override)

    baselines = parse_baselines(args.baseline, cfg.loss.name)
    stages = 5 + len(baselines)
    what = f"{cfg.name}: {cfg.loss.name} (λ {cfg.model.logit_scale:g}) on the {cfg.data.name} dataset -> {model_dir}"
    _stage(1, stages, "train", what)
    _train_once(cfg, model_dir, args.retrain)
    base_cfgs = {}
    for i, (name, scale, bias) in enumerate(baselines):
        base_dir = os.path.join(workdir, baseline_dir(i, name), "model")
        base_cfgs[name] = baseline_config(cfg, name, scale, bias)
        at = "" if scale is None else f" at λ {scale:g}"
        at += "" if bias is None else f" from b = {bias:g}"
        what = f"{name}{at}, the same model, data, seed and steps -> {base_dir}"
        _stage(2 + i, stages, "train the baseline", what)
        _train_once(base_cfgs[name], base_dir, args.retrain)
    cfg, model = load_trained(model_dir)

    step = 2 + len(baselines)
    _stage(
        step,
        stages,
        "evaluate",
        f"test split, {cfg.evaluation.distractors} distractors, "
        f"thresholds calibrated on {cfg.evaluation.split} -> {eval_dir}",
    )
    test, val, reports = evaluate(cfg, model, base_cfgs, workdir, eval_dir)
    report = reports[cfg.loss.name]

    _stage(step + 1, stages, "export", f"SavedModels for TF Serving -> {export_dir}")
    paths = export_trained(cfg, model, export_dir)
    print(f"[demo] exported version {paths.version}: {paths.text_encoder}, {paths.image_encoder}")

    _stage(step + 2, stages, "index", "ScaNN index of the test gallery, thresholds calibrated on the validation split")
    index_test_gallery(model, test, val, report, export_dir, paths.version)

    _stage(
        step + 3,
        stages,
        "query",
        "the exported artefacts behind the HTTP retrieval service (POST /search on 127.0.0.1)",
    )
    query_service(export_dir, test, args.queries or _sample_captions(test, DEFAULT_QUERIES, cfg.data.seed))
    demo_record.write(workdir, cfg, reports, time.perf_counter() - t0)  # record.json/.md + the range over seeds
    print(f"\n[demo] done in {time.perf_counter() - t0:.0f} s. Artefacts under {workdir}")
    return 0 if np.isfinite(report["summary"]["pr_auc"]) else 1


def parse_baselines(spec: str, configured: str) -> list[tuple[str, float | None, float | None]]:
    """The baselines of ``--baseline`` ("A,B@10,SigmoidLoss@b=-5" or "none") as (loss, λ or None, initial bias or
    None), less the configured loss itself, in order. After ``@``, parts separated by ``/``: a number trains that
    baseline at its own λ (``model.logit_scale``), e.g. at the λ chosen for it on the validation split; ``b=B``
    starts a loss with a learned bias (SigLIP) at b = B. Without them the baseline keeps the configured model's λ
    (SigLIP: its own t and b)."""
    from ce_retrieval import losses

    if str(spec).strip().lower() == "none":
        return []
    out: dict[str, tuple[float | None, float | None]] = {}
    for item in (n.strip() for n in str(spec).split(",")):
        if not item:
            continue
        name, _, rest = (part.strip() for part in item.partition("@"))
        if not name:
            raise ValueError(f"--baseline {spec!r}: an entry has no loss name before '@'")
        scale = bias = None
        for part in (x.strip() for x in rest.split("/") if x.strip()):
            key, _, text = part.rpartition("=")
            what = {"": "λ", "b": "the initial bias b"}.get(key.strip())
            if what is None:
                raise ValueError(f"--baseline {item!r}: {part!r} is neither λ (a number) nor b=<number>")
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"--baseline {item!r}: {what} after '@' must be a number, got {text!r}") from None
            if not math.isfinite(value) or (what == "λ" and value <= 0):
                raise ValueError(f"--baseline {item!r}: {what} must be a {'positive ' * (what == 'λ')}finite number")
            if what == "λ":
                scale = value
            elif not losses.lookup(name).has_logit_bias:
                raise ValueError(f"--baseline {item!r}: {name} has no logit bias to start at b={text}")
            else:
                bias = value
        if name != configured:
            out.setdefault(name, (scale, bias))
    return [(name, scale, bias) for name, (scale, bias) in out.items()]


def baseline_dir(i: int, name: str) -> str:
    """``baseline`` for the first baseline (the layout before there were several), ``baseline_<loss>`` after."""
    return "baseline" if i == 0 else f"baseline_{name}"


def baseline_config(cfg, baseline: str, scale: float | None = None, bias: float | None = None):
    """The baseline's experiment: ``cfg`` with the loss replaced; its hyper-parameters are the baseline's
    defaults, and λ is ``scale`` when given (its own, e.g. chosen on the validation split), else
    model.logit_scale (a loss with a learned bias, SigLIP, starts from its own t and b, or from b = ``bias``)."""
    from ce_retrieval.configs.experiment import LossConfig

    model = _baseline_model(cfg.model, baseline)
    if scale is not None:
        model = dataclasses.replace(model, logit_scale=float(scale))
    if bias is not None:
        model = dataclasses.replace(model, logit_bias=float(bias))
    return dataclasses.replace(cfg, loss=LossConfig(name=baseline), model=model)


def evaluate(cfg, model, base_cfgs: dict, workdir: str, eval_dir: str):
    """The evaluation stage: every trained model on the test split (thresholds calibrated on the validation
    split), metrics printed, and with a baseline the side-by-side comparison. Returns (test, val, the reports by
    loss name: the configured model's first, then the baseline's)."""
    from ce_retrieval import configs, data
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.training import load_trained

    test = data.load_retrieval_split(cfg.data, "test")
    val = data.load_retrieval_split(cfg.data, cfg.evaluation.split)
    distractors = None
    if cfg.evaluation.distractors:
        from ce_retrieval.data.synthetic import distractor_images

        distractors = distractor_images(
            cfg.evaluation.distractors, seed=cfg.data.seed + 7919, image_size=cfg.data.image_size
        )
    runs = {cfg.loss.name: (model, cfg, eval_dir)}
    for i, (name, base_cfg) in enumerate(base_cfgs.items()):
        _, base_model = load_trained(os.path.join(workdir, baseline_dir(i, name), "model"))
        runs[name] = (base_model, base_cfg, os.path.join(eval_dir, baseline_dir(i, name)))
    reports = {
        name: evaluate_model(
            m.text_encoder,
            m.image_encoder,
            test,
            distractor_images=distractors,
            output_dir=out,
            run_name=name,
            config=configs.to_dict(run_cfg),
            batch_size=cfg.evaluation.batch_size,
            calibration_split=val,
            precision_levels=cfg.evaluation.precision_levels,
            delta=cfg.evaluation.delta,
        )
        for name, (m, run_cfg, out) in runs.items()
    }
    report = reports[cfg.loss.name]
    _print_metrics(report)
    if base_cfgs:
        side_by_side(reports, {name: m for name, (m, _, _) in runs.items()}, test, eval_dir)
    return test, val, reports


def index_test_gallery(model, test, val, report: dict, export_dir: str, version: int) -> dict:
    """The index stage: the test images embedded with the trained image tower, indexed next to export
    ``version``, with the calibration the evaluation made on the validation split (``report``'s
    ``calibration_split.split_calibration``: guaranteed and estimated thresholds and the P(relevant) map, derived
    by the index for its own gallery size)."""
    from ce_retrieval.build.index import build_index
    from ce_retrieval.evaluation.embed import embed_split, embed_strings
    from ce_retrieval.evaluation.split_calibration import Calibration

    calibration = Calibration.from_json(report["calibration_split"]["split_calibration"])
    val_q = embed_split(model.text_encoder, model.image_encoder, val)[0]
    gallery, gallery_ids = embed_strings(model.image_encoder, test.images), test.image_ids
    manifest = build_index(
        gallery,
        gallery_ids,
        export_dir,
        version=version,
        calibration=calibration,
        queries=val_q,
        gallery_info={"split": "test"},
    )
    print(index_line(manifest))
    return manifest


def index_line(manifest: dict) -> str:
    """What the index stage prints: size, the ANN recall@10 measured at build time (``manifest["ann"]
    ["recall_at_10"]``) and per precision level the guaranteed threshold (or that it is refused) and the estimate
    (not the probability map's knots)."""
    block = manifest.get("thresholds") or {}
    estimated = block.get("threshold_at_precision") or {}
    promise = block.get("guaranteed") or {}
    recall = (manifest.get("ann") or {}).get("recall_at_10")
    head = (
        f"[demo] index: {manifest.get('num_items')} images ({manifest.get('kind')}), "
        f"ANN recall@10 {'-' if recall is None else f'{recall:.3f}'}"
    )
    if not promise:
        levels = ", ".join(f"{k} -> {t:.3f}" for k, t in sorted(estimated.items(), key=lambda kv: float(kv[0])))
        return head + f", thresholds per precision (estimates) {{{levels or 'none reached'}}}"
    lines = [head + f"; thresholds per precision, guaranteed with confidence {promise['confidence']:g}:"]
    for level, entry in sorted(promise["levels"].items(), key=lambda kv: float(kv[0])):
        est = estimated.get(level)
        est_text = f"estimate {est:.3f}" if est is not None else "no estimate"
        if entry.get("threshold") is None:
            best = entry.get("best_precision_lower_bound", 0.0)
            lines.append(f"  {level}: refused (certified at most {best:.2f} on this gallery); {est_text}")
        else:
            lines.append(
                f"  {level}: {entry['threshold']:.3f} (precision >= {entry['precision_lower_bound']:.2f}); {est_text}"
            )
    return "\n".join(lines)


def query_service(export_dir: str, test, captions: list[str]) -> None:
    """The query stage: the export behind the HTTP service; top-5 per caption, then every calibrated precision
    level's threshold search, each hit marked when it is the caption's true image."""
    import httpx

    from ce_retrieval.serve.searcher import Searcher
    from ce_retrieval.serve.service import create_app, serve_in_thread

    truth = {c: int(i) for c, i in zip(test.captions, test.caption_ids, strict=True)}
    with serve_in_thread(create_app(export_dir)) as url:
        print(f"[demo] service up at {url}: GET /healthz -> {httpx.get(url + '/healthz', timeout=30).status_code}")
        reply = httpx.post(url + "/search", json={"texts": captions, "k": 5}, timeout=120)
        reply.raise_for_status()
        for item in reply.json()["results"]:
            _print_hits(item, truth)
        searcher = Searcher.load(export_dir)
        if not searcher.offered_precisions:
            print("\n[demo] the index has no calibrated precision levels")
            return
        print(
            "\n[demo] threshold relevancy: every image above the threshold guaranteed for a precision level "
            "(with the index's confidence), or, where refused, the point estimate"
        )
        for level in searcher.offered_precisions:
            guaranteed = searcher.guaranteed_thresholds.get(level) is not None
            reply = httpx.post(
                url + "/search", json={"texts": captions, "precision": level, "guarantee": guaranteed}, timeout=120
            )
            if reply.status_code == 422:  # not even an estimate reaches this level
                print(f"  precision {level:g}: {reply.json()['error']}")
                continue
            reply.raise_for_status()
            body = reply.json()
            counts = [r["num_hits"] for r in body["results"]]
            found = sum(truth.get(r["text"]) in {h["id"] for h in r["hits"]} for r in body["results"])
            kind = "guaranteed" if guaranteed else "refused; estimate"
            print(
                f"  precision {level:g} ({kind}, tau = {body['threshold']:.3f}): images returned per query {counts}, "
                f"true image among them for {found} of {len(counts)} queries"
            )


def _print_hits(item: dict, truth: dict) -> None:
    text = item["text"]
    print(f'\n  "{text}"' + (f"  (true image {truth[text]})" if text in truth else ""))
    for rank, hit in enumerate(item["hits"], 1):
        mark = " <- true image" if truth.get(text) == hit["id"] else ""
        level = f", precision>={hit['precision_level']:g}" if hit.get("precision_level") is not None else ""
        print(f"    {rank}. image {hit['id']:>10d}  score {hit['score']:.3f}{level}{mark}")


def export_trained(cfg, model, export_dir: str):
    """The demo's export stage: the towers with the model's own (learned) λ, as ``ce-retrieval export`` writes
    them (:func:`ce_retrieval.build.export.export_model`), never the configured initial ``cfg.model.logit_scale``."""
    from ce_retrieval import configs
    from ce_retrieval.build.export import export_model

    metadata = {"config": configs.to_dict(cfg), "checkpoint": getattr(model, "checkpoint_path", None)}
    return export_model(model, export_dir, metadata=metadata)


def _baseline_model(model_cfg, baseline: str):
    """The model config of the baseline: the same, less a logit bias its loss does not have (a SigLIP run's
    ``model.logit_bias`` belongs to the sigmoid loss; a softmax baseline refuses it); a loss with a bias (SigLIP)
    that the configured model lacks gets SigLIP's learned form, starting at SigLIP's t and b
    (``losses.sigmoid.SIGLIP_SCALE``, ``SIGLIP_BIAS``)."""
    from ce_retrieval import losses
    from ce_retrieval.losses.sigmoid import SIGLIP_BIAS, SIGLIP_SCALE

    if losses.lookup(baseline).has_logit_bias:
        if model_cfg.logit_bias is not None:
            return model_cfg
        return dataclasses.replace(
            model_cfg, logit_scale=SIGLIP_SCALE, learn_logit_scale=True, logit_bias=SIGLIP_BIAS, learn_logit_bias=True
        )
    return dataclasses.replace(model_cfg, logit_bias=None, learn_logit_bias=False)


def _stage(i: int, total: int, name: str, what: str) -> None:
    print(f"\n=== [{i}/{total}] {name}: {what}", flush=True)


def _train_once(cfg, model_dir: str, retrain: bool) -> None:
    """Trains ``cfg`` into ``model_dir``, or reuses the model a finished run left there, only if it was trained with
    this very config: a model of another config (other overrides, or defaults changed since) is refused with the
    keys that differ, never reused silently."""
    from ce_retrieval.training import train
    from ce_retrieval.training.config_changes import config_changes

    if retrain or not os.path.exists(os.path.join(model_dir, "train_summary.json")):
        train(cfg, model_dir)
        return
    changed = config_changes(cfg, os.path.join(model_dir, "config.yaml"))
    if changed:
        raise SystemExit(
            f"[demo] {model_dir} holds a model trained with another config ({'; '.join(changed)}): "
            "pass --retrain to train it again, or another --workdir"
        )
    print(f"[demo] {model_dir}: already trained with this config (use --retrain to train again)")


def _fmt(value, pct: bool | str = True) -> str:
    """``pct``: True prints a fraction as a percentage, False with three decimals, "count" as a whole number."""
    if value is None:
        return "-"
    if pct == "count":
        return f"{int(value):,}"
    return f"{100 * value:.1f}" if pct else f"{value:.3f}"


# (label, summary key, format: True percentage, False three decimals, "count" a whole number)
SIDE_BY_SIDE_ROWS = [
    ("global PR-AUC (%)", "pr_auc", True),
    ("text->image R@1 (%)", "t2i_r1", True),
    ("text->image R@10 (%)", "t2i_r10", True),
    ("image->text R@1 (%)", "i2t_r1", True),
    ("precision at the val threshold for 0.5 (%)", "achieved_precision_0.5", True),
    ("  recall at that threshold (%)", "achieved_recall_0.5", True),
    ("precision at the val threshold for 0.8 (%)", "achieved_precision_0.8", True),
    ("precision at the val threshold for 0.9 (%)", "achieved_precision_0.9", True),
    ("recall at guaranteed precision 0.5 (%)", "guaranteed_recall_0.5", True),
    ("  precision achieved there (%)", "guaranteed_precision_0.5", True),
    ("recall at guaranteed precision 0.8 (%)", "guaranteed_recall_0.8", True),
    ("  precision achieved there (%)", "guaranteed_precision_0.8", True),
    ("recall at guaranteed precision 0.9 (%)", "guaranteed_recall_0.9", True),
    ("  precision achieved there (%)", "guaranteed_precision_0.9", True),
    ("mean |achieved - promised| (points)", "mean_calibration_error", True),
    ("relative spread of per-query thresholds", "relative_threshold_spread", False),
    ("P(relevant | score) map: Brier skill (%)", "probability_brier_skill", True),
    ("  log-loss skill (%)", "probability_log_loss_skill", True),
    ("  pairs predicted >= 0.5", "probability_pairs_ge_0.5", "count"),
    ("    precision observed there (%)", "probability_precision_ge_0.5", True),
    ("  pairs predicted >= 0.9", "probability_pairs_ge_0.9", "count"),
    ("    precision observed there (%)", "probability_precision_ge_0.9", True),
    ("  per-query error where p >= 0.1 (points)", "probability_query_error", True),
    ("    a calibrated map's (noise floor)", "probability_query_error_floor", True),
]


def side_by_side_lines(reports: dict) -> list[str]:
    """The side-by-side table: one row per figure of :data:`SIDE_BY_SIDE_ROWS`, one column per run."""
    names = list(reports)
    width = max(len(r[0]) for r in SIDE_BY_SIDE_ROWS)
    lines = ["  " + " " * width + "".join(f"{n:>28s}" for n in names)]
    for label, key, pct in SIDE_BY_SIDE_ROWS:
        cells = "".join(f"{_fmt(reports[n]['summary'].get(key), pct):>28s}" for n in names)
        lines.append("  " + label.ljust(width) + cells)
    return lines


def side_by_side(reports: dict, models: dict, test, eval_dir: str) -> str:
    """Prints the runs' calibration and recall next to each other and writes ``calibration_side_by_side.png``."""
    from ce_retrieval.evaluation.embed import embed_split
    from ce_retrieval.evaluation.plots import plot_score_separation, pooled_pair_scores

    names = list(reports)
    print("\n[demo] calibration, side by side (test split; thresholds and P(relevant) map fitted on validation):")
    print("\n".join(side_by_side_lines(reports)))
    for n in names:
        transfer = reports[n]["metrics"].get("transfer") or {}
        levels = transfer.get("levels") or {}
        reached = sum(v is not None for v in levels.values())
        print(f"  {n}: {reached} of {len(levels)} precision levels (0.05 ... 0.95) reachable on validation")
    runs = {}
    for n in names:
        q, d, qi, di = embed_split(models[n].text_encoder, models[n].image_encoder, test)
        pos, neg = pooled_pair_scores(q, d, qi, di)
        s = reports[n]["summary"]
        thr = (reports[n].get("calibration_split") or {}).get("threshold_at_precision") or {}
        runs[n] = {
            "positives": pos,
            "negatives": neg,
            "thresholds": {k: thr.get(k) for k in ("0.5", "0.9")},
            "note": f"PR-AUC {_fmt(s['pr_auc'])}%, R@1 {_fmt(s['t2i_r1'])}%",
        }
    path = plot_score_separation(
        runs,
        os.path.join(eval_dir, "calibration_side_by_side.png"),
        title="Test split: every caption x image pair, relevant vs irrelevant",
    )
    print(f"[demo] side-by-side plot: {path}")
    return path


def _sample_captions(split, n: int, seed: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    picks = rng.choice(len(split.captions), size=min(n, len(split.captions)), replace=False)
    return [split.captions[i] for i in sorted(picks)]


def _print_metrics(report: dict) -> None:
    m = report["summary"]
    print(
        f"[demo] threshold relevancy: global PR-AUC {m['pr_auc']:.4f}, AP {m['average_precision']:.4f}, "
        f"best F1 {m['best_f1']:.4f}"
    )
    print(
        f"[demo] top-k relevancy: text->image R@1/5/10 {m['t2i_r1']:.3f}/{m['t2i_r5']:.3f}/{m['t2i_r10']:.3f}, "
        f"image->text R@1/5/10 {m['i2t_r1']:.3f}/{m['i2t_r5']:.3f}/{m['i2t_r10']:.3f}, rsum {m['rsum']:.3f}"
    )
    if "dis_t2i_r1" in m:
        print(
            f"[demo] with {report['num_distractors']} distractors: "
            f"R@1/5/10/100 {m['dis_t2i_r1']:.3f}/{m['dis_t2i_r5']:.3f}/"
            f"{m['dis_t2i_r10']:.3f}/{m['dis_t2i_r100']:.3f}"
        )
    print(f"[demo] plots: {', '.join(report['files'].values())}")

"""The paper's Table 1 and Figure 4, reproduced small on the embedded synthetic dataset.

Trains the six objectives of Veit & Wilber (2020) — Sampled Softmax, Stochastic Negative Mining, L-Softmax,
A-Softmax, Cross-Example Softmax and Cross-Example Negative Mining — with the same two-tower model, data, optimizers
and step budget, several seeds each, evaluates every run on the synthetic test split (global PR-AUC, Recall@1/5/10,
and Recall@1/5/10/100 with distractor images relevant to no caption), and writes the Table 1 analogue (mean ± std
over seeds) and the Figure 4 plots (PR curves; score distributions of Sampled vs Cross-Example Softmax).

    python benchmarks/paper_tables.py --out runs/paper_tables --seeds 3          # the full run (see BENCHMARKS.md)
    python benchmarks/paper_tables.py --out /tmp/pt --seeds 1 --params_override train.epochs=1   # a smoke run

Every run uses ``configs/synthetic_demo.yaml`` plus ``--params_override``; only ``loss`` and ``train.seed`` vary.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)

PAPER_LOSSES = {
    "SampledSoftmax": {"scale": 20.0},
    "StochasticNegativeMining": {"scale": 20.0, "negative_fraction": 0.5},
    "LargeMarginSoftmax": {"scale": 20.0},
    "AngularSoftmax": {"scale": 20.0},
    "CrossExampleSoftmax": {"scale": 20.0},
    "CrossExampleNegativeMining": {"scale": 20.0, "negative_fraction": 0.5},
}


def run_one(loss: str, kwargs: dict, seed: int, args) -> str:
    from ce_retrieval import configs, data
    from ce_retrieval.data.synthetic import distractor_images
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.training import load_trained, train
    from ce_retrieval.training.cli import resolve_config

    run_dir = os.path.join(args.out, "runs", f"{loss}-seed{seed}")
    result = os.path.join(run_dir, "eval", "eval_test.json")
    if os.path.exists(result) and not args.rerun:
        return result
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        *args.params_override,
        f"train.seed={seed},train.verbose=0,evaluation.every_n_epochs=0",
        {"loss": {"name": loss, "kwargs": kwargs}},
    ]
    cfg = configs.load_experiment(resolve_config(args.config), [o for o in overrides if isinstance(o, str)])
    cfg = configs.merge(cfg, overrides[-1])
    t0 = time.perf_counter()
    train(cfg, os.path.join(run_dir, "model"), print_fn=None)
    _, model = load_trained(os.path.join(run_dir, "model"), which="latest")
    test = data.load_retrieval_split(cfg.data, "test")
    distractors = distractor_images(args.distractors, seed=cfg.data.seed + 7919, image_size=cfg.data.image_size)
    evaluate_model(model.text_encoder, model.image_encoder, test, distractor_images=distractors,
                   output_dir=os.path.join(run_dir, "eval"), run_name=loss, config=configs.to_dict(cfg),
                   plots=(seed == args.seeds_list[0]))
    print(f"[paper_tables] {loss} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/paper_tables")
    parser.add_argument("--config", default="synthetic_demo")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--losses", nargs="*", default=list(PAPER_LOSSES))
    parser.add_argument("--distractors", type=int, default=2000)
    parser.add_argument("--params_override", action="append", default=[])
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the table (and plot paths) to this markdown file")
    args = parser.parse_args(argv)
    args.seeds_list = list(range(args.seeds))

    from ce_retrieval.evaluation.plots import plot_pr_curves
    from ce_retrieval.evaluation.report import format_markdown, format_table, load_results

    start = time.perf_counter()
    paths = [run_one(loss, PAPER_LOSSES[loss], seed, args) for loss in args.losses for seed in args.seeds_list]
    results = load_results(paths)
    print(format_table(results))
    first = {r["run_name"]: r for r in results if f"seed{args.seeds_list[0]}" in r.get("_path", "")}
    curves = {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if report["run_name"] not in curves:
            curves[report["run_name"]] = report["metrics"]["calibration"]["curve"]
    figure = plot_pr_curves(curves, os.path.join(args.out, "pr_curves.png"),
                            title="Synthetic test set: global PR over all caption x image pairs (seed 0)")
    minutes = (time.perf_counter() - start) / 60
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_markdown(results))
            f.write(f"\n\nPR curves: `{figure}`; per-run plots under `{args.out}/runs/*-seed0/eval/`.\n")
            f.write(f"Total time: {minutes:.1f} min.\n")
    print(f"[paper_tables] {len(paths)} runs in {minutes:.1f} min; PR curves {figure}; {len(first)} first-seed runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

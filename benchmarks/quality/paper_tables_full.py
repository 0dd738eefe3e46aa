"""``paper_tables.py --full``: the whole two-tower model trained end to end at the paper's settings (for a GPU).

Each of the six objectives trains the demo towers from scratch on the synthetic set with ``model.fit`` (the
project's trainer: both towers, two optimizers, distributed gather), global batch 512 and lambda = 20, then is
evaluated on the test split with thresholds calibrated on validation and 1,000 distractors. On 2 CPU cores a run
takes hours (BENCHMARKS.md gives the regime that converges there); on a GPU minutes.

    python -m benchmarks.quality.paper_tables --full --seeds 5 --steps 5000 --out runs/paper_tables_full
"""

from __future__ import annotations

import os
import shutil
import time


def run_one(loss: str, kwargs: dict, seed: int, steps: int, out: str, rerun: bool) -> str:
    from ce_retrieval import configs, data
    from ce_retrieval.cli.train import resolve_config
    from ce_retrieval.data.synthetic import distractor_images
    from ce_retrieval.evaluation.evaluate import evaluate_model
    from ce_retrieval.training import load_trained, train

    run_dir = os.path.join(out, "runs", f"{loss}-seed{seed}")
    result = os.path.join(run_dir, "eval", "eval_test.json")
    if os.path.exists(result) and not rerun:
        return result
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = configs.load_experiment(resolve_config("synthetic_demo"), [])
    per_epoch = min(steps, 500)
    cfg = configs.merge(
        cfg,
        {
            "data": {"num_train_images": 20000},
            "model": {"logit_scale": 20.0},
            "loss": {"name": loss, "kwargs": dict(kwargs)},
            "train": {
                "seed": seed,
                "verbose": 0,
                "batch_size": 512,
                "steps_per_epoch": per_epoch,
                "epochs": max(1, steps // per_epoch),
            },
            "evaluation": {"every_n_epochs": 0},
        },
    )
    t0 = time.perf_counter()
    train(cfg, os.path.join(run_dir, "model"), print_fn=None)
    _, model = load_trained(os.path.join(run_dir, "model"), which="latest")
    test = data.load_retrieval_split(cfg.data, "test")
    val = data.load_retrieval_split(cfg.data, "val")
    distractors = distractor_images(1000, seed=cfg.data.seed + 7919, image_size=cfg.data.image_size)
    evaluate_model(
        model.text_encoder,
        model.image_encoder,
        test,
        distractor_images=distractors,
        calibration_split=val,
        output_dir=os.path.join(run_dir, "eval"),
        run_name=loss,
        config=configs.to_dict(cfg),
        plots=seed == 0,
    )
    print(f"[paper_tables --full] {loss} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return result


def main(args) -> int:
    from benchmarks.common.records import write_markdown
    from benchmarks.quality.paper_tables import PAPER_LOSSES
    from ce_retrieval.evaluation.report import format_markdown, load_results

    args.losses = args.losses or list(PAPER_LOSSES)
    not_paper = [loss for loss in args.losses if loss not in PAPER_LOSSES]
    if not_paper or args.draws or args.scales:
        raise SystemExit(
            "--full trains the paper's six losses at λ 20 end to end; "
            + (f"{', '.join(not_paper)} and " if not_paper else "")
            + "feature draws and λ choice are the frozen-feature table's (drop --full)"
        )
    seeds = args.seeds or 5
    steps = args.steps or 5000
    paths = [
        run_one(loss, PAPER_LOSSES[loss], seed, steps, args.out, args.rerun)
        for loss in args.losses
        for seed in range(seeds)
    ]
    table = format_markdown(load_results(paths))
    write_markdown(args.out, "table", table + "\n")
    print(table)
    return 0

"""The main job's models in the coverage study of the guaranteed thresholds (#29 part 2: "on the demo and every
family of the calibration suite").

For every seed's workdir of ``demo_seeds.py`` (``<demo_runs>/seed<S>``: the demo's Cross-Example Softmax model and
its baselines, Sampled Softmax, SigLIP and symmetric InfoNCE), the trained towers embed the validation split, the
test split and ``--distractors`` more distractor images of the demo's generator (their own seed, never a test
image), and the arrays are saved as ``<out>/runs/demo/scenes/<objective>-seed<S>.npz`` in the layout of the
calibration suite's runs. ``guarantee_coverage.py`` then makes every promise the way the index makes it (on the
whole validation split and on resamples of 100 / 300 / 1,000 captions) and checks it on the test gallery as it is
and with 10x and 100x as many images (500 test images: 4,500 and 49,500 distractors):

    python -m benchmarks.quality.demo_seeds --seeds 0 1 2 3 4 --workdir runs/demo_seeds --out /tmp/demo_seeds
    python -m benchmarks.quality.demo_coverage --demo_runs runs/demo_seeds --out runs/demo_coverage
    python -m benchmarks.quality.guarantee_coverage --runs runs/demo_coverage --name guarantee_coverage_demo

A run's arrays are kept and reused (``--force`` embeds again).
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import numpy as np

#: the demo's models: (subfolder of a seed's workdir, the label the coverage tables use)
MODELS = (
    ("model", "CE"),
    ("baseline/model", "SS"),
    ("baseline_SigmoidLoss/model", "SigLIP"),
    ("baseline_SymmetricInfoNCE/model", "InfoNCE"),
)
DISTRACTOR_SEED = 104_729  # the demo's own distractors use data.seed + 7919; these are other images


def seed_dirs(demo_runs: str) -> list[str]:
    """The seed workdirs under ``demo_runs`` that hold every model of :data:`MODELS`, in seed order."""
    found = []
    for path in sorted(glob.glob(os.path.join(demo_runs, "seed*")), key=lambda p: int(p.rsplit("seed", 1)[1])):
        if all(os.path.exists(os.path.join(path, sub, "config.yaml")) for sub, _ in MODELS):
            found.append(path)
    return found


def embed_run(model_dir: str, distractors: list[bytes]) -> dict:
    """The arrays ``guarantee_coverage.run_checks`` reads, from one trained model: validation and test captions and
    images with their ids, and the distractor images (``promise_d``)."""
    from ce_retrieval import data
    from ce_retrieval.evaluation.embed import embed_split, embed_strings
    from ce_retrieval.training import load_trained

    cfg, model = load_trained(model_dir)
    split = lambda name: data.load_retrieval_split(cfg.data, name)  # noqa: E731
    val = embed_split(model.text_encoder, model.image_encoder, split(cfg.evaluation.split))
    test = embed_split(model.text_encoder, model.image_encoder, split("test"))
    arrays = dict(zip(("q", "d", "q_ids", "d_ids"), test, strict=True))
    arrays.update(zip(("val_q", "val_d", "val_q_ids", "val_d_ids"), val, strict=True))
    arrays["promise_d"] = embed_strings(model.image_encoder, distractors)
    return arrays


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo_runs", default="runs/demo_seeds", help="demo_seeds.py's --workdir")
    parser.add_argument("--out", default="runs/demo_coverage", help="where the arrays go (guarantee_coverage --runs)")
    parser.add_argument("--distractors", type=int, default=49_500, help="100x the 500 test images, less them")
    parser.add_argument("--force", action="store_true", help="embed again even where the arrays exist")
    args = parser.parse_args(argv)
    seeds = seed_dirs(args.demo_runs)
    if not seeds:
        print(f"no seed workdir with every model under {args.demo_runs}: run demo_seeds.py first")
        return 1
    import ce_retrieval  # noqa: F401  (legacy Keras before TensorFlow)
    from ce_retrieval import configs
    from ce_retrieval.data.synthetic import distractor_images

    out = os.path.join(args.out, "runs", "demo", "scenes")
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    distractors = None
    for seed_dir in seeds:
        seed = seed_dir.rsplit("seed", 1)[1]
        for sub, label in MODELS:
            path = os.path.join(out, f"{label}-seed{seed}.npz")
            if os.path.exists(path) and not args.force:
                continue
            if distractors is None:  # one set for every model, at the demo's image size
                cfg = configs.load_experiment(os.path.join(seed_dir, sub, "config.yaml"))
                distractors = distractor_images(args.distractors, seed=DISTRACTOR_SEED, image_size=cfg.data.image_size)
                print(f"[demo coverage] {len(distractors)} distractor images, {time.perf_counter() - t0:.0f} s")
            arrays = embed_run(os.path.join(seed_dir, sub), distractors)
            tmp = path[:-4] + ".tmp.npz"
            np.savez(tmp, **arrays)
            os.replace(tmp, path)
            print(f"[demo coverage] {label} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Throughput of the two-tower train step, and where a step's time goes.

Measures, in one process and on the same batch:
  * examples/s of a full ``train_step`` (preprocessing + towers + gather + loss + two optimizer updates);
  * the share of a step spent in string preprocessing (WordPiece + image decoding), in the towers (forward +
    backward with a trivial head), and in gather + similarity + loss (forward + backward on fixed embeddings).
Configurations: ``tiny`` (ModelConfig.tiny) and ``paper`` (BERT-base + ResNet-50, 224x224, d = 128).

    .venv/bin/python -m benchmarks.scale.train --config tiny --batch 32 --steps 10
    .venv/bin/python -m benchmarks.scale.train --config paper --batch 32 --steps 3

Numbers are wall-clock medians; compare ratios within one run (the CPU may be shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow loads, whatever the import order below

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ce_retrieval  # noqa: E402,F401
from ce_retrieval import losses  # noqa: E402
from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.modeling import (  # noqa: E402
    ModelConfig,
    OptimizerConfig,
    build_optimizers,
    build_two_tower,
    cosine_similarity,
)

WORDS = "a the red green blue dog cat car tree grass street small big sky on in with".split()


def _vocab(path):
    with open(path, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    return path


def _batch(n, image_size, seed=0):
    rng = np.random.default_rng(seed)
    caps = [" ".join(rng.choice(WORDS, size=12)) for _ in range(n)]
    imgs = [
        tf.io.encode_jpeg(rng.integers(0, 256, size=(image_size + 32, image_size + 48, 3), dtype=np.uint8)).numpy()
        for _ in range(n)
    ]
    return {"caption": tf.constant(caps), "image": tf.constant(imgs), "image_id": tf.constant(np.arange(n), tf.int64)}


def _median_time(fn, steps, *args):
    fn(*args)  # trace / warm up
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        out = fn(*args)
        tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, "numpy") else x, out)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(config: str, batch_size: int, steps: int, loss_name: str, jit: bool) -> dict:
    cfg = ModelConfig.tiny() if config == "tiny" else ModelConfig()
    cfg.image.augmentation.enabled = False
    workdir = tempfile.mkdtemp()
    model = build_two_tower(cfg, _vocab(os.path.join(workdir, "vocab.txt")))
    text_opt, image_opt = build_optimizers(OptimizerConfig(), total_steps=1000)
    model.compile(loss=losses.get(loss_name), text_optimizer=text_opt, image_optimizer=image_opt, jit_compile=jit)
    batch = _batch(batch_size, cfg.image.image_size)

    step = tf.function(model.train_step)
    prepare = tf.function(lambda b: model._prepare(b, augment=False))
    text_inputs, pixels, ids = prepare(batch)
    r_text = tf.random.normal([batch_size, cfg.embedding_dim])
    r_image = tf.random.normal([batch_size, cfg.embedding_dim])

    @tf.function
    def towers(text_inputs, pixels):
        with tf.GradientTape() as tape:
            t = model.text_core(text_inputs, training=True)
            v = model.image_core(pixels, training=True)
            dummy = tf.reduce_sum(t * r_text) + tf.reduce_sum(v * r_image)
        return tape.gradient(dummy, model.text_variables + model.image_variables)

    t_fixed = tf.math.l2_normalize(r_text, axis=1)
    v_fixed = tf.math.l2_normalize(r_image, axis=1)

    @tf.function
    def gather_loss(t, v, ids):
        with tf.GradientTape() as tape:
            tape.watch([t, v])
            loss = model.retrieval_loss(relevance_from_ids(ids, ids), cosine_similarity(t, v))
        return tape.gradient(loss, [t, v])

    full = _median_time(step, steps, batch)
    prep = _median_time(prepare, steps, batch)
    tower = _median_time(towers, steps, text_inputs, pixels)
    head = _median_time(gather_loss, max(steps, 20), t_fixed, v_fixed, ids)
    return {
        "config": config,
        "batch": batch_size,
        "step_s": full,
        "examples_per_s": batch_size / full,
        "preprocess_share": prep / full,
        "towers_share": tower / full,
        "gather_loss_share": head / full,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=["tiny", "paper"], nargs="+", default=["tiny"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--loss", default="cross_example_softmax")
    parser.add_argument("--jit", action="store_true", help="XLA-compile the numeric part of the step")
    args = parser.parse_args(argv)
    print("| config | batch | step (s) | examples/s | preprocessing | towers fwd+bwd | gather+loss fwd+bwd |")
    print("|---|---|---|---|---|---|---|")
    for config in args.config:
        r = measure(config, args.batch, args.steps, args.loss, args.jit)
        print(
            f"| {r['config']} | {r['batch']} | {r['step_s']:.3f} | {r['examples_per_s']:.1f} | "
            f"{100 * r['preprocess_share']:.1f}% | {100 * r['towers_share']:.1f}% | "
            f"{100 * r['gather_loss_share']:.2f}% |"
        )


if __name__ == "__main__":
    main()

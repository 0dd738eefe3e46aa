"""Run as a subprocess by test_grad_cache.py: gradient caching under MirroredStrategy on 2 logical CPUs.

One step on 8 rows (4 per replica, chunks of 2) with ``embedding_chunk`` vs the plain step, on Mirrored(2) and on
one device; frozen batch norm (exact with chunks). Prints one JSON line with the measured differences.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import ce_retrieval  # noqa: E402,F401

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from modeling_fixtures import VOCAB, make_batch, tiny_config  # noqa: E402

from ce_retrieval.losses import SampledSoftmax  # noqa: E402
from ce_retrieval.modeling import build_two_tower  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402


def build(strategy, vocab, chunk, run_eagerly=False):
    with strategy.scope():
        cfg = tiny_config(learn_logit_scale=True)
        cfg.image.batchnorm = "frozen"
        model = build_two_tower(cfg, vocab)
        model.compile(
            loss=SampledSoftmax(scale=1.0),
            text_optimizer=tf_keras.optimizers.SGD(0.05),
            image_optimizer=tf_keras.optimizers.SGD(0.05),
            embedding_chunk=chunk,
            run_eagerly=run_eagerly,
        )
    return model


def weights(model):
    return [w.numpy() for w in model.text_core.weights + model.image_core.weights] + [model.log_logit_scale.numpy()]


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def main(workdir):
    seed_everything(0, deterministic=False)  # the same initial weights in every run (after the logical devices)
    vocab = os.path.join(workdir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    single = build(tf.distribute.get_strategy(), vocab, 0, run_eagerly=True)
    multi_plain = build(mirrored, vocab, 0)
    multi_cached = build(mirrored, vocab, 2)
    for model in (multi_plain, multi_cached):
        model.set_weights(single.get_weights())
    initial = weights(single)
    initial_trainable = [v.numpy() for v in single.trainable_weights]
    ds = tf.data.Dataset.from_tensors(make_batch()).unbatch().batch(8, drop_remainder=True)
    logs = {
        name: m.fit(ds, epochs=1, verbose=0).history
        for name, m in [("single", single), ("multi_plain", multi_plain), ("multi_cached", multi_cached)]
    }
    after = {"single": weights(single), "multi_plain": weights(multi_plain), "multi_cached": weights(multi_cached)}
    trainable = [
        float(np.abs(v.numpy() - w).max()) for v, w in zip(single.trainable_weights, initial_trainable, strict=True)
    ]
    steps = [float(np.abs(a - b).max()) for a, b in zip(after["single"], initial, strict=True)]
    print(
        json.dumps(
            {
                "multi_cached_vs_single_plain": max_diff(after["multi_cached"], after["single"]),
                "multi_cached_vs_multi_plain": max_diff(after["multi_cached"], after["multi_plain"]),
                "step_size": max(steps),
                "fraction_moved": sum(s > 1e-6 for s in trainable) / len(trainable),
                "loss_single": logs["single"]["loss"][0],
                "loss_multi_cached": logs["multi_cached"]["loss"][0],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])

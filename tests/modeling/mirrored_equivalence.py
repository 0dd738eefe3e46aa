"""Run as a subprocess by test_modeling_distributed.py: MirroredStrategy on 2 logical CPUs vs one device.

Logical devices must be configured before TensorFlow runs any op, hence a fresh process. Prints one JSON line
with the measured differences; the test asserts on them.
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
from ce_retrieval.modeling import build_two_tower, cosine_similarity, gather_from_replicas  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402


def build(strategy, vocab, batchnorm, run_eagerly=False):
    with strategy.scope():
        cfg = tiny_config()
        cfg.image.batchnorm = batchnorm
        model = build_two_tower(cfg, vocab)
        # Plain SGD: its update is proportional to the gradient, so a wrong replica scaling would show.
        model.compile(
            loss=SampledSoftmax(),
            text_optimizer=tf_keras.optimizers.SGD(0.05),
            image_optimizer=tf_keras.optimizers.SGD(0.05),
            run_eagerly=run_eagerly,
        )
    return model


def tower_weights(model):
    """All tower variables, trainable or not (BN moving statistics included), in a fixed order."""
    return model.text_core.weights + model.image_core.weights


def main(workdir, batchnorm):
    seed_everything(0, deterministic=False)  # the same initial weights in every run (after the logical devices)
    vocab = os.path.join(workdir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    single = build(tf.distribute.get_strategy(), vocab, batchnorm, run_eagerly=True)  # reference: no tracing
    multi = build(mirrored, vocab, batchnorm)
    multi.set_weights(single.get_weights())
    batch = make_batch(num_images=6, captions_per_image=(2, 1, 1, 1, 1, 2))  # 8 rows, duplicate ids at 0-1, 6-7

    # 1. The gathered similarity matrix on each replica equals the one-device matrix of the global batch.
    dist = mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).unbatch().batch(8))
    dist_batch = next(iter(dist))

    @tf.function
    def replica_matrix(b):
        def fn(x):
            out = multi(x, training=False)
            return cosine_similarity(gather_from_replicas(out["text"]), gather_from_replicas(out["image"]))

        return mirrored.run(fn, args=(b,))

    per_replica = mirrored.experimental_local_results(replica_matrix(dist_batch))
    out = single(batch, training=False)
    reference = cosine_similarity(out["text"], out["image"]).numpy()
    matrix_diff = max(float(np.abs(m.numpy() - reference).max()) for m in per_replica)

    # 2. One training step under Mirrored(2) == one step on the whole batch on one device.
    ds = tf.data.Dataset.from_tensors(batch).unbatch().batch(8)
    initial = [w.numpy().copy() for w in tower_weights(single)]
    logs_single = single.fit(ds, epochs=1, verbose=0).history
    logs_multi = multi.fit(ds, epochs=1, verbose=0).history
    after_single = [w.numpy() for w in tower_weights(single)]
    after_multi = [w.numpy() for w in tower_weights(multi)]
    diffs = [float(np.abs(a - b).max()) for a, b in zip(after_single, after_multi, strict=True)]
    steps = [float(np.abs(a - b).max()) for a, b in zip(after_single, initial, strict=True)]
    names = [v.name for v in tower_weights(single)]
    worst = sorted(zip(diffs, names, strict=True), reverse=True)[:3]
    weight_diff, step_size = max(diffs), max(steps)
    moved = sum(s > 1e-6 for s in steps) / len(steps)
    print(
        json.dumps(
            {
                "shapes": [list(m.shape) for m in per_replica],
                "matrix_diff": matrix_diff,
                "weight_diff": weight_diff,
                "step_size": step_size,
                "loss_single": logs_single["loss"][0],
                "loss_multi": logs_multi["loss"][0],
                "worst": worst,
                "fraction_moved": moved,
                "optimizer_iterations": [
                    int(multi.text_optimizer.iterations.numpy()),
                    int(multi.image_optimizer.iterations.numpy()),
                ],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sync")

"""Run as a subprocess by test_modeling_distributed.py: one TwoTowerModel training step under MirroredStrategy on 2
logical CPUs against one device, for every way the step can split its work. Usage:
``python model_step_replicas.py WORKDIR [chunk]``; prints one JSON line of measured differences.

``sync``: batch norm synchronised across replicas, CrossExampleNegativeMining (a loss normalised over the GLOBAL
batch, so a share computed on the wrong rows or scaled twice shows), plain SGD (its update is proportional to the
gradient), learned λ. A model on one device (eager, the reference: no tracing) against the ``replicated`` and the
``sharded`` (``train.loss_partition``) steps under Mirrored(2): the gathered similarity matrix on each replica, the
updated weights (BN moving statistics included) and the logged loss.
``frozen``: frozen batch norm (with which chunking is exact), learned λ, SampledSoftmax: one device against the
gradient-cached (``embedding_chunk=2``: 4 rows per replica in chunks of 2) step under Mirrored(2); with
``chunk`` also the sharded step with chunks of one row (not run by the test: model builds dominate the run time).
All models of a part start from the reference's weights. One process for all of it: logical devices must be set
before TensorFlow runs an op, and each process pays the imports and the strategy's set-up.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
SHARDED_CHUNK = "chunk" in sys.argv[2:]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import ce_retrieval  # noqa: E402,F401

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from modeling_fixtures import VOCAB, make_batch, tiny_config  # noqa: E402

from ce_retrieval.losses import CrossExampleNegativeMining, SampledSoftmax  # noqa: E402
from ce_retrieval.modeling import build_two_tower, cosine_similarity, gather_from_replicas  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402

BATCH = make_batch(num_images=6, captions_per_image=(2, 1, 1, 1, 1, 2))  # 8 rows, duplicate ids at 0-1, 6-7


def build(strategy, vocab, batchnorm, loss, learn_logit_scale=False, run_eagerly=False, **compile_args):
    with strategy.scope():
        cfg = tiny_config(learn_logit_scale=learn_logit_scale)
        cfg.image.batchnorm = batchnorm
        model = build_two_tower(cfg, vocab)
        model.compile(
            loss=loss(),
            text_optimizer=tf_keras.optimizers.SGD(0.05),
            image_optimizer=tf_keras.optimizers.SGD(0.05),
            run_eagerly=run_eagerly,
            **compile_args,
        )
    return model


def weights(model):
    """All tower variables, trainable or not (BN moving statistics included), and a learned λ, in a fixed order."""
    learned = [model.log_logit_scale] if model.learn_logit_scale else []
    return [w.numpy() for w in model.text_core.weights + model.image_core.weights + learned]


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def matrix_diff(mirrored, multi, single):
    """The gathered similarity matrix on each replica against the one-device matrix of the global batch."""
    dist = mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensors(BATCH).unbatch().batch(8))

    @tf.function
    def replica_matrix(b):
        def fn(x):
            out = multi(x, training=False)
            return cosine_similarity(gather_from_replicas(out["text"]), gather_from_replicas(out["image"]))

        return mirrored.run(fn, args=(b,))

    per_replica = mirrored.experimental_local_results(replica_matrix(next(iter(dist))))
    out = single(BATCH, training=False)
    reference = cosine_similarity(out["text"], out["image"]).numpy()
    return [list(m.shape) for m in per_replica], max(float(np.abs(m.numpy() - reference).max()) for m in per_replica)


def one_step(mirrored, vocab, batchnorm, loss, variants, learn_logit_scale=False):
    """``variants``: {name: compile args} of models under ``mirrored``; each takes one fit step from the one-device
    reference's weights. Returns the models and their figures against the reference (``single``)."""
    single = build(tf.distribute.get_strategy(), vocab, batchnorm, loss, learn_logit_scale, run_eagerly=True)
    models = {"single": single}
    for name, args in variants.items():
        models[name] = build(mirrored, vocab, batchnorm, loss, learn_logit_scale, **args)
        models[name].set_weights(single.get_weights())
    initial = weights(single)
    trainable_before = [v.numpy() for v in single.trainable_weights]
    ds = tf.data.Dataset.from_tensors(BATCH).unbatch().batch(8, drop_remainder=True)
    losses, after = {}, {}
    for name, model in models.items():
        losses[name] = model.fit(ds, epochs=1, verbose=0).history["loss"][0]
        after[name] = weights(model)
    moved = [
        float(np.abs(v.numpy() - w).max()) for v, w in zip(single.trainable_weights, trainable_before, strict=True)
    ]
    out = {
        "step_size": max_diff(after["single"], initial),
        "fraction_moved": sum(s > 1e-6 for s in moved) / len(moved),
        "logged_loss": losses,
        "weight_diff": {name: max_diff(after[name], after["single"]) for name in variants},
        "optimizer_iterations": {
            name: [int(m.text_optimizer.iterations.numpy()), int(m.image_optimizer.iterations.numpy())]
            for name, m in models.items()
        },
    }
    return models, out


def main(workdir):
    seed_everything(0, deterministic=False)  # the same initial weights in every run (after the logical devices)
    vocab = os.path.join(workdir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    variants = {"replicated": {}, "sharded": {"loss_partition": "sharded"}}
    models, sync = one_step(
        mirrored, vocab, "sync", lambda: CrossExampleNegativeMining(scale=1.0), variants, learn_logit_scale=True
    )
    # the matrix after the step: both models hold the same (updated) weights if the step is right, and the check
    # needs the models' forward pass only
    models["replicated"].set_weights(models["single"].get_weights())
    sync["shapes"], sync["matrix_diff"] = matrix_diff(mirrored, models["replicated"], models["single"])
    variants = {"cached": {"embedding_chunk": 2}}  # the plain replicated step against one device: ``sync`` above
    if SHARDED_CHUNK:
        variants["sharded_chunk"] = {"loss_partition": "sharded", "embedding_chunk": 1}
    _, frozen = one_step(mirrored, vocab, "frozen", lambda: SampledSoftmax(scale=1.0), variants, learn_logit_scale=True)
    print(json.dumps({"sync": sync, "frozen": frozen}))


if __name__ == "__main__":
    main(sys.argv[1])

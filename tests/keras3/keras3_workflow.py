"""Run by test_keras3_process.py in a fresh plain Keras 3 process (no TF_USE_LEGACY_KERAS); prints one JSON line.

Order matters and is the point of step 1: TensorFlow first, ``tf.keras`` touched (Keras 3), then ce_retrieval.
Then a two-input Keras 3 model trains 2 epochs with CrossExampleSoftmax and with TripletLoss on paired views of
random class prototypes (recall@1 before / after), is saved as ``.keras`` and reloaded with its loss, and one
loss is evaluated per replica under a 2-CPU MirroredStrategy.
"""

import json
import os
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
dense = tf.keras.layers.Dense(2)  # tf.keras is Keras 3 in this process
start = time.process_time()
result = {"tf_keras_module": type(dense).__module__, "legacy_env": os.environ.get("TF_USE_LEGACY_KERAS")}

import ce_retrieval  # noqa: E402,F401
from ce_retrieval import losses  # noqa: E402

result["tf_keras_after_import"] = type(tf.keras.layers.Dense(2)).__module__
result["legacy_env_after_import"] = os.environ.get("TF_USE_LEGACY_KERAS")
result["tf_keras_losses"] = len(losses.available())

import keras  # noqa: E402

from ce_retrieval.keras import CrossExampleSoftmax, SimilarityMatrix, TripletLoss  # noqa: E402

CLASSES, DIM, VIEW_DIM = 32, 8, 24
rng = np.random.default_rng(0)
prototypes = rng.normal(size=(CLASSES, DIM))
maps = rng.normal(size=(2, DIM, VIEW_DIM)) / np.sqrt(DIM)  # each view sees the prototype through its own map


def views(n):
    ids = rng.integers(0, CLASSES, size=n)
    a, b = (prototypes[ids] @ m + 0.3 * rng.normal(size=(n, VIEW_DIM)) for m in maps)
    return a.astype("float32"), b.astype("float32"), ids


def tower(name):
    inputs = keras.Input((VIEW_DIM,), name=f"{name}_view")
    hidden = keras.layers.Dense(64, activation="relu", name=f"{name}_hidden")(inputs)
    return inputs, keras.layers.Dense(16, name=f"{name}_embedding")(hidden)


def build():
    (qa, ea), (qb, eb) = tower("a"), tower("b")
    return keras.Model([qa, qb], SimilarityMatrix(name="similarity")([ea, eb]))


def recall_at_1(model, a, b, ids):
    scores = keras.ops.convert_to_numpy(model([a, b]))
    return float(np.mean(ids[np.argmax(scores, axis=1)] == ids))


train_a, train_b, train_ids = views(2048)
test_a, test_b, test_ids = views(256)
workdir = tempfile.mkdtemp()
# XLA for the softmax run. The triplet run uses hardest-negative mining (VSE++) without XLA: the default
# mining='all' takes ~5 s of CPU to trace (per function: fit, evaluate, reloaded) and far longer under XLA.
for loss, jit in ((CrossExampleSoftmax(), True), (TripletLoss(margin=0.2, mining="hard"), False)):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=loss, jit_compile=jit)
    before = recall_at_1(model, test_a, test_b, test_ids)
    history = model.fit([train_a, train_b], train_ids, batch_size=64, epochs=2, shuffle=True, verbose=0)
    after = recall_at_1(model, test_a, test_b, test_ids)
    path = os.path.join(workdir, f"{loss.name}.keras")
    model.save(path)
    reloaded = keras.models.load_model(path)
    result[type(loss).__name__] = {
        "cpu_seconds": time.process_time() - start,
        "recall_before": before,
        "recall_after": after,
        "loss_history": [float(v) for v in history.history["loss"]],
        "reloaded_loss_class": type(reloaded.loss).__module__ + "." + type(reloaded.loss).__name__,
        "reloaded_loss_config_equal": reloaded.loss.get_config() == loss.get_config(),
        "max_prediction_difference": float(
            np.max(np.abs(keras.ops.convert_to_numpy(reloaded([test_a, test_b]) - model([test_a, test_b]))))
        ),
        "evaluate": [
            float(m.evaluate([test_a, test_b], test_ids, batch_size=256, verbose=0)) for m in (model, reloaded)
        ],
    }

# Replica scaling: under a strategy Keras's default reduction divides the scalar by num_replicas_in_sync.
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
scores = tf.constant(test_a[:16] @ test_b[:16].T / VIEW_DIM)
ids = tf.constant(test_ids[:16])
for reduction in ("sum_over_batch_size", "sum"):
    loss = CrossExampleSoftmax(reduction=reduction)
    per_replica = strategy.run(lambda loss=loss: loss(ids, scores))
    result[f"replicas_{reduction}"] = [float(v) for v in strategy.experimental_local_results(per_replica)]
result["replicas_plain"] = float(CrossExampleSoftmax()(ids, scores))
result["cpu_seconds"] = time.process_time() - start
sys.stdout.write(json.dumps(result) + "\n")

"""Run by test_keras3_objective.py in a fresh plain Keras 3 process (no TF_USE_LEGACY_KERAS); prints one JSON line.

A two-tower Keras 3 model ``towers -> RetrievalObjectiveLayer`` (learned λ, tiled path with T = 3) compiled without
a loss: its added loss equals the objective's dense value on the same embeddings, it trains (loss falls, λ moves),
and the layer's config round-trips. The same with SigLIP (learned t and b, sharded + tiled on one device).
"""

import json

import keras  # noqa: I001
import numpy as np
import tensorflow as tf

from ce_retrieval import losses  # noqa: E402
from ce_retrieval.keras import RetrievalObjectiveLayer  # noqa: E402
from ce_retrieval.objective import LogitScale, RetrievalObjective  # noqa: E402

N, DIM = 16, 12
rng = np.random.default_rng(0)
prototypes = rng.normal(size=(8, DIM))
ids = np.repeat(np.arange(8), 2)[:N]
a = (prototypes[ids] + 0.3 * rng.normal(size=(N, DIM))).astype("float32")
b = (prototypes[ids] @ rng.normal(size=(DIM, DIM)) / np.sqrt(DIM)).astype("float32")

qa, qb, qi = keras.Input((DIM,)), keras.Input((DIM,)), keras.Input((), dtype="int64")
ea, eb = keras.layers.Dense(8, name="tower_a")(qa), keras.layers.Dense(8, name="tower_b")(qb)
layer = RetrievalObjectiveLayer("CrossExampleSoftmax", logit_scale=10.0, learn_logit_scale=True, tile_size=3)
model = keras.Model([qa, qb, qi], layer([ea, eb, qi]))
model.compile(optimizer=keras.optimizers.Adam(0.01))

embed = keras.Model([qa, qb], [ea, eb])
ta, tb = (tf.math.l2_normalize(x, -1) for x in embed([a, b]))
dense = RetrievalObjective(losses.CrossExampleSoftmax(scale=1.0), LogitScale(10.0, learn=True))
want = float(dense(ta, tb, tf.constant(ids, tf.int64)).loss)
got = float(model([a, b, ids]))
history = model.fit([a, b, ids], epochs=20, batch_size=N, verbose=0).history["loss"]
clone = RetrievalObjectiveLayer.from_config(layer.get_config())

siglip = RetrievalObjectiveLayer(
    "SigmoidLoss",
    logit_scale=10.0,
    learn_logit_scale=True,
    logit_bias=-10.0,
    learn_logit_bias=True,
    partition="sharded",
    tile_size=3,
)
siglip_model = keras.Model([qa, qb, qi], siglip([ea, eb, qi]))
siglip_model.compile(optimizer=keras.optimizers.Adam(0.05))
ta, tb = (tf.math.l2_normalize(x, -1) for x in embed([a, b]))
siglip_dense = RetrievalObjective(losses.SigmoidLoss(scale=10.0, bias=-10.0), LogitScale(10.0), logit_bias=-10.0)
siglip_want = float(siglip_dense(ta, tb, tf.constant(ids, tf.int64)).loss)
siglip_got = float(siglip_model([a, b, ids]))
siglip_model.fit([a, b, ids], epochs=10, batch_size=N, verbose=0)
print(
    json.dumps(
        {
            "layer_loss": got,
            "dense_loss": want,
            "history": [float(x) for x in history],
            "logit_scale": float(layer.logit_scale),
            "weights": [w.path for w in layer.weights],
            "config_round_trip": clone.get_config() == layer.get_config(),
            "siglip_layer_loss": siglip_got,
            "siglip_dense_loss": siglip_want,
            "siglip_bias": float(siglip.logit_bias),
            "siglip_weights": [w.path for w in siglip.weights],
            "siglip_round_trip": RetrievalObjectiveLayer.from_config(siglip.get_config()).get_config()
            == siglip.get_config(),
        }
    )
)

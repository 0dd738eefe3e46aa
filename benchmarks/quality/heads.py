"""Projection heads trained on frozen tower features with one of the project's losses (the benchmark's fine-tuning).

Each modality gets a head ``x -> L2(W2 relu(W1 x + b1))`` (hidden 512, output 128, no bias on the last layer:
the paper's bias-free 128-d reduction, with one hidden layer standing in for the fine-tuned top of each
encoder). A step samples ``batch`` caption-image training pairs without replacement, forms S = T I^T
(cosine) and the relevance from the image ids (two captions of one image in a batch are both positives, as in
the two-tower train step), and applies the loss unchanged (``ce_retrieval.losses``, logits = lambda S).
Adam with a linear decay to zero over the run. Given the seed, the initial weights and the batch order are the
same for every loss, so runs are paired.

Every ``eval_every`` steps the test-split PR-AUC and Recall@1 are recorded (the plateau curves); at the end the
full evaluation (``ce_retrieval.evaluation.evaluate_embeddings``: PR-AUC, Recall@K, Recall@K with distractors,
thresholds calibrated on validation and the precision they achieve on test, per-query threshold spread).
"""

from __future__ import annotations

import time

import numpy as np


def _head(tf, dim_in: int, hidden: int, dim_out: int, name: str):
    import tf_keras

    inputs = tf_keras.Input((dim_in,))
    x = tf_keras.layers.Dense(hidden, activation="relu", name=f"{name}_hidden")(inputs)
    x = tf_keras.layers.Dense(dim_out, use_bias=False, name=f"{name}_projection")(x)
    return tf_keras.Model(inputs, tf.math.l2_normalize(x, axis=-1), name=name)


def make_loss(name: str, scale: float, **kwargs):
    from ce_retrieval import losses

    return losses.get(name, scale=scale, **kwargs)


def embed(features: dict, text_head, image_head, split: str) -> tuple:
    return (
        text_head(features[f"{split}_text"]).numpy(),
        image_head(features[f"{split}_image"]).numpy(),
        features[f"{split}_text_ids"],
        features[f"{split}_image_ids"],
    )


def quick_metrics(features: dict, text_head, image_head, split: str = "test") -> dict:
    """Test PR-AUC and text->image Recall@1 (the learning-curve points)."""
    from ce_retrieval.evaluation import global_pr_auc, recall_at_k

    q, d, qi, di = embed(features, text_head, image_head, split)
    return {"pr_auc": global_pr_auc(q, d, qi, di)["pr_auc"], "t2i_r1": recall_at_k(q, d, qi, di, ks=(1,))["t2i"][1]}


def evaluate_arrays(val: tuple, test: tuple, distractors=None, promise_distractors=None, promise_levels=None) -> dict:
    """Every figure of the table from ``(q, d, q_ids, d_ids)`` embeddings of val and test: ``evaluate_embeddings``
    on test, with thresholds calibrated on val (the precision levels of ``RELIABILITY_LEVELS``) and the guaranteed
    thresholds of ``calibrate_split`` on val checked there (recall at guaranteed precision). The result keeps the
    embeddings of test, val and ``promise_distractors`` (for ``guarantee_coverage.py``). ``promise_levels``: the
    precision levels promised (default ``split_calibration.DEFAULT_LEVELS``)."""
    from ce_retrieval.evaluation import global_pr_auc
    from ce_retrieval.evaluation.evaluate import evaluate_embeddings, summary
    from ce_retrieval.evaluation.split_calibration import DEFAULT_LEVELS, calibrate_split
    from ce_retrieval.evaluation.transfer import RELIABILITY_LEVELS

    thresholds = global_pr_auc(*val, target_precisions=RELIABILITY_LEVELS)["threshold_at_precision"]
    metrics = evaluate_embeddings(
        *test,
        distractor_emb=distractors,
        calibration_thresholds=thresholds,
        split_calibration=calibrate_split(*val, levels=promise_levels or DEFAULT_LEVELS, source={"split": "val"}),
    )
    return {
        "summary": summary(metrics),
        "metrics": metrics,
        "embeddings": test,
        "val_embeddings": val,
        "promise_distractors": promise_distractors,
    }


def full_metrics(features: dict, text_head, image_head, promise_levels=None) -> dict:
    """Every figure of the table: :func:`evaluate_arrays` of the heads' embeddings."""
    promise = features.get("promise_distractor_image")
    return evaluate_arrays(
        embed(features, text_head, image_head, "val"),
        embed(features, text_head, image_head, "test"),
        image_head(features["distractor_image"]).numpy(),
        None if promise is None else image_head(promise).numpy(),
        promise_levels,
    )


def train_heads(
    features: dict,
    loss,
    *,
    seed: int,
    batch: int = 512,
    steps: int = 1500,
    learning_rate: float = 1e-3,
    hidden: int = 512,
    dim: int = 128,
    eval_every: int = 100,
    jit_compile: bool = True,
    log=None,
    extra_variables=(),
    selection: bool = False,
    promise_levels=None,
) -> dict:
    """Trains the two heads with ``loss`` and returns ``{"curve", "summary", "metrics", "seconds", ...}``.
    ``extra_variables`` are trained with the heads (e.g. a learned temperature and bias that ``loss`` reads).
    ``promise_levels``: the precision levels calibrated on validation and checked on test (:func:`evaluate_arrays`).
    ``selection``: a hyper-parameter choice run, which reads the validation split only (its curve and its result
    ``{"val": {"pr_auc", "t2i_r1"}, "curve", "seconds"}``); the test split is never read, and need not be given."""
    import tensorflow as tf
    import tf_keras

    from ce_retrieval.utils.seeding import seed_everything

    seed_everything(seed)
    text_x = tf.constant(features["train_text"])
    text_ids = features["train_text_ids"]
    image_index = np.searchsorted(features["train_image_ids"], text_ids)
    image_x = tf.constant(features["train_image"])
    text_head = _head(tf, text_x.shape[1], hidden, dim, "text_head")
    image_head = _head(tf, image_x.shape[1], hidden, dim, "image_head")
    schedule = tf_keras.optimizers.schedules.PolynomialDecay(learning_rate, steps, 0.0)
    optimizer = tf_keras.optimizers.Adam(schedule)
    variables = text_head.trainable_variables + image_head.trainable_variables + list(extra_variables)

    @tf.function(jit_compile=jit_compile)
    def step(rows, cols, ids):
        with tf.GradientTape() as tape:
            t = text_head(tf.gather(text_x, rows), training=True)
            i = image_head(tf.gather(image_x, cols), training=True)
            relevance = tf.cast(tf.equal(ids[:, None], ids[None, :]), tf.float32)
            value = loss(relevance, tf.matmul(t, i, transpose_b=True))
        optimizer.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    rng = np.random.default_rng(seed)
    n = len(text_ids)
    if batch > n:
        raise ValueError(f"batch {batch} exceeds the {n} training pairs")
    curve = {"step": [], "pr_auc": [], "t2i_r1": [], "loss": []}
    t0 = time.perf_counter()
    order, pos = rng.permutation(n), 0
    annealed = getattr(loss, "annealed", False)  # a loss with a step schedule (MixedSoftmax's warm-up)
    for s in range(1, steps + 1):
        if annealed:
            loss.step.assign(s - 1)  # as AnnealingStepCallback: the optimizer's step before this batch
        if pos + batch > n:
            order, pos = rng.permutation(n), 0
        rows = order[pos : pos + batch]
        pos += batch
        value = step(tf.constant(rows), tf.constant(image_index[rows]), tf.constant(text_ids[rows]))
        if s % eval_every == 0 or s == steps:
            point = quick_metrics(features, text_head, image_head, "val" if selection else "test")
            curve["step"].append(s)
            curve["loss"].append(float(value))
            for k, v in point.items():
                curve[k].append(v)
            if log:
                log(
                    f"    step {s}: loss {float(value):.4f}, {'val' if selection else 'test'} PR-AUC "
                    f"{point['pr_auc']:.4f}, "
                    f"R@1 {point['t2i_r1']:.4f}"
                )
    train_seconds = time.perf_counter() - t0
    if selection:
        return {"val": quick_metrics(features, text_head, image_head, "val"), "curve": curve, "seconds": train_seconds}
    final = full_metrics(features, text_head, image_head, promise_levels)
    return {**final, "curve": curve, "seconds": train_seconds}

"""Gradient caching for the two-tower step (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup", GradCache): the global batch's loss with the activations of one sub-batch at a time.

A replica's B_r rows are split into K = B_r / c chunks of c rows (``train.embedding_chunk``). With E = [T; V] the
replica's embeddings and θ the tower weights:

    1. e_k = f(x_k; θ) for k = 1..K, without a tape (activations freed chunk by chunk)
    2. E = concat_k e_k -> the retrieval objective (``ce_retrieval.objective``: gather, S, L, any path) ->
       G = ∂share/∂E, share = L / R or the sharded share ([B_r, d] per tower, tape over E only; the gradient
       of all_gather sums the replicas' upstream gradients as in the plain step)
    3. ∂(L / R)/∂θ = Σ_k (∂e_k/∂θ)ᵀ G_k: re-run chunk k under a tape and back-propagate its slice G_k
       (``tape.gradient(e_k, θ, output_gradients=G_k)``), accumulating over k
    plus the loss's direct gradients (learned log λ, weight regularisers) from step 2.

By the chain rule this is exactly the plain step's gradient whenever f is a function of each row alone and the
same in both passes: peak activation memory is one chunk's instead of the batch's. The loop over chunks is a
static Python loop (the training batch is static: ``drop_remainder=True``) chained by control dependencies so
the executor runs the chunks one after another. Why not ``tf.while_loop``: batch-norm layers in ``'sync'`` mode
all-reduce inside the towers, and collectives inside a while loop under ``MirroredStrategy`` are not reliably
supported; the unrolled loop also keeps the embedding tables' sparse (``IndexedSlices``) gradients sparse, as the
plain step's tape does. Cost: the towers are traced 2K times (trace/compile time grows with K).

Semantics (docs/architecture.md, "Gradient caching"):
  * augmentation runs once per step in ``TwoTowerModel._prepare``, before this step: both passes of a chunk
    read the same augmented pixels;
  * dropout would draw different masks in the two passes, so a tower with a ``Dropout`` rate > 0 is refused;
  * batch norm in ``'train'`` mode normalises each chunk with the chunk's statistics (as GradCache
    implementations do; ``'sync'``: the chunk's rows of all replicas), so the gradient is that of the loss of
    the chunk-wise forward, not of the full-batch forward; the moving statistics get one update per chunk, from
    the second pass (the first pass's updates are undone). ``'frozen'`` BN is exact;
  * mixed_float16: G is multiplied by each optimizer's loss scale before the half-precision backward and the
    accumulated gradients are unscaled, as ``LossScaleOptimizer.get_scaled_loss`` would;
  * XLA (``train.jit_compile``): the whole cached step is compiled as one function (tested equal).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras


def static_rows(pixels: tf.Tensor) -> int:
    """The replica's static batch size B_r; gradient caching needs it to split the batch into static chunks."""
    rows = pixels.shape[0]
    if rows is None:
        raise ValueError(
            "train.embedding_chunk needs a static batch size (batch the dataset with drop_remainder=True, as "
            "ce_retrieval.data.train_pipeline does)"
        )
    return int(rows)


def check_chunk(rows: int, chunk: int) -> int:
    """K = B_r / c, or a clear error when c does not divide the replica's batch."""
    if rows % chunk:
        raise ValueError(
            f"train.embedding_chunk={chunk} must divide the per-replica batch ({rows} rows = train.batch_size / "
            "replicas)"
        )
    return rows // chunk


def dropout_layers(*towers: tf_keras.Model) -> list[str]:
    """Names of the ``Dropout`` layers with rate > 0 in the towers (their masks would differ between passes)."""
    return [
        f"{tower.name}/{layer.name} (rate {layer.rate:g})"
        for tower in towers
        for layer in tower.submodules
        if isinstance(layer, tf_keras.layers.Dropout) and float(layer.rate) > 0
    ]


def batchnorm_state(*towers: tf_keras.Model) -> list[tf.Variable]:
    """Moving statistics of the towers' batch-norm layers that update them (not frozen)."""
    state = []
    for tower in towers:
        for layer in tower.submodules:
            if isinstance(layer, tf_keras.layers.BatchNormalization) and layer.trainable:
                state += [layer.moving_mean, layer.moving_variance]
    return state


def _add(a, b):
    """a + b for gradients that may be None or ``IndexedSlices`` (sparse sums concatenate, like the tape's)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _chunk(structure, start: int, stop: int, after: list):
    """Rows [start, stop) of every tensor of ``structure``, computed after the tensors in ``after``."""
    with tf.control_dependencies(after):
        return tf.nest.map_structure(lambda t: tf.identity(t[start:stop]), structure)


def _dense_handles(grads) -> list[tf.Tensor]:
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]


def cached_gradients(model, text_inputs, pixels, ids, chunk: int) -> tuple:
    """The plain step's ``(L, recall@1, has positive, text grads, image grads)`` computed chunk by chunk (module
    docstring).

    ``model`` is a compiled :class:`ce_retrieval.modeling.TwoTowerModel`; its ``objective_terms`` (the retrieval
    objective plus the towers' regularisers) give the loss and this replica's share of the replica's embeddings,
    on whichever path the objective takes (dense, tiled, sharded).
    """
    rows = static_rows(pixels)
    num_chunks = check_chunk(rows, chunk)
    text_core, image_core = model.text_core, model.image_core
    tower_text_vars = list(text_core.trainable_variables)
    tower_image_vars = list(image_core.trainable_variables)

    # 1. Embeddings without activations; batch-norm moving statistics restored afterwards (pass 2 updates them).
    state = batchnorm_state(text_core, image_core)
    saved = [tf.identity(v) for v in state]
    text_parts, image_parts, after = [], [], []
    for k in range(num_chunks):
        lo, hi = k * chunk, (k + 1) * chunk
        text = tf.stop_gradient(text_core(_chunk(text_inputs, lo, hi, after), training=True))
        image = tf.stop_gradient(image_core(_chunk(pixels, lo, hi, after), training=True))
        text_parts.append(text)
        image_parts.append(image)
        after = [text, image]
    with tf.control_dependencies(after):
        restored = [v.assign(s, read_value=False) for v, s in zip(state, saved, strict=True)]
    text_all = tf.concat(text_parts, 0)
    image_all = tf.concat(image_parts, 0)

    # 2. The global loss and its gradient with respect to this replica's embeddings (and direct variable terms).
    text_vars, image_vars = model.text_variables, model.image_variables
    with tf.GradientTape() as tape:
        tape.watch([text_all, image_all])
        loss, share, recall, has_positive = model.objective_terms(text_all, image_all, ids)
    grads = tape.gradient(share, [text_all, image_all] + text_vars + image_vars)
    grad_text, grad_image = grads[0], grads[1]
    direct_text, direct_image = grads[2 : 2 + len(text_vars)], grads[2 + len(text_vars) :]

    if model._loss_scaling:  # the half-precision backward sees G x scale, as with get_scaled_loss
        one = tf.constant(1.0, tf.float32)
        grad_text = grad_text * tf.cast(model.text_optimizer.get_scaled_loss(one), tf.float32)
        grad_image = grad_image * tf.cast(model.image_optimizer.get_scaled_loss(one), tf.float32)

    # 3. Re-run each chunk under a tape and back-propagate its slice of G.
    acc_text = [None] * len(tower_text_vars)
    acc_image = [None] * len(tower_image_vars)
    after = [grad_text, grad_image] + restored
    for k in range(num_chunks):
        lo, hi = k * chunk, (k + 1) * chunk
        text_in, pixels_in = _chunk(text_inputs, lo, hi, after), _chunk(pixels, lo, hi, after)
        with tf.GradientTape() as tape:
            text = text_core(text_in, training=True)
            image = image_core(pixels_in, training=True)
        chunk_grads = tape.gradient(
            [text, image],
            tower_text_vars + tower_image_vars,
            output_gradients=[
                tf.cast(grad_text[lo:hi], text.dtype),
                tf.cast(grad_image[lo:hi], image.dtype),
            ],
        )
        acc_text = [_add(a, g) for a, g in zip(acc_text, chunk_grads[: len(tower_text_vars)], strict=True)]
        acc_image = [_add(a, g) for a, g in zip(acc_image, chunk_grads[len(tower_text_vars) :], strict=True)]
        after = _dense_handles(acc_text + acc_image)

    if model._loss_scaling:
        acc_text = model.text_optimizer.get_unscaled_gradients(acc_text)
        acc_image = model.image_optimizer.get_unscaled_gradients(acc_image)
    acc_text = acc_text + [None] * (len(text_vars) - len(tower_text_vars))  # the learned log λ: direct only
    text_grads = [_add(a, d) for a, d in zip(acc_text, direct_text, strict=True)]
    image_grads = [_add(a, d) for a, d in zip(acc_image, direct_image, strict=True)]
    return loss, recall, has_positive, text_grads, image_grads


__all__ = ["batchnorm_state", "cached_gradients", "check_chunk", "dropout_layers", "static_rows"]

"""The two-tower retrieval model and its distributed train step.

One step on a global batch of B (caption, image, image_id) rows split over R replicas:

    T_r = f_text(captions_r),  V_r = f_image(augment(decode(images_r)))      (unit vectors, [B/R, d])
    S   = gather(T) gather(V)^T                                              (cosine, [B, B], on every replica)
    R_ij = 1[id_i == id_j]                                                   (two captions of one image: both positive)
    L   = loss(R, S)                 fixed λ: the loss applies its own scale λ (= ModelConfig.logit_scale)
                                     (gather -> L: the retrieval objective, ce_retrieval.objective)
    L   = loss(R, λ S), λ = min(exp(s), λ_max)       learned λ (loss must have scale 1)
    L   = loss(R, λ S + b)                           learned bias b (SigLIP; loss must have scale 1, bias 0)
    (a loss that ``needs_gram`` gets the joint Gram matrix of [T; V] instead, [2B, 2B], self-pairs ignored)
    L  += Σ_k w_k · reg_k(R, S)                       regularisers on the cosine S, never on λ S + b (TCM)
    text params  <- AdamW step on dL/dθ_text (and on s, the learned log-scale, if any)
    image params <- SGD+momentum step on dL/dθ_image

Replica scaling is the objective's (losses return the objective of the matrix they are given): each replica takes
the loss ``L`` of the global matrix and differentiates ``L / R``; Keras sums gradients over replicas and the
gradient of ``all_gather`` sums the upstream gradients of the replicas, so every replica applies exactly
``dL/dθ`` of the global loss: one step under ``MirroredStrategy`` equals one step on the whole batch on one
device (tested). Mixed precision: under ``mixed_float16`` both optimizers are wrapped in their own dynamic
``LossScaleOptimizer`` (each scales the loss for its own tower's gradients and skips its update on overflow);
``mixed_bfloat16`` needs no scaling. Embeddings, similarities and the loss are float32 throughout.

Inputs are raw strings: tokenisation, decoding and augmentation run before the numeric part of the step, which
can be compiled with XLA (``compile(jit_compile=True)``; string ops cannot be). XLA is tested on one replica
(gradients equal the graph step's); under a multi-replica strategy it needs XLA support for ``all_gather`` on
the device (GPU/TPU), which is not tested here. ``text_encoder`` and
``image_encoder`` (strings -> unit embeddings, no augmentation) share all weights with the towers and are what
evaluation and serving use.

Gradient caching (``compile(embedding_chunk=c)``, config ``train.embedding_chunk``): the towers run on chunks of
c rows, first without a tape to get the embeddings, then again chunk by chunk to back-propagate ``∂(L/R)/∂E``;
same gradient, one chunk's activations (:mod:`ce_retrieval.modeling.grad_cache`).

The loss (``compile(loss=..., loss_partition=..., loss_tile_size=...)``, config ``train.loss_partition``,
``train.loss_tile_size``) is the retrieval objective's (:class:`ce_retrieval.objective.RetrievalObjective`): it
takes this replica's embeddings and ids and owns the gather, S, relevance, λ (this model lends it its
``log_logit_scale`` variable, so checkpoints keep their names), the joint Gram matrix, the path (dense, tiled,
sharded, sharded + tiled) and the replica's share; the model reads no field of the loss. ``"replicated"``
(default; OpenCLIP's ``gather_with_grad=True, local_loss=False``): every replica computes the whole loss and
differentiates ``L / R``. ``"sharded"`` (OpenCLIP's ``local_loss=True``): replica r computes its own rows' share
of L (``Σ_r share_r = L``) and differentiates it; the step returns ``R·share_r`` as "the loss", so the ``loss``
metric, a mean over replicas, logs L; ``in_batch_recall_at_1`` is the mean of the replicas' own rows. Same
gradient on every path; each composes with ``embedding_chunk``.
"""

from __future__ import annotations

import math

import tensorflow as tf
import tf_keras

from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID, PIXELS
from ce_retrieval.modeling import grad_cache
from ce_retrieval.modeling.augmentation import ImageAugmentation
from ce_retrieval.modeling.text_tower import Tower
from ce_retrieval.objective import LogitBias, LogitScale, RetrievalObjective
from ce_retrieval.objective.logit_scale import DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE
from ce_retrieval.utils.replicas import num_replicas

BAD_BATCH_POLICIES = ("stop", "skip")
BAD_BATCH_NONFINITE = "has a NaN or Inf loss or gradient (stopping before the update; train.on_bad_batch=skip skips)"
BAD_BATCH_NO_POSITIVE = "has no positive pair (no caption of the batch matches an image of the batch)"


def num_replicas_in_scope() -> int:
    """Replicas of the strategy whose scope is active (1 outside any scope)."""
    return int(tf.distribute.get_strategy().num_replicas_in_sync)


class TwoTowerModel(tf_keras.Model):
    """Text and image towers trained jointly on the global in-batch similarity matrix (see module docstring).

    Args:
        text_tower / image_tower: :class:`Tower` triples (preprocessor, core, encoder) sharing weights.
        augmentation: :class:`ImageAugmentation` applied to decoded pixels in ``train_step`` only (or None).
        logit_scale: λ (initial value if learned).
        learn_logit_scale: learn ``log λ`` (updated by the text optimizer), capped at ``max_logit_scale``.
        logit_bias: b of ``l = λ·S + b`` for a loss with a logit bias (SigLIP; initial value if learned), or None.
        learn_logit_bias: learn b (updated by the text optimizer); the model then applies λ and b itself.
    """

    def __init__(
        self,
        text_tower: Tower,
        image_tower: Tower,
        augmentation: ImageAugmentation | None = None,
        logit_scale: float = DEFAULT_LOGIT_SCALE,
        learn_logit_scale: bool = False,
        max_logit_scale: float = DEFAULT_MAX_LOGIT_SCALE,
        logit_bias: float | None = None,
        learn_logit_bias: bool = False,
        name: str = "two_tower",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self.text_preprocessor, self.text_core, self.text_encoder = text_tower
        self.image_preprocessor, self.image_core, self.image_encoder = image_tower
        self.augmentation = augmentation if augmentation is not None and augmentation.active else None
        self.learn_logit_scale = bool(learn_logit_scale)
        self.max_logit_scale = float(max_logit_scale)
        self.initial_logit_scale = float(logit_scale)
        if self.learn_logit_scale:
            self.log_logit_scale = self.add_weight(
                name="log_logit_scale",
                shape=(),
                dtype=tf.float32,
                initializer=tf_keras.initializers.Constant(math.log(logit_scale)),
                trainable=True,
            )
        self._init_logit_bias(logit_bias, learn_logit_bias)
        # λ and b: the objective's, with this model's variables (tracked here as log_logit_scale and logit_bias:
        # checkpoints restore)
        self._scale = LogitScale(
            logit_scale,
            self.learn_logit_scale,
            max_logit_scale,
            self.log_logit_scale if self.learn_logit_scale else None,
        )
        self.objective = None
        self.text_optimizer = None
        self.image_optimizer = None
        self._loss_scaling = False
        self._core_jit = False
        self.embedding_chunk = 0
        self.on_bad_batch = "stop"
        self._skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self._loss_tracker = tf_keras.metrics.Mean(name="loss")
        self._recall_tracker = tf_keras.metrics.Mean(name="in_batch_recall_at_1")
        self.built = True

    # ----------------------------------------------------------------------------------------------- inference
    @property
    def logit_scale(self) -> tf.Tensor:
        """λ as a float32 scalar tensor (the learned value, capped, if ``learn_logit_scale``)."""
        return self._scale()

    @property
    def retrieval_loss(self) -> tf_keras.losses.Loss | None:
        """The compiled loss (the objective's), or None before ``compile``."""
        return None if self.objective is None else self.objective.loss

    @property
    def loss_partition(self) -> str:
        return "replicated" if self.objective is None else self.objective.partition

    # The logit bias b (SigLIP): the objective's, lent this model's variable (weight ``logit_bias``).
    def _init_logit_bias(self, logit_bias: float | None, learn: bool) -> None:
        if learn and logit_bias is None:
            raise ValueError("learn_logit_bias=True needs logit_bias, the initial value of b (SigLIP: -10)")
        self.learn_logit_bias = bool(learn)
        self.initial_logit_bias = None if logit_bias is None else float(logit_bias)
        variable = None
        if self.learn_logit_bias:
            variable = self.logit_bias_variable = self.add_weight(
                name="logit_bias",
                shape=(),
                dtype=tf.float32,
                initializer=tf_keras.initializers.Constant(self.initial_logit_bias),
                trainable=True,
            )
        self._bias = None if logit_bias is None else LogitBias(logit_bias, self.learn_logit_bias, variable)

    @property
    def logit_bias(self) -> tf.Tensor | None:
        """b as a float32 scalar tensor (the learned value if ``learn_logit_bias``), or None without a bias."""
        return None if self._bias is None else self._bias()

    def call(self, inputs: dict, training: bool = False) -> dict[str, tf.Tensor]:
        """``{"caption": [B] str, "image": [B] bytes}`` -> ``{"text": [B, d], "image": [B, d]}`` (either key may
        be absent). No augmentation, whatever ``training`` says."""
        if not isinstance(inputs, dict):
            raise TypeError(
                f"TwoTowerModel expects a dict with '{CAPTION}' and/or '{IMAGE}', got {type(inputs).__name__}"
            )
        outputs = {}
        if CAPTION in inputs:
            outputs["text"] = self.text_core(self.text_preprocessor(inputs[CAPTION]), training=training)
        if IMAGE in inputs:
            outputs["image"] = self.image_core(self.image_preprocessor(inputs[IMAGE]), training=training)
        if not outputs:
            raise KeyError(f"TwoTowerModel: inputs have neither '{CAPTION}' nor '{IMAGE}' (keys: {sorted(inputs)})")
        return outputs

    # ------------------------------------------------------------------------------------------------ training
    def compile(
        self,
        loss=None,
        text_optimizer=None,
        image_optimizer=None,
        jit_compile: bool = False,
        on_bad_batch: str = "stop",
        embedding_chunk: int | None = None,
        loss_partition: str = "replicated",
        loss_tile_size: int | str = 0,
        regularizers=None,
        **kwargs,
    ) -> None:
        """Sets the retrieval loss and the two optimizers.

        ``loss``: a Keras loss on ``(relevance, S)``, normally built by :class:`ce_retrieval.tasks.RetrievalTask`
        (which gives it λ₀ = ``logit_scale``); the model's objective gives a loss with a logit scale the current λ
        (and b) at every call; a fixed λ (b) must be the loss's own.
        ``jit_compile``: XLA-compile the numeric part of the step (towers, gather, loss, gradients). Refused, with
        the layers named, when op determinism is on and a tower max-pools: XLA has no deterministic max-pool
        gradient (TensorFlow fails only at the first step, with an error about a GPU kernel even on a CPU).
        ``on_bad_batch``: a step whose loss or gradients are NaN/Inf, or whose batch has no positive pair, is
        never applied silently (XLA drops the losses' own checks): ``"stop"`` raises an error naming the step;
        ``"skip"`` leaves the weights unchanged and counts it in the ``skipped_steps`` log (one replica only).
        ``embedding_chunk``: gradient caching with chunks of this many rows (0 or None: off); must divide the
        per-replica batch; towers with dropout are refused (:mod:`ce_retrieval.modeling.grad_cache`).
        ``loss_partition``: ``"replicated"`` (every replica computes the global loss) or ``"sharded"`` (each its own
        rows' share; module docstring); ``"sharded"`` needs a loss that ``supports_sharded``.
        ``loss_tile_size``: ``0`` (dense), a tile width T or ``"auto"``: the loss over column tiles without the
        ``[B, B]`` matrix (a loss that ``supports_tiled``). Both choices are the objective's
        (:class:`ce_retrieval.objective.RetrievalObjective`), which refuses a combination the loss does not have.
        ``regularizers``: ``[(weight, loss)]`` added to the loss on the text × image cosine matrix, before λ and b
        (``ThresholdConsistentMargin``: its margins are cosines); built from ``loss.regularizers`` by the task.
        Other keyword arguments go to ``tf_keras.Model.compile`` (e.g. ``steps_per_execution``).
        """
        if on_bad_batch not in BAD_BATCH_POLICIES:
            raise ValueError(f"on_bad_batch must be one of {BAD_BATCH_POLICIES}, got {on_bad_batch!r}")
        if on_bad_batch == "skip" and num_replicas_in_scope() > 1:
            raise ValueError(
                "on_bad_batch='skip' is supported on one replica; under a multi-replica strategy use 'stop' "
                "(the run stops with an error naming the step and resumes from its last backup)"
            )
        chunk = int(embedding_chunk or 0)
        if chunk < 0:
            raise ValueError(f"embedding_chunk must be >= 0 (0 or None: off), got {embedding_chunk!r}")
        dropout = grad_cache.dropout_layers(self.text_core, self.image_core) if chunk else []
        if dropout:
            raise ValueError(
                "embedding_chunk (gradient caching) runs each chunk's towers twice and needs the same function in "
                f"both passes; dropout draws other masks in the second pass. Set the dropout rates to 0: {dropout}"
            )
        if jit_compile:
            _check_xla_determinism(self.text_core, self.image_core)
        self.on_bad_batch = on_bad_batch
        if text_optimizer is None or image_optimizer is None:
            raise ValueError("TwoTowerModel.compile needs text_optimizer and image_optimizer (see build_optimizers)")
        if text_optimizer is image_optimizer:
            raise ValueError("TwoTowerModel.compile: text_optimizer and image_optimizer must be distinct objects")
        for key in ("optimizer", "metrics", "weighted_metrics", "loss_weights"):
            if kwargs.get(key) is not None:
                raise ValueError(f"TwoTowerModel.compile does not take {key}=; it owns its optimizers and metrics")
        if isinstance(loss, (str, dict)):
            raise TypeError(
                f"TwoTowerModel.compile: pass a loss instance (got {loss!r}); ce_retrieval.tasks.build_loss or "
                "RetrievalTask builds one from a config with this model's λ"
            )
        self.objective = RetrievalObjective(
            loss,
            self._scale,
            partition=loss_partition,
            tile_size=loss_tile_size,
            logit_bias=self._bias,
            regularizers=regularizers,
        )

        policy = tf_keras.mixed_precision.global_policy()
        self._loss_scaling = policy.name == "mixed_float16"
        if self._loss_scaling:
            text_optimizer = _with_loss_scale(text_optimizer)
            image_optimizer = _with_loss_scale(image_optimizer)
        self.text_optimizer = text_optimizer
        self.image_optimizer = image_optimizer
        self._core_jit = bool(jit_compile)
        self.embedding_chunk = chunk
        self._compute_step = self._compute_gradients_cached if chunk else self._compute_gradients
        # autograph=False: the numeric step has no tensor-dependent Python control flow to convert.
        self._compute_gradients_jit = (
            tf.function(self._compute_step, jit_compile=True, autograph=False) if jit_compile else None
        )
        # Keras's own optimizer slot holds the text optimizer (its iterations are the step counter callbacks
        # and TensorBoard read); the image optimizer is tracked as an attribute, so checkpoints hold both.
        super().compile(optimizer=text_optimizer, loss=None, jit_compile=False, **kwargs)
        self._check_variable_partition()
        # Create the slots now (not lazily at the first step) so a checkpoint restore fills them directly.
        self.text_optimizer.build(self.text_variables)
        self.image_optimizer.build(self.image_variables)

    @property
    def text_variables(self) -> list:
        """Variables updated by the text optimizer: the text tower, the learned log logit scale and logit bias."""
        bias = self._bias.trainable_variables if self._bias is not None else []
        return list(self.text_core.trainable_variables) + self._scale.trainable_variables + bias

    @property
    def image_variables(self) -> list:
        """Variables updated by the image optimizer: the image tower."""
        return list(self.image_core.trainable_variables)

    def _check_variable_partition(self):
        text_ids = {id(v) for v in self.text_variables}
        image_ids = {id(v) for v in self.image_variables}
        if text_ids & image_ids:
            raise ValueError("TwoTowerModel: a variable is shared between the text and image towers")
        orphans = [v.name for v in self.trainable_variables if id(v) not in text_ids | image_ids]
        if orphans:
            raise ValueError(
                f"TwoTowerModel: trainable variables in neither tower (no optimizer updates them): {orphans}"
            )

    @property
    def metrics(self) -> list:
        return [self._loss_tracker, self._recall_tracker]

    def _prepare(self, data, augment: bool):
        """String inputs -> (BERT input dict, pixels, ids); not XLA-compilable (string ops, keras-cv loops).

        Images come as bytes (``"image"``, decoded here) or already decoded by the input pipeline (``"pixels"``,
        ``data.train_pipeline(decode=...)``), which takes the decoding out of the step."""
        if isinstance(data, (tuple, list)):
            data = data[0]
        image_key = PIXELS if PIXELS in data else IMAGE
        missing = [k for k in (CAPTION, image_key, IMAGE_ID) if k not in data]
        if missing:
            raise KeyError(
                f"TwoTowerModel: training batches need {CAPTION!r}, {IMAGE!r} (or decoded {PIXELS!r}) and "
                f"{IMAGE_ID!r}; missing {missing}"
            )
        text_inputs = self.text_preprocessor(data[CAPTION])
        pixels = self._decoded(data[PIXELS]) if image_key == PIXELS else self.image_preprocessor(data[IMAGE])
        if augment and self.augmentation is not None:
            pixels = self.augmentation(pixels)
        return text_inputs, pixels, tf.cast(data[IMAGE_ID], tf.int64)

    def _decoded(self, pixels) -> tf.Tensor:
        """Pipeline-decoded pixels, checked against what this model's decoder would have made: float [B, S, S, 3]."""
        pixels = tf.convert_to_tensor(pixels)
        size = self.image_preprocessor.image_size
        if not pixels.dtype.is_floating or pixels.shape.rank != 4 or tuple(pixels.shape[1:]) != (size, size, 3):
            raise ValueError(
                f"TwoTowerModel: decoded {PIXELS!r} must be float [batch, {size}, {size}, 3] in [0, 1] (the image "
                f"tower's size), got {pixels.dtype.name} {pixels.shape}"
            )
        return tf.cast(pixels, tf.float32)

    def regularization_loss(self) -> tf.Tensor:
        """Σ of the towers' regularisers (0 without any): identical on every replica, part of the global loss."""
        if not self.losses:
            return tf.constant(0.0, tf.float32)
        return tf.add_n([tf.cast(x, tf.float32) for x in self.losses])

    def objective_terms(self, text, image, ids) -> tuple:
        """This replica's embeddings -> ``(logged loss, share to differentiate, recall@1, has positive)``: the
        objective's, plus the towers' regularisers (in the loss, and ``1/R`` of them in the share)."""
        result = self.objective(text, image, ids)
        regularization = self.regularization_loss()
        share = result.share + regularization / float(num_replicas())
        return result.loss + regularization, share, result.recall_at_1, result.has_positive

    def _global_loss(self, text_inputs, pixels, ids, training: bool):
        """Towers -> :meth:`objective_terms`."""
        text = self.text_core(text_inputs, training=training)
        image = self.image_core(pixels, training=training)
        return self.objective_terms(text, image, ids)

    def _compute_gradients(self, text_inputs, pixels, ids):
        text_vars, image_vars = self.text_variables, self.image_variables
        with tf.GradientTape(persistent=self._loss_scaling) as tape:
            loss, share, recall, has_positive = self._global_loss(text_inputs, pixels, ids, True)
            if self._loss_scaling:
                scaled_text = self.text_optimizer.get_scaled_loss(share)
                scaled_image = self.image_optimizer.get_scaled_loss(share)
        if self._loss_scaling:
            text_grads = self.text_optimizer.get_unscaled_gradients(tape.gradient(scaled_text, text_vars))
            image_grads = self.image_optimizer.get_unscaled_gradients(tape.gradient(scaled_image, image_vars))
            del tape
        else:
            grads = tape.gradient(share, text_vars + image_vars)
            text_grads, image_grads = grads[: len(text_vars)], grads[len(text_vars) :]
        return loss, recall, has_positive, text_grads, image_grads

    def _compute_gradients_cached(self, text_inputs, pixels, ids):
        """:meth:`_compute_gradients` with gradient caching (chunks of ``embedding_chunk`` rows)."""
        return grad_cache.cached_gradients(self, text_inputs, pixels, ids, self.embedding_chunk)

    def train_step(self, data) -> dict[str, tf.Tensor]:
        if self.objective is None:
            raise RuntimeError("TwoTowerModel: call compile(loss=..., text_optimizer=..., image_optimizer=...) first")
        text_inputs, pixels, ids = self._prepare(data, augment=True)
        compute = self._compute_gradients_jit if self._core_jit else self._compute_step
        loss, recall, has_positive, text_grads, image_grads = compute(text_inputs, pixels, ids)
        finite = self._finite(loss, text_grads + image_grads)
        if self.on_bad_batch == "stop":
            step = self.text_optimizer.iterations
            checks = [
                tf.debugging.Assert(finite, ["training step", step, BAD_BATCH_NONFINITE], name="nonfinite_step"),
                tf.debugging.Assert(has_positive, ["training step", step, BAD_BATCH_NO_POSITIVE], name="empty_step"),
            ]
            with tf.control_dependencies(checks):
                self._apply(text_grads, image_grads)
        else:  # skip: no update (like dynamic loss scaling on overflow), counted in the logs
            ok = tf.logical_and(finite, has_positive)
            tf.cond(ok, lambda: self._apply(text_grads, image_grads), lambda: tf.no_op())
            self._skipped_steps.assign_add(tf.cast(tf.logical_not(ok), tf.int64))
        return self._update_metrics(loss, recall)

    def _finite(self, loss, grads):
        """Loss and gradients finite (with the objective's has-positive flag, computed inside the compiled step and
        checked out of it, because XLA compiles the losses' own asserts away). Under dynamic loss scaling an
        overflowing gradient is the optimizer's business (it skips the step and lowers the scale), so only the
        loss counts."""
        finite = tf.reduce_all(tf.math.is_finite(loss))
        if not self._loss_scaling:
            for g in grads:
                if g is not None:
                    finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))))
        return finite

    def _apply(self, text_grads, image_grads):
        self.text_optimizer.apply_gradients(zip(text_grads, self.text_variables, strict=True))
        self.image_optimizer.apply_gradients(zip(image_grads, self.image_variables, strict=True))
        return tf.no_op()

    def test_step(self, data) -> dict[str, tf.Tensor]:
        if self.objective is None:
            raise RuntimeError("TwoTowerModel: call compile(...) before evaluate()")
        text_inputs, pixels, ids = self._prepare(data, augment=False)
        loss, _, recall, _ = self._global_loss(text_inputs, pixels, ids, False)
        return self._update_metrics(loss, recall)

    def predict_step(self, data) -> dict[str, tf.Tensor]:
        if isinstance(data, (tuple, list)):
            data = data[0]
        return self(data, training=False)

    def _update_metrics(self, loss, recall):
        # Every replica holds the global loss L (sharded: R·share_r, whose mean is L); the Mean tracker aggregates.
        self._loss_tracker.update_state(loss)
        self._recall_tracker.update_state(recall)
        logs = {m.name: m.result() for m in self.metrics}
        if self.on_bad_batch == "skip":
            logs["skipped_steps"] = self._skipped_steps.read_value()
        if self.learn_logit_scale:
            logs["logit_scale"] = self.logit_scale
        if self.learn_logit_bias:
            logs["logit_bias"] = self.logit_bias
        return logs


def _op_determinism_enabled() -> bool:
    from tensorflow.python.framework import config as tf_config

    return bool(tf_config.is_op_determinism_enabled())


def _check_xla_determinism(*towers) -> None:
    """Raises when an XLA-compiled step cannot be both deterministic and differentiated through a max-pooling
    layer (no deterministic XLA MaxPoolGrad): with op determinism on, a max-pool whose enclosing block has
    trainable weights (a frozen backbone needs no gradient through its pools)."""
    if not _op_determinism_enabled():
        return
    pools = []
    for tower in towers:
        modules = [tower, *tower.submodules]
        for pool in (m for m in modules if type(m).__name__ in ("MaxPooling2D", "MaxPool2D")):
            owner = min((m for m in modules if any(s is pool for s in m.submodules)), key=lambda m: len(m.submodules))
            if owner.trainable_variables:
                pools.append(pool.name)
    if pools:
        raise ValueError(
            f"jit_compile=True with op determinism on cannot train this model: XLA has no deterministic gradient "
            f"for its max-pooling layers ({', '.join(sorted(set(pools)))}). Set train.deterministic: false (the "
            "same seed may then train a model that differs in the last bits) or train.jit_compile: false"
        )


def _with_loss_scale(optimizer):
    if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
        return optimizer
    return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)


__all__ = ["TwoTowerModel"]

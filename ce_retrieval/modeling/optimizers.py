"""The paper's two optimizers (Veit & Wilber 2020 §4.2, after Zhang et al. "Why Adam beats SGD for attention").

* text tower (Transformer): AdamW, lr linearly warmed up over 1,500 steps to 1e-4, then linearly decayed to 0;
* image tower (ResNet): SGD with momentum 0.9, lr linearly decayed from 3e-3 to 5e-4.

Both are ``tf.keras`` optimizers with :class:`~ce_retrieval.modeling.schedules.WarmupLinearDecay` schedules, so
they serialise and their slots and ``iterations`` are saved by ``tf.train.Checkpoint`` / ``BackupAndRestore``
through the model (``TwoTowerModel.text_optimizer`` / ``.image_optimizer``). Loss scaling for ``mixed_float16``
is added by ``TwoTowerModel.compile`` (one ``LossScaleOptimizer`` per optimizer).

The text optimizer also updates the objective's learned scalars, ``log λ`` and SigLIP's ``b``; it never
weight-decays them (:data:`NEVER_DECAYED`, whatever ``text_exclude_from_weight_decay`` says), as CLIP and SigLIP
never decay their temperature and bias: decay would pull λ towards 1 and b towards 0.
"""

from __future__ import annotations

import tf_keras

from ce_retrieval.modeling.config import OptimizerConfig
from ce_retrieval.modeling.schedules import WarmupLinearDecay

#: Variable-name patterns never weight-decayed: the learned ``log_logit_scale`` (log λ) and ``logit_bias`` (b), the
#: names ``TwoTowerModel``, ``LogitScale`` and ``LogitBias`` give them (``re.search`` on the variable's name, also
#: on a mirrored variable's per-replica ``.../replica_1:0``, which is what the optimizer decays).
NEVER_DECAYED = (r"(^|/)log_logit_scale", r"(^|/)logit_bias")


def build_optimizers(
    opt_cfg: OptimizerConfig, total_steps: int
) -> tuple[tf_keras.optimizers.Optimizer, tf_keras.optimizers.Optimizer]:
    """``(text_optimizer, image_optimizer)`` for a run of ``total_steps`` steps."""
    if total_steps <= 0:
        raise ValueError(f"build_optimizers: total_steps must be positive, got {total_steps}")
    text_schedule = WarmupLinearDecay(
        opt_cfg.text_learning_rate,
        total_steps,
        warmup_steps=min(opt_cfg.text_warmup_steps, total_steps),
        end_learning_rate=opt_cfg.text_end_learning_rate,
        name="text_lr",
    )
    image_schedule = WarmupLinearDecay(
        opt_cfg.image_learning_rate,
        total_steps,
        warmup_steps=min(opt_cfg.image_warmup_steps, total_steps),
        end_learning_rate=opt_cfg.image_end_learning_rate,
        name="image_lr",
    )
    text_optimizer = tf_keras.optimizers.AdamW(
        learning_rate=text_schedule,
        weight_decay=opt_cfg.text_weight_decay,
        beta_1=opt_cfg.text_beta_1,
        beta_2=opt_cfg.text_beta_2,
        epsilon=opt_cfg.text_epsilon,
        global_clipnorm=opt_cfg.global_clipnorm,
        name="text_adamw",
    )
    if opt_cfg.text_weight_decay:  # one call: a second one would replace the first's names
        excluded = [*NEVER_DECAYED, *(opt_cfg.text_exclude_from_weight_decay or [])]
        text_optimizer.exclude_from_weight_decay(var_names=excluded)
    image_optimizer = tf_keras.optimizers.SGD(
        learning_rate=image_schedule,
        momentum=opt_cfg.image_momentum,
        nesterov=opt_cfg.image_nesterov,
        weight_decay=opt_cfg.image_weight_decay or None,
        global_clipnorm=opt_cfg.global_clipnorm,
        name="image_sgd",
    )
    return text_optimizer, image_optimizer


__all__ = ["NEVER_DECAYED", "build_optimizers"]

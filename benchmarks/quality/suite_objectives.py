"""The objectives of the calibration suite, by name, and how each is built in the two regimes.

An objective is data: a registered loss (``ce_retrieval.losses``, by name) with its hyper-parameters, optionally a
regulariser added to it (``total = loss(R, S) + reg(R, S)``, by name) and optionally a temperature t and bias b
learned with the model (SigLIP's ``t·s + b``, init t = 10, b = -10). λ is 20 for every loss with a logit scale.

    SS      SampledSoftmax                      CE      CrossExampleSoftmax
    SNM     StochasticNegativeMining (0.5)      CENM    CrossExampleNegativeMining (0.5)
    CLIP    SymmetricInfoNCE (τ = 1/λ)          SigLIP  SigmoidLoss, learned t and b
    SS+TCM  SS + ThresholdConsistentMargin      CE+TCM  CE + ThresholdConsistentMargin
    recipe  part 3's recipe: a placeholder filled with ``--recipe '{"loss": ..., "kwargs": {...}}'``

An objective whose loss or regulariser is not registered, or that the training configuration cannot express,
is *not available*: :func:`unavailable` says why, and the suite prints that line and skips it (nothing is
faked). In the heads regime the objective is applied to ``S`` directly; in the scratch regime it becomes the
config overrides of the real training job (:func:`scratch_overrides`), which expects the regulariser under
``loss.regularizers`` and the learned bias as ``model.logit_bias`` / ``model.learn_logit_bias``.
"""

from __future__ import annotations

import dataclasses
import math

SCALE = 20.0


@dataclasses.dataclass(frozen=True)
class Objective:
    loss: str
    kwargs: tuple = ()  # (key, value) pairs: hashable, frozen
    regularizer: str | None = None
    learned_scale_bias: tuple | None = None  # (t, b) initial values, learned with the model

    @property
    def loss_kwargs(self) -> dict:
        return dict(self.kwargs)

    def describe(self) -> dict:
        return {
            "loss": self.loss,
            "kwargs": self.loss_kwargs,
            "regularizer": self.regularizer,
            "learned_scale_bias": self.learned_scale_bias,
        }


OBJECTIVES: dict[str, Objective] = {
    "SS": Objective("SampledSoftmax"),
    "SNM": Objective("StochasticNegativeMining", (("negative_fraction", 0.5),)),
    "CE": Objective("CrossExampleSoftmax"),
    "CENM": Objective("CrossExampleNegativeMining", (("negative_fraction", 0.5),)),
    "CLIP": Objective("SymmetricInfoNCE"),
    "SigLIP": Objective("SigmoidLoss", learned_scale_bias=(10.0, -10.0)),
    "SS+TCM": Objective("SampledSoftmax", regularizer="ThresholdConsistentMargin"),
    "CE+TCM": Objective("CrossExampleSoftmax", regularizer="ThresholdConsistentMargin"),
}
RECIPE = "recipe"
BASELINE = "SS"


def recipe_objective(spec: dict) -> Objective:
    """The ``recipe`` slot from ``{"loss": name, "kwargs": {...}, "regularizer": name or None}``."""
    unknown = sorted(set(spec) - {"loss", "kwargs", "regularizer"})
    if "loss" not in spec or unknown:
        raise ValueError(f"--recipe needs a 'loss' and takes only loss / kwargs / regularizer, got {sorted(spec)}")
    return Objective(spec["loss"], tuple(sorted((spec.get("kwargs") or {}).items())), spec.get("regularizer"))


def _registered(name: str) -> str | None:
    from ce_retrieval import losses

    try:
        losses.lookup(name)
    except (ValueError, KeyError):
        return f"{name} is not registered in ce_retrieval.losses"
    return None


def unavailable(objective: Objective, regime: str, base_config=None) -> str | None:
    """Why ``objective`` cannot run in ``regime`` ("heads" or "scratch"), or None when it can."""
    for name in filter(None, (objective.loss, objective.regularizer)):
        reason = _registered(name)
        if reason:
            return reason
    if regime == "scratch":
        from ce_retrieval import configs
        from ce_retrieval.tasks.loss_wiring import build_loss

        try:
            cfg = configs.merge(base_config, scratch_overrides(objective))
            build_loss(cfg.loss, cfg.model)
        except Exception as exc:  # noqa: BLE001  (any refusal of the config is the reason to report)
            return f"the training configuration cannot express it yet ({type(exc).__name__}: {exc})"
    return None


def scratch_overrides(objective: Objective) -> dict:
    """Config overrides of the real training job for ``objective`` (on top of the demo config)."""
    loss: dict = {"name": objective.loss, "kwargs": objective.loss_kwargs}
    if objective.regularizer:
        loss["regularizers"] = [{"name": objective.regularizer, "kwargs": {}}]
    out: dict = {"loss": loss, "model": {"logit_scale": SCALE, "learn_logit_scale": False}}
    if objective.learned_scale_bias:
        t, b = objective.learned_scale_bias
        out["model"] = {"logit_scale": t, "learn_logit_scale": True, "logit_bias": b, "learn_logit_bias": True}
    return out


def heads_loss(objective: Objective, scale: float = SCALE):
    """``(loss_fn(R, S), extra_variables)`` for the heads regime: the registered loss with λ = ``scale`` (or
    given a learned t and b at call), plus the regulariser."""
    import tensorflow as tf

    from ce_retrieval import losses
    from ce_retrieval.configs.experiment import LossConfig
    from ce_retrieval.modeling import ModelConfig
    from ce_retrieval.tasks.loss_wiring import build_loss

    extra: list = []
    if objective.learned_scale_bias:
        t, b = objective.learned_scale_bias
        model = ModelConfig(logit_scale=t, learn_logit_scale=True, logit_bias=b, learn_logit_bias=True)
        base = build_loss(LossConfig(name=objective.loss, kwargs=objective.loss_kwargs), model)
        log_t = tf.Variable(math.log(t), dtype=tf.float32, name="log_temperature")
        bias = tf.Variable(float(b), dtype=tf.float32, name="logit_bias")
        extra = [log_t, bias]

        def loss_fn(relevance, scores):  # the learned t and b given at call, as the retrieval objective gives them
            return base.call(relevance, scores, logit_scale=tf.exp(log_t), logit_bias=tf.identity(bias))
    else:
        base = build_loss(LossConfig(name=objective.loss, kwargs=objective.loss_kwargs), ModelConfig(logit_scale=scale))
        loss_fn = base
    if objective.regularizer:
        regularizer = losses.get(objective.regularizer)
        unregularised = loss_fn

        def loss_fn(relevance, scores):
            return unregularised(relevance, scores) + regularizer(relevance, scores)

    return loss_fn, extra

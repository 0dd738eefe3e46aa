"""The loss of a two-tower experiment, built from ``loss`` and ``model`` of the config, with λ set in one place.

λ, the logit scale of ``l = λ·S``, has one home: ``model.logit_scale`` (``model.learn_logit_scale`` makes it a
learned variable of the model). A loss that declares ``has_logit_scale`` receives it through its own
``logit_scale_kwargs(λ)`` — ``scale=λ`` for the softmax family, ``temperature=1/λ`` for InfoNCE,
``scale=λ/2`` for NCA (which scales d² = 2 − 2s): λ₀, learned or not (a learned λ is given to the loss at every
call by the retrieval objective, ``losses/base.py``, "λ and b at call"). A loss without a logit scale simply has
none. ``loss.kwargs`` holds every other hyper-parameter; a λ key there, or a key
the loss does not take, is an error that names it and lists what the loss accepts.

b, the logit bias of ``l = λ·S + b`` (SigLIP), has one home too: ``model.logit_bias``, given to a loss that
declares ``has_logit_bias`` through ``logit_bias_kwargs(b)`` (``bias=b``); such a loss needs it set, and any other
loss refuses it: b₀, learned or not, like λ.

``loss.regularizers`` (:func:`build_regularizers`) are terms ``weight · R(relevance, cos)`` that the retrieval
objective adds to the loss on the text × image cosine matrix, before λ and b: Threshold-Consistent Margin's
margins are cosines, so it sees cosines whether λ is fixed, learned or absent (dense replicated
path only). A regulariser is a registered loss without a logit scale, proxies or a Gram matrix.

In the two-tower model the columns of S are the batch's images. Proxy losses (``needs_proxies``) read them as
one centre per image (so SoftTriple's ``proxies_per_class`` is 1); losses that need a Gram matrix of one
embedding set (``needs_gram``) are given the joint Gram matrix of ``[text; image]`` by the retrieval objective
(``ce_retrieval.objective``), which also gives the loss a learned λ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ce_retrieval import losses

if TYPE_CHECKING:
    from ce_retrieval.configs.experiment import LossConfig
    from ce_retrieval.losses.base import RetrievalLoss
    from ce_retrieval.modeling.config import ModelConfig


def loss_parameters(cls) -> list[str]:
    """The keyword arguments ``cls(...)`` accepts: its hyper-parameters, ``name`` and (where supported)
    ``bidirectional``."""
    return [*cls.hyperparameter_names(), "name", *(["bidirectional"] if cls.supports_bidirectional else [])]


def build_loss(loss_cfg: LossConfig, model_cfg: ModelConfig) -> RetrievalLoss:
    """The configured loss, with λ from ``model_cfg`` (see the module docstring).

    Args:
      loss_cfg: ``LossConfig`` (``name``: any registered loss, ``kwargs``: its hyper-parameters except λ).
      model_cfg: ``ModelConfig`` (``logit_scale``, ``learn_logit_scale``, ``logit_bias``, ``learn_logit_bias``).
    """
    cls = losses.lookup(loss_cfg.name)
    kwargs = dict(loss_cfg.kwargs or {})
    accepted = loss_parameters(cls)
    scale_keys = sorted(cls.logit_scale_kwargs(1.0)) + sorted(cls.logit_bias_kwargs(0.0))
    for key in sorted(cls.logit_bias_kwargs(0.0)):
        if key in kwargs:
            raise ValueError(
                f"loss.kwargs.{key}: the logit bias b has one home, model.logit_bias, which gives {cls.__name__} its "
                f"{key!r}; remove loss.kwargs.{key}"
            )
    for key in sorted(cls.logit_scale_kwargs(1.0)):
        if key in kwargs:
            raise ValueError(
                f"loss.kwargs.{key}: the logit scale λ has one home, model.logit_scale "
                f"(= {model_cfg.logit_scale:g}), which gives {cls.__name__} its {key!r}; remove loss.kwargs.{key}"
            )
    unknown = sorted(k for k in kwargs if k not in accepted or k == "name")
    if unknown:
        takes = ", ".join(k for k in accepted if k not in scale_keys and k != "name") or "no hyper-parameters"
        raise ValueError(f"loss.kwargs: {cls.__name__} does not take {', '.join(unknown)}; it takes {takes}")
    _check_logit_bias(cls, model_cfg)
    if model_cfg.learn_logit_scale and not cls.has_logit_scale:
        with_scale = ", ".join(n for n in losses.available() if losses.lookup(n).has_logit_scale)
        raise ValueError(
            f"model.learn_logit_scale=True gives the loss a learned λ, which only a loss with a logit scale uses; "
            f"{cls.__name__} has none (losses with one: {with_scale})"
        )
    if cls.has_logit_scale:
        kwargs.update(cls.logit_scale_kwargs(model_cfg.logit_scale))
    if cls.has_logit_bias:
        kwargs.update(cls.logit_bias_kwargs(model_cfg.logit_bias))
    if cls.needs_proxies and "proxies_per_class" in accepted:
        per_class = int(kwargs.setdefault("proxies_per_class", 1))
        if per_class != 1:
            raise ValueError(
                f"loss.kwargs.proxies_per_class={per_class}: in the two-tower model each image embedding is the only "
                f"centre of its class, so {cls.__name__} needs proxies_per_class=1"
            )
    return cls(**kwargs)


def build_regularizers(loss_cfg: LossConfig) -> list[tuple[float, RetrievalLoss]]:
    """``[(weight, loss)]`` of ``loss_cfg.regularizers``, each a registered loss on cosines (module docstring)."""
    out = []
    for i, entry in enumerate(loss_cfg.regularizers or []):
        where = f"loss.regularizers[{i}]"
        cls = losses.lookup(entry.name)
        if cls.has_logit_scale or cls.needs_proxies or cls.needs_gram:
            need = "a logit scale" if cls.has_logit_scale else "proxies" if cls.needs_proxies else "a Gram matrix"
            raise ValueError(
                f"{where}: a regulariser is added on the text × image cosine matrix as is; {cls.__name__} has "
                f"{need}. Use a loss without (e.g. ThresholdConsistentMargin)"
            )
        kwargs = dict(entry.kwargs or {})
        accepted = [k for k in loss_parameters(cls) if k != "name"]
        unknown = sorted(k for k in kwargs if k not in accepted)
        if unknown:
            raise ValueError(
                f"{where}.kwargs: {cls.__name__} does not take {', '.join(unknown)}; it takes "
                f"{', '.join(accepted) or 'no hyper-parameters'}"
            )
        out.append((float(entry.weight), cls(**kwargs)))
    return out


def _check_logit_bias(cls, model_cfg: ModelConfig) -> None:
    """``model.logit_bias`` / ``learn_logit_bias`` only for a loss with a bias, which needs ``logit_bias`` set."""
    with_bias = ", ".join(n for n in losses.available() if losses.lookup(n).has_logit_bias)
    if not cls.has_logit_bias and (model_cfg.logit_bias is not None or model_cfg.learn_logit_bias):
        raise ValueError(
            f"model.logit_bias / model.learn_logit_bias add a bias b to the logits, which only a loss with a logit "
            f"bias uses; {cls.__name__} has none (losses with one: {with_bias}). Set model.logit_bias: null"
        )
    if cls.has_logit_bias and model_cfg.logit_bias is None:
        raise ValueError(
            f"{cls.__name__} adds a bias b to its logits λ·S + b, whose one home is model.logit_bias (null here); "
            "set it, e.g. SigLIP's recipe: model.logit_scale: 10, model.learn_logit_scale: true, "
            "model.logit_bias: -10, model.learn_logit_bias: true (configs/synthetic_siglip.yaml)"
        )


__all__ = ["build_loss", "build_regularizers", "loss_parameters"]

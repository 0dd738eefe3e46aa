"""The loss of a two-tower experiment, built from ``loss`` and ``model`` of the config, with λ set in one place.

λ, the logit scale of ``l = λ·S``, has one home: ``model.logit_scale`` (``model.learn_logit_scale`` makes it a
learned variable of the model). A loss that declares ``has_logit_scale`` receives it through its own
``logit_scale_kwargs(λ)`` — ``scale=λ`` for the softmax family, ``temperature=1/λ`` for InfoNCE,
``scale=λ/2`` for NCA (which scales d² = 2 − 2s) — or λ = 1 when the model applies a learned λ itself. A loss
without a logit scale simply has none. ``loss.kwargs`` holds every other hyper-parameter; a λ key there, or a key
the loss does not take, is an error that names it and lists what the loss accepts.

In the two-tower model the columns of S are the batch's images. Proxy losses (``needs_proxies``) read them as
one centre per image (so SoftTriple's ``proxies_per_class`` is 1); losses that need a Gram matrix of one
embedding set (``needs_gram``) are given the joint Gram matrix of ``[text; image]`` by the retrieval objective
(``ce_retrieval.objective``), which also applies a learned λ.
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
      model_cfg: ``ModelConfig`` (``logit_scale``, ``learn_logit_scale``).
    """
    cls = losses.lookup(loss_cfg.name)
    kwargs = dict(loss_cfg.kwargs or {})
    accepted = loss_parameters(cls)
    scale_keys = sorted(cls.logit_scale_kwargs(1.0))
    for key in scale_keys:
        if key in kwargs:
            raise ValueError(
                f"loss.kwargs.{key}: the logit scale λ has one home, model.logit_scale "
                f"(= {model_cfg.logit_scale:g}), which gives {cls.__name__} its {key!r}; remove loss.kwargs.{key}"
            )
    unknown = sorted(k for k in kwargs if k not in accepted or k == "name")
    if unknown:
        takes = ", ".join(k for k in accepted if k not in scale_keys and k != "name") or "no hyper-parameters"
        raise ValueError(f"loss.kwargs: {cls.__name__} does not take {', '.join(unknown)}; it takes {takes}")
    if model_cfg.learn_logit_scale and not cls.has_logit_scale:
        with_scale = ", ".join(n for n in losses.available() if losses.lookup(n).has_logit_scale)
        raise ValueError(
            f"model.learn_logit_scale=True multiplies S by a learned λ, which only a loss with a logit scale uses; "
            f"{cls.__name__} has none (losses with one: {with_scale})"
        )
    if cls.has_logit_scale:
        kwargs.update(cls.logit_scale_kwargs(1.0 if model_cfg.learn_logit_scale else model_cfg.logit_scale))
    if cls.needs_proxies and "proxies_per_class" in accepted:
        per_class = int(kwargs.setdefault("proxies_per_class", 1))
        if per_class != 1:
            raise ValueError(
                f"loss.kwargs.proxies_per_class={per_class}: in the two-tower model each image embedding is the only "
                f"centre of its class, so {cls.__name__} needs proxies_per_class=1"
            )
    return cls(**kwargs)


__all__ = ["build_loss", "loss_parameters"]

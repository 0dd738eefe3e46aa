"""``build_two_tower``: a :class:`TwoTowerModel` from a :class:`ModelConfig` and a WordPiece vocab file.

Call it inside ``strategy.scope()`` for distributed training (all variables are created here).
"""

from __future__ import annotations

from ce_retrieval.modeling.augmentation import ImageAugmentation
from ce_retrieval.modeling.config import ModelConfig
from ce_retrieval.modeling.image_tower import build_image_tower
from ce_retrieval.modeling.text_tower import build_text_tower
from ce_retrieval.modeling.two_tower import TwoTowerModel


def build_two_tower(
    model_cfg: ModelConfig, vocab_path: str | None, augmentation_seed: int | None = None
) -> TwoTowerModel:
    """The two-tower model of ``model_cfg``; ``vocab_path`` is the text tower's WordPiece vocab (for
    ``text.kind='hub'`` it may be None when the SavedModel ships ``assets/vocab.txt``)."""
    if not isinstance(model_cfg, ModelConfig):
        raise TypeError(f"build_two_tower expects a ModelConfig, got {type(model_cfg).__name__}")
    text_tower = build_text_tower(model_cfg.text, model_cfg.embedding_dim, vocab_path, model_cfg.projection_norm)
    image_tower = build_image_tower(model_cfg.image, model_cfg.embedding_dim, model_cfg.projection_norm)
    augmentation = ImageAugmentation(
        model_cfg.image.augmentation, model_cfg.image.image_size, seed=augmentation_seed, name="image_augmentation"
    )
    return TwoTowerModel(
        text_tower,
        image_tower,
        augmentation=augmentation,
        logit_scale=model_cfg.logit_scale,
        learn_logit_scale=model_cfg.learn_logit_scale,
        max_logit_scale=model_cfg.max_logit_scale,
        logit_bias=model_cfg.logit_bias,
        learn_logit_bias=model_cfg.learn_logit_bias,
    )


__all__ = ["build_two_tower"]

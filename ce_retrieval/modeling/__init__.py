"""The two-tower image-text model (BERT text tower, ResNet image tower), its optimizers and train step.

Public API: the config dataclasses, ``build_two_tower(model_cfg, vocab_path)``, ``TwoTowerModel``,
``build_optimizers(opt_cfg, total_steps)``, ``WarmupLinearDecay``.
"""

from ce_retrieval.modeling.augmentation import ImageAugmentation
from ce_retrieval.modeling.builder import build_two_tower
from ce_retrieval.modeling.config import (
    AugmentationConfig,
    ImageTowerConfig,
    ModelConfig,
    OptimizerConfig,
    TextTowerConfig,
)
from ce_retrieval.modeling.image_tower import ImageDecoder, build_image_tower
from ce_retrieval.modeling.optimizers import build_optimizers
from ce_retrieval.modeling.schedules import WarmupLinearDecay
from ce_retrieval.modeling.similarity import cosine_similarity, gather_from_replicas
from ce_retrieval.modeling.text_tower import TextPreprocessor, Tower, build_text_tower
from ce_retrieval.modeling.two_tower import TwoTowerModel

__all__ = [
    "AugmentationConfig",
    "ImageAugmentation",
    "ImageDecoder",
    "ImageTowerConfig",
    "ModelConfig",
    "OptimizerConfig",
    "TextPreprocessor",
    "TextTowerConfig",
    "Tower",
    "TwoTowerModel",
    "WarmupLinearDecay",
    "build_image_tower",
    "build_optimizers",
    "build_text_tower",
    "build_two_tower",
    "cosine_similarity",
    "gather_from_replicas",
]

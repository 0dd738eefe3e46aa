"""Configuration dataclasses of the two-tower model and its optimizers (defaults = Veit & Wilber 2020, §4.1-4.2).

Plain dataclasses of JSON/YAML-able fields (str, int, float, bool, lists, nested dataclasses), so the experiment
config system can build them from YAML and reject unknown keys. The defaults reproduce the paper:

* text tower: BERT-base (12 layers, hidden 768), WordPiece captions padded/truncated to 32 tokens, the [CLS]
  vector of the last layer projected to d = 128 without bias or activation;
* image tower: ResNet-50 (bottleneck blocks [3, 4, 6, 3]), last layer replaced by a projection to d = 128
  without bias;
* similarity: cosine, logits scaled by a fixed λ = 20;
* optimizers: AdamW 1e-4 with 1,500 linear warm-up steps then linear decay to 0 (text); SGD with momentum 0.9
  and a linear decay 3e-3 -> 5e-4 (image); batch 512 for 25,000 steps in the paper.

Values the paper does not state are marked "not in the paper" below and follow BERT / ResNet fine-tuning
conventions. ``ModelConfig.tiny()`` and ``OptimizerConfig.tiny()`` are small presets for tests and the synthetic
demo (a few seconds per step on a laptop CPU).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field

from ce_retrieval.objective.logit_scale import DEFAULT_LOGIT_SCALE, DEFAULT_MAX_LOGIT_SCALE
from ce_retrieval.utils.dataclass_yaml import from_dict

TEXT_KINDS = ("bert", "hub")
TEXT_POOLINGS = ("cls", "pooled", "mean")
BATCHNORM_MODES = ("train", "frozen", "sync")
RESIZE_MODES = ("center_crop", "stretch")
BLOCK_TYPES = ("block", "basic_block")
PROJECTION_NORMS = ("none", "batchnorm")

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


@dataclasses.dataclass
class TextTowerConfig:
    """Text tower: in-graph WordPiece tokenisation + a BERT encoder + a bias-free projection.

    ``kind='bert'`` builds ``official.nlp.modeling.networks.BertEncoderV2`` with the sizes below, optionally
    restored from ``init_checkpoint`` (a TF2 Model Garden checkpoint written with
    ``tf.train.Checkpoint(encoder=encoder)``). ``kind='hub'`` loads ``hub_handle`` (a TF-Hub URL or a local
    SavedModel directory) through ``hub.KerasLayer``; it must take the BERT dict inputs ``input_word_ids``,
    ``input_mask``, ``input_type_ids`` and return a dict with ``sequence_output`` / ``pooled_output``; the size
    fields are then ignored. The vocab file is passed to the builder (``build_two_tower(cfg, vocab_path)``).
    """

    kind: str = "bert"
    hub_handle: str | None = None
    init_checkpoint: str | None = None
    hidden_size: int = 768
    num_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_activation: str = "gelu"
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    max_seq_length: int = 32
    lower_case: bool = True
    # "cls": the last layer's [CLS] vector (the paper); "pooled": BERT's tanh pooler on top of it; "mean": masked
    # mean of the last layer over the caption's tokens (not in the paper; learns much faster from random init,
    # where BERT's [CLS] vectors of different captions are nearly identical, so the tiny preset uses it).
    pooling: str = "cls"
    trainable: bool = True

    def __post_init__(self):
        _check_choice("text.kind", self.kind, TEXT_KINDS)
        _check_choice("text.pooling", self.pooling, TEXT_POOLINGS)
        if self.kind == "hub" and not self.hub_handle:
            raise ValueError("text.kind='hub' needs text.hub_handle (a TF-Hub URL or a local SavedModel directory)")
        if self.max_seq_length < 3:
            raise ValueError(f"text.max_seq_length must be >= 3 ([CLS] token [SEP]), got {self.max_seq_length}")
        if self.kind == "bert" and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"text.hidden_size ({self.hidden_size}) must be divisible by text.num_attention_heads "
                f"({self.num_attention_heads})"
            )


@dataclasses.dataclass
class AugmentationConfig:
    """Training-time image augmentation (keras-cv layers); never applied by the exported image encoder.

    The paper does not describe its augmentation; these are conservative SimCLR/CLIP-style defaults.
    """

    enabled: bool = True
    random_resized_crop: bool = True
    crop_area_range: list[float] = field(default_factory=lambda: [0.5, 1.0])
    aspect_ratio_range: list[float] = field(default_factory=lambda: [3.0 / 4.0, 4.0 / 3.0])
    horizontal_flip: bool = True
    # Colour jitter strengths (0 disables each): brightness/contrast/saturation deltas and the hue shift.
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.02

    def __post_init__(self):
        for name in ("crop_area_range", "aspect_ratio_range"):
            lo_hi = getattr(self, name)
            if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1]:
                raise ValueError(f"augmentation.{name} must be [low, high] with 0 < low <= high, got {lo_hi}")
        if self.crop_area_range[1] > 1.0:
            raise ValueError(f"augmentation.crop_area_range must lie in (0, 1], got {self.crop_area_range}")
        for name in ("brightness", "contrast", "saturation", "hue"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"augmentation.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclasses.dataclass
class ImageTowerConfig:
    """Image tower: in-graph decoding + keras-cv ResNet backbone + global pooling + a bias-free projection.

    ``weights``: ``None`` (random init), a keras-cv preset name (e.g. ``'resnet50_imagenet'``, downloaded by
    keras-cv on first use, so only where the network is reachable) or a local weights file/checkpoint of the
    same backbone (``.h5`` / ``.weights.h5`` / a TF checkpoint prefix). ``batchnorm``: ``'train'`` (per-replica
    batch statistics), ``'frozen'`` (inference-mode BN, common when fine-tuning a pretrained ResNet with small
    per-replica batches) or ``'sync'`` (statistics over the global batch, ``synchronized=True``).
    """

    image_size: int = 224
    stackwise_filters: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    stackwise_blocks: list[int] = field(default_factory=lambda: [3, 4, 6, 3])
    stackwise_strides: list[int] = field(default_factory=lambda: [1, 2, 2, 2])
    block_type: str = "block"  # bottleneck blocks (ResNet-50); "basic_block" for ResNet-18/34-style towers
    weights: str | None = None
    batchnorm: str = "train"
    resize: str = "center_crop"  # resize the shorter side then crop the centre; "stretch" ignores aspect ratio
    pixel_mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    pixel_std: list[float] = field(default_factory=lambda: list(IMAGENET_STD))
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)
    trainable: bool = True

    def __post_init__(self):
        if isinstance(self.augmentation, dict):  # nested mappings: the one config-from-dict, strictly
            self.augmentation = from_dict(AugmentationConfig, self.augmentation, "augmentation")
        _check_choice("image.batchnorm", self.batchnorm, BATCHNORM_MODES)
        _check_choice("image.resize", self.resize, RESIZE_MODES)
        _check_choice("image.block_type", self.block_type, BLOCK_TYPES)
        lengths = {len(self.stackwise_filters), len(self.stackwise_blocks), len(self.stackwise_strides)}
        if len(lengths) != 1:
            raise ValueError(
                "image.stackwise_filters, stackwise_blocks and stackwise_strides must have the same length, got "
                f"{self.stackwise_filters}, {self.stackwise_blocks}, {self.stackwise_strides}"
            )
        if self.block_type == "basic_block" and self.stackwise_strides[0] == 1 and self.stackwise_filters[0] != 64:
            raise ValueError(
                "image.block_type='basic_block' with stride 1 in the first stage has an identity shortcut from the "
                f"64-channel stem, so image.stackwise_filters[0] must be 64 (got {self.stackwise_filters[0]})"
            )
        if self.image_size < 32:
            raise ValueError(
                f"image.image_size must be >= 32 (the ResNet stem downsamples by 4), got {self.image_size}"
            )
        if len(self.pixel_mean) != 3 or len(self.pixel_std) != 3 or min(self.pixel_std) <= 0:
            raise ValueError("image.pixel_mean and image.pixel_std must have 3 entries (RGB), std > 0")


@dataclasses.dataclass
class ModelConfig:
    """The two-tower model: towers, embedding size d, the logit scale λ and the logit bias b.

    Similarity is the cosine of the L2-normalised embeddings. ``logit_scale`` is the one home of λ (``l = λ·S``):
    the retrieval task gives it to any loss that has a logit scale (``scale=λ``, ``temperature=1/λ``, ...; see
    ``ce_retrieval.tasks``), and a loss without one has none. With ``learn_logit_scale=True`` the model learns
    ``log λ`` (initialised to ``log(logit_scale)``, capped at ``max_logit_scale`` as in CLIP); the loss is built
    with λ₀ = ``logit_scale`` either way and is given the current λ at every call.

    ``logit_bias`` is the one home of b (``l = λ·S + b``), for a loss that declares a bias (``has_logit_bias``:
    ``SigmoidLoss``, which needs it set) and refused for any other; ``None``: no bias. With
    ``learn_logit_bias=True`` the model learns b (initialised to ``logit_bias``), given to the loss at every
    call like λ. SigLIP's recipe (Zhai et al. 2023):
    ``logit_scale: 10, learn_logit_scale: true, logit_bias: -10, learn_logit_bias: true``.

    ``projection_norm``: ``'none'`` (the paper's head) or ``'batchnorm'``, both towers' features standardised
    with batch statistics before the projection (:meth:`Tower.assemble`).
    """

    text: TextTowerConfig = field(default_factory=TextTowerConfig)
    image: ImageTowerConfig = field(default_factory=ImageTowerConfig)
    embedding_dim: int = 128
    logit_scale: float = DEFAULT_LOGIT_SCALE
    learn_logit_scale: bool = False
    max_logit_scale: float = DEFAULT_MAX_LOGIT_SCALE
    logit_bias: float | None = None
    learn_logit_bias: bool = False
    projection_norm: str = "none"

    def __post_init__(self):
        if isinstance(self.text, dict):  # nested mappings: the one config-from-dict, strictly
            self.text = from_dict(TextTowerConfig, self.text, "text")
        if isinstance(self.image, dict):
            self.image = from_dict(ImageTowerConfig, self.image, "image")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be positive, got {self.embedding_dim}")
        if not 0 < self.logit_scale <= self.max_logit_scale:
            raise ValueError(
                f"logit_scale must be in (0, max_logit_scale={self.max_logit_scale}], got {self.logit_scale}"
            )
        if self.learn_logit_bias and self.logit_bias is None:
            raise ValueError("model.learn_logit_bias needs model.logit_bias, its initial value (SigLIP: -10)")
        if self.logit_bias is not None and not math.isfinite(self.logit_bias):
            raise ValueError(f"model.logit_bias must be a finite number or null, got {self.logit_bias}")
        _check_choice("model.projection_norm", self.projection_norm, PROJECTION_NORMS)

    @classmethod
    def tiny(cls, **overrides) -> ModelConfig:
        """A CPU-fast model trained from scratch: 2-layer BERT (hidden 64, mean pooling), 4-stage ResNet with one
        small bottleneck block each
        (filters 8-64, 256 output channels), 64x64 images, d = 32."""
        cfg = cls(
            text=TextTowerConfig(
                hidden_size=64,
                num_layers=2,
                num_attention_heads=2,
                intermediate_size=128,
                max_position_embeddings=64,
                pooling="mean",
            ),
            image=ImageTowerConfig(
                image_size=64,
                stackwise_filters=[8, 16, 32, 64],
                stackwise_blocks=[1, 1, 1, 1],
                stackwise_strides=[1, 2, 2, 2],
            ),
            embedding_dim=32,
        )
        return dataclasses.replace(cfg, **overrides)


@dataclasses.dataclass
class OptimizerConfig:
    """Two optimizers as in the paper (§4.2): AdamW for the Transformer, SGD + momentum for the ResNet.

    Text: learning rate rises linearly from 0 to ``text_learning_rate`` over ``text_warmup_steps``, then decays
    linearly to ``text_end_learning_rate`` at the last step. Image: linear decay from ``image_learning_rate`` to
    ``image_end_learning_rate`` (after an optional warm-up, 0 in the paper). The learned logit scale and bias, if any,
    are updated by the text optimizer and never weight-decayed (``optimizers.NEVER_DECAYED``).
    """

    text_learning_rate: float = 1e-4
    text_end_learning_rate: float = 0.0
    text_warmup_steps: int = 1500
    text_weight_decay: float = 0.01  # not in the paper: BERT's fine-tuning value
    text_beta_1: float = 0.9
    text_beta_2: float = 0.999
    text_epsilon: float = 1e-6  # BERT's
    # Variables whose name contains one of these are not decayed (BERT convention: LayerNorm and biases); log λ and b
    # are never decayed, whatever this list holds.
    text_exclude_from_weight_decay: list[str] = field(default_factory=lambda: ["LayerNorm", "layer_norm", "bias"])
    image_learning_rate: float = 3e-3
    image_end_learning_rate: float = 5e-4
    image_warmup_steps: int = 0
    image_momentum: float = 0.9
    image_nesterov: bool = False
    image_weight_decay: float = 0.0  # not in the paper
    global_clipnorm: float | None = None  # per optimizer; not in the paper

    def __post_init__(self):
        for name in ("text_learning_rate", "image_learning_rate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"optimizer.{name} must be positive, got {getattr(self, name)}")
        for name in ("text_end_learning_rate", "image_end_learning_rate", "text_warmup_steps", "image_warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"optimizer.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.image_momentum < 1:
            raise ValueError(f"optimizer.image_momentum must be in [0, 1), got {self.image_momentum}")

    @classmethod
    def tiny(cls, **overrides) -> OptimizerConfig:
        """Short-run settings for the synthetic demo and tests (10 warm-up steps, larger rates)."""
        cfg = cls(text_learning_rate=1e-3, text_warmup_steps=10, image_learning_rate=3e-2, image_end_learning_rate=5e-3)
        return dataclasses.replace(cfg, **overrides)


__all__ = [
    "AugmentationConfig",
    "ImageTowerConfig",
    "ModelConfig",
    "OptimizerConfig",
    "TextTowerConfig",
]

"""Image tower: encoded JPEG/PNG bytes -> pixels (in the graph) -> ResNet -> global average pool -> W x -> x / ||x||.

    e_image = normalize(W mean_{h,w} ResNet((decode(bytes) - mu) / sigma)),   W in R^{d x C}

as in Veit & Wilber (2020) §4.1: a ResNet-50 whose last (classification) layer is replaced by a projection to
d = 128 without bias. The backbone is keras-cv's ``ResNetBackbone`` with configurable stages, so the same code
builds ResNet-50 (bottleneck blocks [3, 4, 6, 3]) and the tiny towers of the tests. ``ResNet50Backbone()`` is not
used: it fetches a preset even without weights, which fails offline.

Parts (see :class:`~ce_retrieval.modeling.text_tower.Tower`): the ``preprocessor`` (:class:`ImageDecoder`:
bytes [B] -> float32 pixels in [0, 1], [B, S, S, 3]), the ``core`` (pixels -> unit embeddings: normalisation by
ImageNet mean/std, backbone, pooling, projection) and the ``encoder`` (bytes -> embeddings). Training-time
augmentation acts on the decoded pixels between the two and is not part of the exported encoder.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import types

import tensorflow as tf
import tf_keras

from ce_retrieval.modeling.config import ImageTowerConfig
from ce_retrieval.modeling.layers import as_string_batch
from ce_retrieval.modeling.text_tower import Tower
from ce_retrieval.utils.autograph_rules import leave_graph_ready_libraries_unconverted

# Leading bytes of the formats tf.io.decode_image reads (WebP: "RIFF" .... "WEBP", checked on bytes 0-3).
_MAGIC_PREFIXES = {
    "jpeg": b"\xff\xd8\xff",
    "png": b"\x89PNG",
    "gif": b"GIF8",
    "bmp": b"BM",
    "webp": b"RIFF",
}


def decode_image(data: tf.Tensor, image_size: int, resize: str = "center_crop") -> tf.Tensor:
    """One encoded image (a scalar string) -> float32 RGB pixels in [0, 1], [S, S, 3], as :class:`ImageDecoder`.

    Also what the training pipeline maps over its examples (``data.train_pipeline(decode=...)``), so that a batch
    reaches the train step decoded: the same ops give the same pixels, in tf.data's threads instead of a loop in
    the step.
    """
    head = tf.strings.substr(data, 0, 4)
    known = tf.reduce_any(
        [tf.equal(tf.strings.substr(data, 0, len(prefix)), prefix) for prefix in _MAGIC_PREFIXES.values()]
    )
    check = tf.debugging.Assert(
        known,
        [
            "image tower: input is not an encoded JPEG/PNG/GIF/BMP/WebP image (empty or corrupt bytes); leading bytes:",
            head,
        ],
    )
    with tf.control_dependencies([check]):
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image = tf.image.convert_image_dtype(image, tf.float32)  # uint8 -> [0, 1]
    size = int(image_size)
    if resize == "center_crop":
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = float(size) / tf.reduce_min(shape)
        new_hw = tf.maximum(tf.cast(tf.math.ceil(shape * scale), tf.int32), size)
        image = tf.image.resize(image, new_hw, antialias=True)
        image = tf.image.resize_with_crop_or_pad(image, size, size)
    else:
        image = tf.image.resize(image, [size, size], antialias=True)
    return tf.clip_by_value(tf.ensure_shape(image, [size, size, 3]), 0.0, 1.0)


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class ImageDecoder(tf_keras.layers.Layer):
    """Encoded image bytes [B] -> float32 RGB pixels in [0, 1], [B, S, S, 3].

    Grey/RGBA/animated inputs become 3-channel single frames. ``resize='center_crop'`` scales the shorter side
    to S and crops the centre (aspect ratio kept); ``'stretch'`` resizes to S x S. Bytes that are not a JPEG,
    PNG, GIF, BMP or WebP image (empty, truncated header, other data) fail a ``tf.debugging`` assert naming the
    problem (``InvalidArgumentError``): corrupt examples must be filtered by the input pipeline
    (``DataConfig.skip_corrupt``), the tower never silently embeds garbage.
    """

    def __init__(self, image_size: int, resize: str = "center_crop", **kwargs):
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.image_size = int(image_size)
        self.resize = resize

    def _decode_one(self, data):
        return decode_image(data, self.image_size, self.resize)

    def call(self, inputs) -> tf.Tensor:
        data = as_string_batch(inputs, "ImageDecoder", "encoded images")
        spec = tf.TensorSpec([self.image_size, self.image_size, 3], tf.float32)
        return tf.map_fn(self._decode_one, data, fn_output_signature=spec)

    def get_config(self) -> dict:
        return {**super().get_config(), "image_size": self.image_size, "resize": self.resize}


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class PixelNormalization(tf_keras.layers.Layer):
    """(x - mean) / std per RGB channel, for pixels in [0, 1]."""

    def __init__(self, mean, std, **kwargs):
        super().__init__(**kwargs)
        self.mean = [float(v) for v in mean]
        self.std = [float(v) for v in std]

    def call(self, inputs) -> tf.Tensor:
        mean = tf.constant(self.mean, self.compute_dtype)
        std = tf.constant(self.std, self.compute_dtype)
        return (tf.cast(inputs, self.compute_dtype) - mean) / std

    def get_config(self) -> dict:
        return {**super().get_config(), "mean": self.mean, "std": self.std}


KERAS_CV_NEEDS_LEGACY_KERAS = (
    "The image tower's backbone comes from keras-cv, which builds Keras 2 (tf_keras) models only if "
    "TF_USE_LEGACY_KERAS=1 was set before TensorFlow first resolved tf.keras; in this process tf.keras is Keras 3, "
    "so keras-cv would build Keras 3 layers that a tf_keras model cannot hold. Set TF_USE_LEGACY_KERAS=1 in the "
    "environment before Python starts (the ce-retrieval command and scripts/env.sh do). Only the image tower needs "
    "it: the losses work in either Keras (ce_retrieval.losses for tf_keras, ce_retrieval.keras for Keras 3)."
)


class _RefuseTorch(importlib.abc.MetaPathFinder):
    """A finder that makes ``import torch`` raise ``ImportError`` (and finds nothing else)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch":
            raise ImportError("torch is not imported while keras-cv is (ce_retrieval.modeling.image_tower)")
        return None


@contextlib.contextmanager
def _torch_import_refused():
    """Within the block, ``import torch`` raises ``ImportError`` unless torch is already imported.

    keras-cv's package ``__init__`` imports torch when it is installed, only so that torch is imported before
    TensorFlow (its comment: the other order can crash). Here TensorFlow is always imported first, so that
    import cannot give the order it is for; it only costs its start-up (4.2 CPU s per training process on a
    2-core Xeon: ``benchmarks/scale/autograph_startup.py --change torch``).
    keras-cv catches the ``ImportError``; nothing of keras-cv that the towers use needs torch. A finder, not a
    ``sys.modules['torch'] = None`` marker, because other libraries read ``sys.modules['torch']`` as a module."""
    if "torch" in sys.modules:
        yield
        return
    finder = _RefuseTorch()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_keras_cv() -> types.ModuleType:
    """keras-cv, checked to be on Keras 2: it follows the process's ``tf.keras`` (the one dependency of the
    package that does), so under Keras 3 this raises an ``ImportError`` that says what to set. A first import
    does not import torch (:func:`_torch_import_refused`)."""
    with _torch_import_refused():
        import keras_cv
    from keras_cv.src.backend import config as keras_cv_config

    if keras_cv_config.keras_3():
        raise ImportError(KERAS_CV_NEEDS_LEGACY_KERAS)
    return keras_cv


def build_backbone(cfg: ImageTowerConfig) -> tf_keras.Model:
    """keras-cv ``ResNetBackbone`` (feature map output), ImageNet weights from a preset or a local file."""
    keras_cv = import_keras_cv()

    kwargs = dict(
        stackwise_filters=list(cfg.stackwise_filters),
        stackwise_blocks=list(cfg.stackwise_blocks),
        stackwise_strides=list(cfg.stackwise_strides),
        block_type=cfg.block_type,
        include_rescaling=False,
        input_shape=(cfg.image_size, cfg.image_size, 3),
    )
    weights = cfg.weights
    if weights and not tf.io.gfile.exists(weights) and not tf.io.gfile.exists(weights + ".index"):
        # A keras-cv preset name (e.g. "resnet50_imagenet"): keras-cv downloads it on first use.
        backbone = keras_cv.models.ResNetBackbone.from_preset(
            weights, load_weights=True, input_shape=(cfg.image_size, cfg.image_size, 3)
        )
    else:
        backbone = keras_cv.models.ResNetBackbone(**kwargs)
        if weights:
            backbone.load_weights(weights)
    set_batchnorm_mode(backbone, cfg.batchnorm)
    return backbone


def set_batchnorm_mode(model: tf_keras.Model, mode: str) -> None:
    """'train': per-replica batch statistics; 'frozen': inference-mode BN (``trainable=False``, moving stats
    used and not updated); 'sync': batch statistics all-reduced over replicas (``synchronized=True``)."""
    for layer in _all_layers(model):
        if not isinstance(layer, tf_keras.layers.BatchNormalization):
            continue
        if mode == "frozen":
            layer.trainable = False
        elif mode == "sync":
            layer.synchronized = True
            layer.fused = False


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, tf_keras.Model):
            yield from _all_layers(layer)


def build_image_tower(cfg: ImageTowerConfig, embedding_dim: int, projection_norm: str = "none") -> Tower:
    """Builds the image :class:`Tower` (preprocessor, core, encoder) for ``cfg``; ``projection_norm``: see
    :meth:`Tower.assemble`."""
    leave_graph_ready_libraries_unconverted()
    preprocessor = ImageDecoder(cfg.image_size, cfg.resize, name="image_decoder")
    backbone = build_backbone(cfg)
    backbone.trainable = cfg.trainable
    if cfg.batchnorm == "frozen":
        set_batchnorm_mode(backbone, "frozen")

    pixels = tf_keras.Input(shape=(cfg.image_size, cfg.image_size, 3), dtype=tf.float32, name="pixels")
    x = PixelNormalization(cfg.pixel_mean, cfg.pixel_std, name="pixel_normalization")(pixels)
    x = backbone(x)
    x = tf_keras.layers.GlobalAveragePooling2D(name="image_pool")(x)
    return Tower.assemble(
        preprocessor, pixels, x, embedding_dim, prefix="image", raw_input="image", projection_norm=projection_norm
    )


__all__ = [
    "KERAS_CV_NEEDS_LEGACY_KERAS",
    "ImageDecoder",
    "PixelNormalization",
    "build_backbone",
    "build_image_tower",
    "decode_image",
    "import_keras_cv",
    "set_batchnorm_mode",
]

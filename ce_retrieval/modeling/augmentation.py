"""Training-time image augmentation on decoded pixels in [0, 1] (keras-cv layers).

    x' = clip(jitter(flip(random_resized_crop(x))), 0, 1)

Random resized crop (area fraction and aspect ratio drawn uniformly from the configured ranges, resized back to
S x S), horizontal flip and colour jitter (brightness, contrast, saturation, hue). The two-tower model applies it
only inside ``train_step``; evaluation, ``call`` and the exported encoders never see it (keras-cv's layers do not
honour ``training=False`` reliably, so the model decides when to call this layer rather than relying on it).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from ce_retrieval.modeling.config import AugmentationConfig


class ImageAugmentation(tf_keras.layers.Layer):
    """Applies the configured keras-cv augmentations to a float32 batch [B, S, S, 3] in [0, 1]."""

    def __init__(self, cfg: AugmentationConfig, image_size: int, seed: int | None = None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        from ce_retrieval.modeling.image_tower import import_keras_cv

        keras_cv = import_keras_cv()
        self.cfg = cfg
        self.image_size = int(image_size)
        self._stages = []
        if not cfg.enabled:
            return
        if cfg.random_resized_crop:
            self._stages.append(
                keras_cv.layers.RandomCropAndResize(
                    target_size=(self.image_size, self.image_size),
                    crop_area_factor=tuple(cfg.crop_area_range),
                    aspect_ratio_factor=tuple(cfg.aspect_ratio_range),
                    seed=seed,
                )
            )
        if cfg.horizontal_flip:
            self._stages.append(keras_cv.layers.RandomFlip("horizontal", seed=seed))
        if any(v > 0 for v in (cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue)):
            self._stages.append(
                keras_cv.layers.RandomColorJitter(
                    value_range=(0.0, 1.0),
                    brightness_factor=cfg.brightness,
                    contrast_factor=cfg.contrast,
                    saturation_factor=(0.5 - cfg.saturation / 2.0, 0.5 + cfg.saturation / 2.0),
                    hue_factor=cfg.hue,
                    seed=seed,
                )
            )

    @property
    def active(self) -> bool:
        return bool(self._stages)

    def call(self, inputs) -> tf.Tensor:
        x = tf.convert_to_tensor(inputs, tf.float32)
        for stage in self._stages:
            x = stage(x, training=True)
        return tf.clip_by_value(tf.cast(x, tf.float32), 0.0, 1.0)


__all__ = ["ImageAugmentation"]

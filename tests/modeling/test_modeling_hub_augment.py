"""Pretrained-weight paths (hub.KerasLayer on a local SavedModel, BERT checkpoint, local ResNet weights), SavedModel
export of the encoders, and training-only image augmentation."""

import dataclasses
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, make_images, tiny_config

from ce_retrieval.modeling import ImageAugmentation, TextTowerConfig, build_text_tower, build_two_tower
from ce_retrieval.modeling.image_tower import build_backbone


@pytest.mark.slow
def test_hub_text_tower_loads_a_local_saved_model_and_matches_the_bert_tower(vocab_file, tmp_path):
    cfg = tiny_config()
    bert_tower = build_text_tower(cfg.text, 16, vocab_file)
    encoder = bert_tower.core.get_layer("bert_encoder")
    inputs = {
        k: tf_keras.Input(shape=(32,), dtype=tf.int32, name=k)
        for k in ("input_word_ids", "input_mask", "input_type_ids")
    }
    outputs = encoder(inputs)
    exported = tf_keras.Model(
        inputs, {"sequence_output": outputs["sequence_output"], "pooled_output": outputs["pooled_output"]}
    )
    handle = str(tmp_path / "tiny_bert")
    exported.save(handle, save_format="tf", include_optimizer=False)
    os.makedirs(os.path.join(handle, "assets"), exist_ok=True)
    shutil.copy(vocab_file, os.path.join(handle, "assets", "vocab.txt"))

    hub_cfg = TextTowerConfig(kind="hub", hub_handle=handle, max_seq_length=32, pooling=cfg.text.pooling)
    hub_tower = build_text_tower(hub_cfg, 16, vocab_path=None)  # vocab from <handle>/assets/vocab.txt
    hub_tower.core.get_layer("text_projection").set_weights(bert_tower.core.get_layer("text_projection").get_weights())
    captions = tf.constant(["a red dog on the grass", "the blue car", "sky"])
    np.testing.assert_allclose(
        hub_tower.encoder(captions).numpy(), bert_tower.encoder(captions).numpy(), rtol=1e-5, atol=1e-5
    )
    assert len(hub_tower.core.trainable_variables) > 10  # the hub encoder is fine-tuned (trainable=True)

    frozen = build_text_tower(dataclasses.replace(hub_cfg, trainable=False), 16, vocab_file)
    assert len(frozen.core.trainable_variables) == 1  # only the projection


def test_augmentation_only_in_training(vocab_file):
    cfg = tiny_config(augment=True)
    model = build_two_tower(cfg, vocab_file, augmentation_seed=3)
    assert model.augmentation is not None
    images = tf.constant(make_images(4))
    pixels = model.image_preprocessor(images)
    augmented = model.augmentation(pixels)
    assert augmented.shape == pixels.shape
    assert float(tf.reduce_min(augmented)) >= 0.0 and float(tf.reduce_max(augmented)) <= 1.0
    assert float(tf.reduce_max(tf.abs(augmented - pixels))) > 0.05
    # Inference paths never augment: the encoder is deterministic and equals the core on the decoded pixels.
    first, second = model.image_encoder(images), model(make_batch(4, (1, 1, 1, 1)))["image"]
    np.testing.assert_allclose(model.image_encoder(images).numpy(), first.numpy(), atol=1e-6)
    np.testing.assert_allclose(model.image_core(pixels).numpy(), first.numpy(), atol=1e-6)
    np.testing.assert_allclose(second.numpy(), first.numpy(), atol=1e-6)
    assert not any(isinstance(layer, ImageAugmentation) for layer in model.image_encoder.layers)

    off = dataclasses.replace(cfg.image.augmentation, enabled=False)
    assert not ImageAugmentation(off, 64).active


def test_bert_checkpoint_and_local_resnet_weights_are_restored(vocab_file, tmp_path):
    cfg = tiny_config()
    source = build_text_tower(cfg.text, 16, vocab_file).core.get_layer("bert_encoder")
    prefix = tf.train.Checkpoint(encoder=source).write(str(tmp_path / "bert" / "ckpt"))
    restored = build_text_tower(dataclasses.replace(cfg.text, init_checkpoint=prefix), 16, vocab_file)
    for a, b in zip(source.get_weights(), restored.core.get_layer("bert_encoder").get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    backbone = build_backbone(cfg.image)
    path = str(tmp_path / "resnet.weights.h5")
    backbone.save_weights(path)
    loaded = build_backbone(dataclasses.replace(cfg.image, weights=path))
    for a, b in zip(backbone.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_encoders_export_as_saved_models_taking_raw_strings(vocab_file, tmp_path):
    model = build_two_tower(tiny_config(), vocab_file)
    batch = make_batch()
    for name, key in (("text_encoder", "caption"), ("image_encoder", "image")):
        encoder = getattr(model, name)
        path = str(tmp_path / name)
        tf.saved_model.save(encoder, path)
        reloaded = tf.saved_model.load(path)
        np.testing.assert_allclose(
            reloaded.signatures["serving_default"](**{key: batch[key]})[encoder.output_names[0]].numpy(),
            encoder(batch[key]).numpy(),
            atol=1e-5,
        )

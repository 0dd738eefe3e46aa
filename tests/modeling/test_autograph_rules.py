"""Autograph leaves keras-cv, tensorflow-text, tf-models-official and dm-tree unconverted once a tower is built
(ce_retrieval/utils/autograph_rules.py), converts our own code still, and everything the towers use from those
libraries traces as written: every augmentation stage and the tokenizer inside a ``tf.function`` with autograph on,
and one training step (the step itself is checked against references elsewhere)."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, make_images, tiny_config
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.impl import conversion

from ce_retrieval.losses import SampledSoftmax
from ce_retrieval.modeling import build_two_tower
from ce_retrieval.modeling.augmentation import ImageAugmentation
from ce_retrieval.utils.autograph_rules import GRAPH_READY_LIBRARIES, leave_graph_ready_libraries_unconverted


def test_rules_are_added_once_and_leave_our_code_converted(vocab_file):
    build_two_tower(tiny_config(), vocab_file)  # building a tower adds the rules
    before = tuple(autograph_config.CONVERSION_RULES)
    leave_graph_ready_libraries_unconverted()
    assert tuple(autograph_config.CONVERSION_RULES) == before  # idempotent
    for name in GRAPH_READY_LIBRARIES:
        assert sum(str(rule) == f"DoNotConvert rule for {name}" for rule in before) == 1, name

    import keras_cv
    import tensorflow_text
    import tree
    from official.nlp.modeling import networks

    for entity in (
        keras_cv.layers.RandomCropAndResize.call,
        tensorflow_text.BertTokenizer.tokenize,
        tree.map_structure,
    ):
        assert conversion.is_allowlisted(entity), entity
    assert conversion.is_allowlisted(networks.BertEncoderV2.call)
    assert not conversion.is_allowlisted(ImageAugmentation.call)  # ours: still converted


@pytest.mark.slow
def test_every_augmentation_stage_and_the_tokenizer_trace_with_autograph_on(vocab_file):
    cfg = tiny_config(augment=True)
    cfg.image.augmentation = dataclasses.replace(
        cfg.image.augmentation, horizontal_flip=True, brightness=0.2, contrast=0.2, saturation=0.2, hue=0.1
    )
    model = build_two_tower(cfg, vocab_file, augmentation_seed=3)
    stages = [type(s).__name__ for s in model.augmentation._stages]
    assert stages == ["RandomCropAndResize", "RandomFlip", "RandomColorJitter"]
    pixels = model.image_preprocessor(tf.constant(make_images(4)))

    @tf.function  # autograph on, as Keras's train function
    def augment_and_tokenize(x, captions):
        return model.augmentation(x), model.text_preprocessor(captions)

    augmented, tokens = augment_and_tokenize(pixels, tf.constant(["a red dog on the grass", "big blue sky"]))
    assert augmented.shape == pixels.shape and float(tf.reduce_max(tf.abs(augmented - pixels))) > 0.05
    assert all(np.asarray(v).shape[0] == 2 for v in tf.nest.flatten(tokens))

    model.compile(
        loss=SampledSoftmax(), text_optimizer=tf_keras.optimizers.SGD(0.1), image_optimizer=tf_keras.optimizers.SGD(0.1)
    )
    logs = model.train_on_batch(make_batch(), return_dict=True)  # Keras's traced step, augmentation included
    assert np.isfinite(logs["loss"])


@pytest.mark.slow
def test_a_training_step_is_bit_identical_with_the_libraries_converted(vocab_file, monkeypatch):
    """Leaving the libraries unconverted changes no op: one step of the same model (every augmentation stage on)
    gives bit-identical weights with autograph converting them (TensorFlow's rules without ours)."""
    cfg = tiny_config(augment=True)
    cfg.image.augmentation = dataclasses.replace(
        cfg.image.augmentation, horizontal_flip=True, brightness=0.2, contrast=0.2, saturation=0.2, hue=0.1
    )

    def one_step():
        tf_keras.backend.clear_session()
        tf_keras.utils.set_random_seed(0)
        model = build_two_tower(cfg, vocab_file, augmentation_seed=3)
        model.compile(
            loss=SampledSoftmax(),
            text_optimizer=tf_keras.optimizers.SGD(0.1),
            image_optimizer=tf_keras.optimizers.SGD(0.1),
        )
        model.train_on_batch(make_batch())
        return model.get_weights()

    unconverted = one_step()
    ours = {f"DoNotConvert rule for {name}" for name in GRAPH_READY_LIBRARIES}
    monkeypatch.setattr(
        autograph_config,
        "CONVERSION_RULES",
        tuple(rule for rule in autograph_config.CONVERSION_RULES if str(rule) not in ours),
    )
    for module in ("ce_retrieval.modeling.text_tower", "ce_retrieval.modeling.image_tower", "ce_retrieval.data.vocab"):
        monkeypatch.setattr(f"{module}.leave_graph_ready_libraries_unconverted", lambda: None)
    import keras_cv

    assert not conversion.is_allowlisted(keras_cv.layers.RandomCropAndResize.call)
    converted = one_step()
    assert len(converted) == len(unconverted)
    for a, b in zip(converted, unconverted, strict=True):
        np.testing.assert_array_equal(a, b)

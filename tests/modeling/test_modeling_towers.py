"""Towers: shapes, unit norm, raw strings in, in-graph tokenisation == eager tokenizer, decoding, encoders == model."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text
from modeling_fixtures import VOCAB, make_batch, make_images, tiny_config

from ce_retrieval.modeling import build_two_tower


@pytest.fixture(scope="module")
def model(vocab_file):
    return build_two_tower(tiny_config(), vocab_file)


def _eager_pack(captions, vocab_file, seq_length):
    """Independent reference: tensorflow_text.BertTokenizer eagerly + [CLS] ... [SEP] packing in NumPy."""
    tok = tf_text.BertTokenizer(vocab_file, lower_case=True, token_out_type=tf.int64)
    pieces = tok.tokenize(tf.constant(captions)).merge_dims(1, -1).to_list()
    cls, sep, pad = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[PAD]")
    ids = np.full((len(captions), seq_length), pad, np.int32)
    mask = np.zeros((len(captions), seq_length), np.int32)
    for i, p in enumerate(pieces):
        row = [cls] + p[: seq_length - 2] + [sep]
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def test_text_tower_tokenises_in_graph_like_the_eager_tokenizer(model, vocab_file):
    long = " ".join(["red dogs"] * 40)  # > 32 word pieces: truncated to 30 + [CLS] + [SEP]
    captions = ["A Red DOG on the grass.", "cats in the sky", "unknownword zebra", long, ""]
    packed = tf.function(model.text_preprocessor)(tf.constant(captions))
    ids, mask = _eager_pack(captions, vocab_file, 32)
    np.testing.assert_array_equal(packed["input_word_ids"].numpy(), ids)
    np.testing.assert_array_equal(packed["input_mask"].numpy(), mask)
    np.testing.assert_array_equal(packed["input_type_ids"].numpy(), np.zeros_like(ids))
    assert packed["input_mask"].numpy()[3].sum() == 32
    assert VOCAB.index("[UNK]") in ids[2]


def test_text_encoder_maps_raw_strings_to_unit_vectors(model):
    emb = model.text_encoder(tf.constant(["a red dog", "a blue car on the street", "a red dog"]))
    assert emb.shape == (3, 32) and emb.dtype == tf.float32
    np.testing.assert_allclose(tf.norm(emb, axis=1).numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb[0].numpy(), emb[2].numpy(), atol=1e-6)
    assert np.abs(emb[0].numpy() - emb[1].numpy()).max() > 1e-3  # (random-init BERT [CLS] vectors are close)


def test_image_encoder_decodes_png_jpeg_grey_and_rgba(model):
    grey = tf.io.encode_png(np.full((30, 70, 1), 128, np.uint8)).numpy()
    rgba = tf.io.encode_png(np.full((50, 20, 4), 200, np.uint8)).numpy()
    data = make_images(2) + make_images(1, seed=3, fmt="jpeg") + [grey, rgba]
    emb = model.image_encoder(tf.constant(data))
    assert emb.shape == (5, 32) and emb.dtype == tf.float32
    np.testing.assert_allclose(tf.norm(emb, axis=1).numpy(), 1.0, atol=1e-5)
    pixels = model.image_preprocessor(tf.constant(data))
    assert pixels.shape == (5, 32, 32, 3)
    assert 0.0 <= float(tf.reduce_min(pixels)) and float(tf.reduce_max(pixels)) <= 1.0
    np.testing.assert_allclose(pixels[3].numpy(), 128 / 255, atol=1e-3)  # grey -> 3 equal channels


def test_image_decoder_center_crop_keeps_aspect_ratio(model):
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :10] = 255  # white left strip is cropped away by a centre crop of the 32x64 resize
    pixels = model.image_preprocessor(tf.constant([tf.io.encode_png(img).numpy()]))[0].numpy()
    assert pixels.max() < 0.05


def test_corrupt_image_bytes_raise_a_clear_error(model):
    with pytest.raises(tf.errors.InvalidArgumentError, match="not an encoded JPEG/PNG"):
        model.image_encoder(tf.constant([make_images(1)[0], b"this is not an image"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not an encoded JPEG/PNG"):
        model.image_encoder(tf.constant([b""]))


def test_wrong_input_types_raise(model):
    with pytest.raises((TypeError, ValueError), match="tf.string"):
        model.text_preprocessor(tf.constant([1, 2]))
    with pytest.raises(KeyError, match="neither"):
        model({"image_id": tf.constant([1])})


def test_encoders_give_the_same_embeddings_as_the_full_model(model):
    batch = make_batch()
    out = model(batch)
    np.testing.assert_allclose(out["text"].numpy(), model.text_encoder(batch["caption"]).numpy(), atol=1e-6)
    np.testing.assert_allclose(out["image"].numpy(), model.image_encoder(batch["image"]).numpy(), atol=1e-6)
    serving = tf.function(model.image_encoder, input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_allclose(serving(batch["image"]).numpy(), out["image"].numpy(), atol=1e-5)


def test_encoders_share_weights_with_the_towers(model):
    text_ids = {id(v) for v in model.text_encoder.trainable_variables}
    image_ids = {id(v) for v in model.image_encoder.trainable_variables}
    assert text_ids == {id(v) for v in model.text_variables}
    assert image_ids == {id(v) for v in model.image_variables}
    assert not any("pooler" in v.name for v in model.text_variables)  # unused BERT pooler is frozen

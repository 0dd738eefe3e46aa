"""Images decoded by the training pipeline (``train_pipeline(decode=...)``) instead of inside the train step.

The pipeline must hand the step exactly the pixels the image tower's own decoder makes of the same bytes, for an
in-memory source (decoded once, up front) and a streamed one (decoded per example). That the model then trains the
same weights bit for bit through ``RetrievalTask.build_dataset`` is checked by the benchmark's smoke test
(``tests/benchmarks/test_decode_in_pipeline_bench.py``), which trains both ways.
"""

import functools
import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from ce_retrieval.data import PIXELS, DataConfig, SplitPaths, train_pipeline, write_tfrecords
from ce_retrieval.modeling import ImageDecoder
from ce_retrieval.modeling.image_tower import decode_image

CFG = DataConfig(num_train_images=24, num_val_images=4, num_test_images=4, image_size=32, seed=5)


def _jpeg(color, size):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG")
    return buf.getvalue()


def _same_batches(decoded, plain, image_size, resize="center_crop", steps=4):
    decoder = ImageDecoder(image_size, resize)
    for got, ref in zip(decoded.take(steps), plain.take(steps), strict=True):
        assert "image" not in got and got[PIXELS].shape == (ref["image"].shape[0], image_size, image_size, 3)
        np.testing.assert_array_equal(got["image_id"].numpy(), ref["image_id"].numpy())
        np.testing.assert_array_equal(got["caption"].numpy(), ref["caption"].numpy())
        np.testing.assert_array_equal(got[PIXELS].numpy(), decoder(ref["image"]).numpy())  # bit for bit


def test_in_memory_source_is_decoded_once_into_the_same_pixels_as_the_tower():
    decode = functools.partial(decode_image, image_size=24)  # the tower's size, not the data's (32)
    decoded = train_pipeline(CFG, "train", batch_size=16, seed=3, decode=decode)
    assert decoded.element_spec[PIXELS].dtype == tf.float32
    _same_batches(decoded, train_pipeline(CFG, "train", batch_size=16, seed=3), image_size=24)


def test_an_in_memory_set_too_large_to_decode_once_is_decoded_per_example(monkeypatch):
    from ce_retrieval.data import pipeline

    decode = functools.partial(decode_image, image_size=24)
    table_bytes = 24 * 24 * 3 * 4 * CFG.num_train_images
    monkeypatch.setattr(pipeline, "DECODE_ONCE_MAX_BYTES", table_bytes - 1)
    assert "image" in pipeline.load_examples(CFG, "train", decode=decode).element_spec  # bytes kept
    decoded = train_pipeline(CFG, "train", batch_size=16, seed=3, decode=decode)
    _same_batches(decoded, train_pipeline(CFG, "train", batch_size=16, seed=3), image_size=24)
    monkeypatch.setattr(pipeline, "DECODE_ONCE_MAX_BYTES", table_bytes)  # exactly fits: decoded once
    assert PIXELS in pipeline.load_examples(CFG, "train", decode=decode).element_spec


def test_streamed_source_is_decoded_per_example_after_the_shuffle(tmp_path):
    sizes = [(40, 30), (30, 40), (32, 32), (50, 20)]  # aspect ratios the centre crop must handle
    examples = [
        {"caption": f"caption {i}", "image": _jpeg((i * 20, 40, 200 - i * 10), sizes[i % 4]), "image_id": 100 + i // 2}
        for i in range(10)
    ]
    write_tfrecords(examples, str(tmp_path / "tf" / "train"), num_shards=2)
    cfg = DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(train=str(tmp_path / "tf" / "train-*")))
    for resize in ("center_crop", "stretch"):
        decode = functools.partial(decode_image, image_size=16, resize=resize)
        decoded = train_pipeline(cfg, "train", batch_size=4, seed=1, decode=decode)
        _same_batches(decoded, train_pipeline(cfg, "train", batch_size=4, seed=1), image_size=16, resize=resize)


def test_corrupt_bytes_fail_in_the_pipeline_with_the_decoders_message():
    decode = functools.partial(decode_image, image_size=8)
    bad = tf.data.Dataset.from_tensor_slices(tf.constant([_jpeg((1, 2, 3), (8, 8)), b"not an image"])).map(decode)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not an encoded JPEG/PNG/GIF/BMP/WebP image"):
        list(bad)


@pytest.fixture(scope="module")
def model_and_batch(tmp_path_factory):
    from ce_retrieval import losses
    from ce_retrieval.data import vocab_path_for
    from ce_retrieval.modeling import ModelConfig, OptimizerConfig, build_optimizers, build_two_tower

    cfg = ModelConfig.tiny()
    cfg.image.image_size = 24
    model = build_two_tower(cfg, vocab_path_for(CFG, str(tmp_path_factory.mktemp("vocab"))))
    text_opt, image_opt = build_optimizers(OptimizerConfig(), total_steps=10)
    model.compile(loss=losses.get("CrossExampleSoftmax"), text_optimizer=text_opt, image_optimizer=image_opt)
    decode = functools.partial(decode_image, image_size=24)
    return model, next(iter(train_pipeline(CFG, "train", batch_size=8, seed=2, decode=decode)))


def test_decoded_pixels_of_the_wrong_size_or_dtype_are_refused(model_and_batch):
    model, batch = model_and_batch
    _, pixels, _ = model._prepare(batch, augment=False)  # the right ones pass through unchanged
    np.testing.assert_array_equal(pixels.numpy(), batch[PIXELS].numpy())
    with pytest.raises(ValueError, match=r"decoded 'pixels' must be float \[batch, 24, 24, 3\].*got float32 \(8, 32"):
        model._prepare({**batch, PIXELS: tf.zeros([8, 32, 32, 3])}, augment=False)
    with pytest.raises(ValueError, match="got uint8"):
        model._prepare({**batch, PIXELS: tf.zeros([8, 24, 24, 3], tf.uint8)}, augment=False)
    with pytest.raises(KeyError, match=r"missing \['image_id'\]"):
        model._prepare({k: v for k, v in batch.items() if k != "image_id"}, augment=False)

"""tf.data pipelines over the synthetic set, the disk cache, and vocab_path_for."""

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval.data import (
    DataConfig,
    load_examples,
    load_report,
    load_retrieval_split,
    read_vocab,
    synthetic_cache,
    train_pipeline,
    vocab_path_for,
)
from ce_retrieval.data.vocab import tokenizer

CFG = DataConfig(num_train_images=40, num_val_images=12, num_test_images=16, image_size=32, seed=5)


def test_load_examples_one_element_per_caption():
    ds = load_examples(CFG, "val")
    spec = ds.element_spec
    assert spec["caption"].dtype == tf.string and spec["image"].dtype == tf.string
    assert spec["image_id"].dtype == tf.int64 and spec["caption"].shape.rank == 0
    elements = list(ds.as_numpy_iterator())
    assert len(elements) == 12 * 5
    ids = np.array([e["image_id"] for e in elements])
    assert np.array_equal(np.unique(ids, return_counts=True)[1], np.full(12, 5))
    image = tf.io.decode_png(elements[0]["image"])
    assert image.shape == (32, 32, 3)
    # All captions of one image carry that image's bytes.
    by_id = {}
    for e in elements:
        assert by_id.setdefault(e["image_id"], e["image"]) == e["image"]
    assert load_report(CFG, "val").examples == 60


def test_train_pipeline_batches_shuffles_by_seed_and_repeats():
    ds = train_pipeline(CFG, "train", batch_size=16, seed=3)
    assert ds.element_spec["caption"].shape.as_list() == [16]
    first = [b["image_id"].numpy() for b in ds.take(30)]  # 480 > 200 captions: repeats
    again = [b["image_id"].numpy() for b in train_pipeline(CFG, "train", batch_size=16, seed=3).take(30)]
    other = [b["image_id"].numpy() for b in train_pipeline(CFG, "train", batch_size=16, seed=4).take(1)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])
    assert not np.array_equal(first[0], np.sort(first[0]))
    once = list(train_pipeline(CFG, "train", batch_size=64, seed=0, shuffle=False, repeat=False))
    assert len(once) == 200 // 64  # drop_remainder


def test_train_pipeline_runs_without_the_autotuning_thread_and_yields_the_same_batches():
    # The thread's timed wait could hold up the iterator's teardown by up to a minute (pipeline module doc); without
    # it the batches must be exactly those of the autotuned pipeline.
    ds = train_pipeline(CFG, "train", batch_size=16, seed=3)
    assert ds.options().autotune.enabled is False
    options = tf.data.Options()
    options.autotune.enabled = True
    tuned = train_pipeline(CFG, "train", batch_size=16, seed=3).with_options(options)  # its own shuffle state
    assert tuned.options().autotune.enabled is True
    for a, b in zip(ds.take(20), tuned.take(20), strict=True):
        assert a["caption"].numpy().tolist() == b["caption"].numpy().tolist()
        assert a["image"].numpy().tolist() == b["image"].numpy().tolist()


def test_retrieval_split_matches_examples():
    split = load_retrieval_split(CFG, "test")
    assert len(split.images) == 16 and len(split.captions) == 80
    assert set(split.caption_ids.tolist()) == set(split.image_ids.tolist())
    examples = list(load_examples(CFG, "test").as_numpy_iterator())
    assert [e["caption"].decode() for e in examples] == split.captions
    assert not set(split.image_ids.tolist()) & set(load_retrieval_split(CFG, "train").image_ids.tolist())


def test_disk_cache_round_trip(tmp_path):
    cfg = DataConfig(num_train_images=8, num_val_images=6, num_test_images=4, image_size=24, cache_dir=str(tmp_path))
    fresh = load_retrieval_split(cfg, "val")  # generates and writes
    path = synthetic_cache.cache_path(cfg, "val")
    cached = synthetic_cache.load_or_generate(cfg, "val")  # reads the file
    assert tf.io.gfile.exists(path)
    assert cached.images == fresh.images
    assert cached.flat_captions()[0] == fresh.captions
    assert np.array_equal(cached.image_ids, fresh.image_ids)


def test_vocab_path_for_builds_and_reuses(tmp_path):
    path = vocab_path_for(CFG, str(tmp_path / "run"))
    vocab = read_vocab(path)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    captions = load_retrieval_split(CFG, "train").captions
    ids = tokenizer(path).tokenize(captions).merge_dims(-2, -1).flat_values.numpy()
    assert (ids == 1).mean() == 0.0  # no [UNK] on the corpus it was learned from
    # A given vocab is copied into the workdir, which then owns it.
    copied = vocab_path_for(DataConfig(vocab_path=path), str(tmp_path / "other"))
    assert read_vocab(copied) == vocab and copied.endswith("other/vocab.txt")


def test_bad_split_and_batch_are_named():
    with pytest.raises(ValueError, match="split"):
        load_examples(CFG, "dev")
    with pytest.raises(ValueError, match="batch_size"):
        train_pipeline(CFG, "train", batch_size=0, seed=0)
    with pytest.raises(ValueError, match="name"):
        DataConfig(name="coco")


def test_config_round_trips_through_plain_dicts():
    import dataclasses

    cfg = DataConfig(name="cc_tsv", tsv_path={"train": "/x/train.tsv"}, tfrecord_pattern={"test": "/t-*"})
    plain = dataclasses.asdict(cfg)
    assert plain["tsv_path"] == {"train": "/x/train.tsv", "val": None, "test": None}
    assert DataConfig(**plain) == cfg and DataConfig(**plain).fingerprint() == cfg.fingerprint()
    assert DataConfig(seed=1).fingerprint() != DataConfig(seed=2).fingerprint()
    assert DataConfig(cache_dir="/a").fingerprint() == DataConfig().fingerprint()
    with pytest.raises(TypeError):
        DataConfig(**{**plain, "unknown_key": 1})
    with pytest.raises(ValueError, match="no path configured for split 'val'"):
        cfg.tsv_path.get("val")


def test_batches_feed_relevance_from_ids():
    from ce_retrieval.losses import relevance_from_ids

    cfg = DataConfig(num_train_images=4, num_val_images=4, num_test_images=4, image_size=16)
    batch = next(iter(train_pipeline(cfg, "train", batch_size=12, seed=0)))  # 20 captions of 4 images
    relevance = relevance_from_ids(batch["image_id"], batch["image_id"]).numpy()
    assert np.all(np.diag(relevance) == 1)
    assert relevance.sum() > 12  # captions of one image in one batch are positives of each other

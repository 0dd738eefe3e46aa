"""Helpers and fixtures of the build, search and serve tests (a plugin of tests/conftest.py, so every test
directory sees the one session-wide ``base_export``: a read-only export of the stand-in towers with a brute-force
index of 300 images; ``export_copy`` is a per-test copy of it; ``export_spy`` records what a caller hands the
manifest writer). Stand-in towers: the
interface of ``TwoTowerModel.text_encoder`` / ``.image_encoder``
(raw string batch -> float32 [B, d] unit vectors, preprocessing inside the graph), tiny and fast.

The text tower lower-cases with TF-Text's ``case_fold_utf8`` on purpose, so its SavedModel needs TF-Text's
ops like the real WordPiece tower does, and the tests exercise the ``import tensorflow_text`` requirement.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import ce_retrieval  # noqa: F401
from benchmarks.common.galleries import clustered


class HashTextEncoder(tf_keras.Model):
    """case fold -> whitespace tokens -> hashed ids -> mean of embeddings -> dense -> L2 normalise."""

    def __init__(self, dim=16, buckets=257, **kw):
        super().__init__(**kw)
        self.buckets = buckets
        self.table = tf_keras.layers.Embedding(buckets, 24)
        self.proj = tf_keras.layers.Dense(dim)

    def call(self, texts, training=False):
        import tensorflow_text as tf_text

        tokens = tf.strings.split(tf_text.case_fold_utf8(texts))
        ids = tf.strings.to_hash_bucket_fast(tokens, self.buckets)
        vecs = tf.ragged.map_flat_values(self.table, ids)
        pooled = tf.reduce_sum(vecs, axis=1) / tf.maximum(tf.cast(ids.row_lengths(), tf.float32), 1.0)[:, None]
        return tf.math.l2_normalize(self.proj(pooled), axis=-1)


class PixelImageEncoder(tf_keras.Model):
    """decode JPEG/PNG -> resize 8x8 -> flatten -> dense -> L2 normalise."""

    def __init__(self, dim=16, size=8, **kw):
        super().__init__(**kw)
        self.size = size
        self.proj = tf_keras.layers.Dense(dim)

    def call(self, image_bytes, training=False):
        def decode(b):
            img = tf.io.decode_image(b, channels=3, expand_animations=False)
            return tf.image.resize(tf.cast(img, tf.float32) / 255.0, (self.size, self.size))

        imgs = tf.map_fn(decode, image_bytes, fn_output_signature=tf.TensorSpec([self.size, self.size, 3], tf.float32))
        return tf.math.l2_normalize(self.proj(tf.reshape(imgs, [-1, self.size * self.size * 3]) - 0.5), axis=-1)


def make_towers(dim=16, seed=0):
    tf_keras.utils.set_random_seed(seed)
    text, image = HashTextEncoder(dim), PixelImageEncoder(dim)
    text(tf.constant(["build"]))
    image(tf.constant([png_images(1, seed=seed)[0]]))
    return text, image


def png_images(n, seed=0, size=12):
    rng = np.random.default_rng(seed)
    return [tf.io.encode_png(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).numpy() for _ in range(n)]


def captions(n, seed=0):
    rng = np.random.default_rng(seed)
    words = np.array("a the dog cat red blue runs sits on under big small tree car beach City Ünïcode 東京".split())
    return [" ".join(rng.choice(words, size=rng.integers(2, 7))) for _ in range(n)]


def clustered_unit_vectors(n, dim, num_clusters=40, spread=0.35, seed=0):
    """Unit vectors around random cluster centres (like embeddings of a gallery of related images): the benchmarks'
    generator, one random stream, scaled by sqrt(dim), float64 draws."""
    return clustered(n, dim, num_clusters, seed, spread=spread, draws="shared", scaled=True, float64=True)


GALLERY_SIZE = 300
THRESHOLDS = {"0.5": 0.2, "0.8": 0.5, "0.9": 0.7}


@pytest.fixture
def towers():
    return make_towers()


@pytest.fixture(scope="session")
def base_export(tmp_path_factory):
    """Version 1 of an export of the stand-in towers, with a brute-force index of 300 images. Read-only:
    tests that change an export work on ``export_copy``."""
    from ce_retrieval.build.export import embed_with_keras, export_encoders
    from ce_retrieval.build.index import build_index

    root = str(tmp_path_factory.mktemp("export"))
    text, image = make_towers(seed=0)
    export_encoders(text, image, root, metadata={"test": True}, logit_scale=20.0)
    gallery = png_images(GALLERY_SIZE, seed=5)
    ids = np.arange(GALLERY_SIZE, dtype=np.int64) * 7 + 1000
    build_index(embed_with_keras(image, gallery), ids, root, 1, thresholds=THRESHOLDS)
    return {"dir": root, "text": text, "image": image, "gallery": gallery, "ids": ids}


@pytest.fixture
def export_copy(base_export, tmp_path):
    import shutil

    dst = str(tmp_path / "export")
    shutil.copytree(base_export["dir"], dst)
    return dst


@pytest.fixture
def export_spy(monkeypatch):
    """``ce_retrieval.build.export.export_encoders`` (the one writer of an export's manifests) replaced by a
    recorder, for tests of what a caller hands it (λ, b) that need no SavedModel written: ``{export_dir: the
    scoring keyword arguments}``. That it writes what it is given is tests/build/test_serving_export.py's check."""
    from ce_retrieval.build import export as export_module

    written = {}

    def spy(text_encoder, image_encoder, export_dir, version=None, metadata=None, *, verify=True, **scoring):
        written[export_dir] = scoring
        return types.SimpleNamespace(
            version=version or 1, text_encoder=export_dir, image_encoder=export_dir, metadata={"custom_ops": []}
        )

    monkeypatch.setattr(export_module, "export_encoders", spy)
    return written

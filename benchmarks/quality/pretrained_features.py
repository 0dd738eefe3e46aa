"""Frozen, pretrained tower features for the paper-table benchmark: the analogue of ImageNet ResNet + BERT.

The paper fine-tunes towers that start from a trained state (ResNet-50 trained on ILSVRC2012 classification,
BERT trained on masked language modelling): generic features that are *not* aligned across modalities. Our
analogue on the embedded synthetic set: the demo model's two towers (its small ResNet and 2-layer BERT), each
pretrained once on its own modality to classify the scene's attributes (multi-label sigmoid cross-entropy over
background, relation, each group's colour / shape / size / count and the colour x shape pairs present). Neither
tower sees the other, no retrieval loss is involved (so neither SS nor CE is favoured), and the features are
the towers' pooled outputs before the projection layer. The benchmark then trains projection heads on top
(``heads.py``), which is where the objectives differ.

Pretraining plus feature extraction takes a few minutes on 2 CPU cores and is cached in ``cache_dir``
(``features.npz`` + ``features.json`` holding the configuration it was made with; a different configuration
is a cache miss).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import numpy as np

from benchmarks.quality.families.scene_facts import scene_attributes

ATTRIBUTE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    num_train_images: int = 8000
    num_val_images: int = 500
    num_test_images: int = 500
    num_distractors: int = 1000
    captions_per_image: int = 5
    data_seed: int = 0
    image_epochs: int = 5
    caption_epochs: int = 1  # one pass over the captions = captions_per_image passes over the images
    pretrain_batch: int = 128
    pretrain_seed: int = 0

    def key(self) -> str:
        blob = json.dumps({**dataclasses.asdict(self), "v": ATTRIBUTE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _demo_config(fc: FeatureConfig):
    from ce_retrieval import configs
    from ce_retrieval.cli.train import resolve_config

    cfg = configs.load_experiment(resolve_config("synthetic_demo"), [])
    return configs.merge(
        cfg,
        {
            "data": {
                "num_train_images": fc.num_train_images,
                "num_val_images": fc.num_val_images,
                "num_test_images": fc.num_test_images,
                "captions_per_image": fc.captions_per_image,
                "seed": fc.data_seed,
            }
        },
    )


def _feature_model(tower, layer_name: str, input_name: str, dtype):
    """raw input -> the tower's pooled features (the input of its projection layer)."""
    import tf_keras

    core = tower.core
    features = tf_keras.Model(core.inputs, core.get_layer(layer_name).input, name=f"{input_name}_features")
    raw = tf_keras.Input(shape=(), dtype=dtype, name=input_name)
    return tf_keras.Model(raw, features(tower.preprocessor(raw)))


def _pretrain(extractor, inputs, targets, fc: FeatureConfig, epochs: int, what: str, log) -> None:
    import tensorflow as tf
    import tf_keras

    logits = tf_keras.layers.Dense(targets.shape[1], name=f"{what}_attributes")(extractor.output)
    classifier = tf_keras.Model(extractor.input, logits)
    classifier.compile(
        optimizer=tf_keras.optimizers.Adam(1e-3),
        loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[tf_keras.metrics.BinaryAccuracy(threshold=0.0, name="acc")],
    )
    data = tf.data.Dataset.from_tensor_slices((inputs, targets)).shuffle(len(targets), seed=fc.pretrain_seed)
    t0 = time.perf_counter()
    hist = classifier.fit(data.batch(fc.pretrain_batch).prefetch(2), epochs=epochs, verbose=0)
    log(
        f"[features] {what} tower pretrained on attributes: {epochs} epochs, "
        f"loss {hist.history['loss'][-1]:.4f}, bit accuracy {hist.history['acc'][-1]:.4f}, "
        f"{time.perf_counter() - t0:.0f} s"
    )


def _embed(model, items, batch: int = 512) -> np.ndarray:
    return np.asarray(model.predict(np.asarray(items, dtype=object), batch_size=batch, verbose=0), np.float32)


def build_features(fc: FeatureConfig, cache_dir: str, log=print) -> dict:
    """Pretrained frozen features of every split, from ``cache_dir`` or computed (and cached) now.

    Returns ``{"<split>_text": [C, dt], "<split>_text_ids": [C], "<split>_image": [I, di], "<split>_image_ids":
    [I]}`` for train / val / test, plus ``distractor_image`` ([D, di]), as NumPy arrays.
    """
    path = os.path.join(cache_dir, "features.npz")
    meta_path = os.path.join(cache_dir, "features.json")
    if os.path.exists(path) and os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f).get("key") == fc.key():
                with np.load(path) as z:
                    return {k: z[k] for k in z.files}
    import tensorflow as tf

    from ce_retrieval.data import synthetic, vocab_path_for
    from ce_retrieval.modeling.image_tower import build_image_tower
    from ce_retrieval.modeling.text_tower import build_text_tower
    from ce_retrieval.utils.seeding import seed_everything

    t0 = time.perf_counter()
    seed_everything(fc.pretrain_seed)  # before the towers: same seed, same features in every process
    cfg = _demo_config(fc)
    splits = {s: synthetic.split_from_config(cfg.data, s) for s in ("train", "val", "test")}
    log(
        "[features] synthetic splits generated: "
        f"{', '.join(f'{s} {len(v.images)}' for s, v in splits.items())} images, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    os.makedirs(cache_dir, exist_ok=True)
    vocab = vocab_path_for(cfg.data, cache_dir)
    text = _feature_model(
        build_text_tower(cfg.model.text, cfg.model.embedding_dim, vocab), "text_projection", "caption", tf.string
    )
    image = _feature_model(
        build_image_tower(cfg.model.image, cfg.model.embedding_dim), "image_projection", "image", tf.string
    )

    train = splits["train"]
    image_targets = np.stack([scene_attributes(s) for s in train.scenes])
    captions, caption_ids, caption_index = train.flat_captions()
    _pretrain(image, np.asarray(train.images, dtype=object), image_targets, fc, fc.image_epochs, "image", log)
    _pretrain(
        text, np.asarray(captions, dtype=object), image_targets[caption_index], fc, fc.caption_epochs, "text", log
    )

    out = {}
    for name, split in splits.items():
        caps, cap_ids, _ = split.flat_captions()
        out[f"{name}_text"] = _embed(text, caps)
        out[f"{name}_text_ids"] = np.asarray(cap_ids, np.int64)
        out[f"{name}_image"] = _embed(image, split.images)
        out[f"{name}_image_ids"] = np.asarray(split.image_ids, np.int64)
    out["distractor_image"] = _embed(
        image, synthetic.distractor_images(fc.num_distractors, seed=fc.data_seed + 7919, image_size=cfg.data.image_size)
    )
    tmp = path + ".tmp.npz"
    np.savez(tmp, **out)
    os.replace(tmp, path)
    with open(meta_path + ".tmp", "w") as f:
        json.dump({"key": fc.key(), "config": dataclasses.asdict(fc), "seconds": time.perf_counter() - t0}, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    log(f"[features] cached in {cache_dir} ({time.perf_counter() - t0:.0f} s)")
    return out

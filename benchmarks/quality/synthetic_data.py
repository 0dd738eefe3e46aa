"""Synthetic dataset benchmark: generation speed, hardness statistics, and learnability by a stand-in model.

Reports (1) generation time of the default splits, (2) how ambiguous the set is (scenes shared between images,
how many images the rarest caption word appears in), and (3) text->image Recall@K on the test split of a tiny
stand-in two-tower model (hashed bag-of-words text tower, 3-layer CNN image tower) trained with in-batch
softmax, against the same model untrained, in the same process. A set that is learnable but far from solved
at this scale leaves room for losses to differ.

    .venv/bin/python -m benchmarks.quality.synthetic_data --steps 400
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import numpy as np
import tensorflow as tf
import tf_keras

from ce_retrieval.data import DataConfig, load_retrieval_split, synthetic, train_pipeline
from ce_retrieval.utils.seeding import seed_everything


def _text_encoder(dim):
    captions = tf_keras.Input([], dtype=tf.string)
    tokens = tf.strings.split(tf.strings.lower(captions))
    ids = tf.strings.to_hash_bucket_fast(tokens, 4096)
    # Word identity plus word-bigram identity: order matters for "A above B" vs "B above A".
    bigrams = tf.strings.ngrams(tokens, 2)
    bids = tf.strings.to_hash_bucket_fast(bigrams, 4096) + 4096
    both = tf.concat([ids, bids], axis=1)
    emb = tf_keras.layers.Embedding(8192, 128)(both.to_tensor(default_value=0))
    mask = tf.cast(tf.expand_dims(both.to_tensor(default_value=-1) >= 0, -1), tf.float32)
    pooled = tf.reduce_sum(emb * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
    x = tf_keras.layers.Dense(256, activation="relu")(pooled)
    out = tf.math.l2_normalize(tf_keras.layers.Dense(dim)(x), -1)
    return tf_keras.Model(captions, out)


def _image_encoder(dim, size):
    images = tf_keras.Input([], dtype=tf.string)
    decode = tf_keras.layers.Lambda(
        lambda batch: tf.map_fn(
            lambda b: tf.cast(tf.io.decode_png(b, channels=3), tf.float32) / 255.0,
            batch,
            fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32),
        )
    )
    pixels = decode(images)
    x = pixels
    for filters in (32, 64, 96):
        x = tf_keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = tf_keras.layers.MaxPool2D()(x)
    x = tf_keras.layers.Flatten()(x)
    x = tf_keras.layers.Dense(256, activation="relu")(x)
    out = tf.math.l2_normalize(tf_keras.layers.Dense(dim)(x), -1)
    return tf_keras.Model(images, out)


def _recall(text, image, split, ks=(1, 5, 10)):
    q = np.concatenate(
        [text(tf.constant(split.captions[i : i + 500])).numpy() for i in range(0, len(split.captions), 500)]
    )
    d = np.concatenate(
        [image(tf.constant(split.images[i : i + 250])).numpy() for i in range(0, len(split.images), 250)]
    )
    scores = q @ d.T
    relevant = split.caption_ids[:, None] == split.image_ids[None, :]
    pos = (scores * relevant).max(1, keepdims=True)  # one relevant image per caption here
    rank = (scores > pos).sum(1)
    return {k: float((rank < k).mean()) for k in ks}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()
    cfg = DataConfig()

    t0, c0 = time.perf_counter(), time.process_time()
    splits = {s: synthetic.split_from_config(cfg, s) for s in ("train", "val", "test")}
    gen, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_images = sum(len(s.images) for s in splits.values())
    print(
        f"generation: {n_images} images at {cfg.image_size}px x {cfg.captions_per_image} captions in {gen:.1f} s wall, "
        f"{cpu:.1f} s CPU ({1000 * cpu / n_images:.2f} ms CPU/image); "
        f"mean PNG {np.mean([len(b) for b in splits['train'].images]):.0f} B"
    )

    train = splits["train"]
    scenes = defaultdict(int)
    for s in train.scenes:
        scenes[(s.groups, s.relation)] += 1
    shared = sum(c for c in scenes.values() if c > 1) / len(train.scenes)
    per_word = defaultdict(set)
    for i, caps in enumerate(train.captions):
        for c in caps:
            for w in re.findall(r"[a-z]+", c):
                per_word[w].add(i)
    rare = sorted(per_word, key=lambda w: len(per_word[w]))[:3]
    print(
        f"train: {len(scenes)} distinct scenes for {len(train.scenes)} images; {100 * shared:.1f}% of images share "
        f"their scene; vocabulary {len(per_word)} words; rarest words {[(w, len(per_word[w])) for w in rare]}"
    )

    seed_everything(0, deterministic=False)
    text, image = _text_encoder(64), _image_encoder(64, cfg.image_size)
    test = load_retrieval_split(cfg, "test")
    before = _recall(text, image, test)
    opt = tf_keras.optimizers.Adam(1e-3)
    variables = text.trainable_variables + image.trainable_variables

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            t, v = text(batch["caption"], training=True), image(batch["image"], training=True)
            logits = 20.0 * tf.matmul(t, v, transpose_b=True)
            same = tf.cast(tf.equal(batch["image_id"][:, None], batch["image_id"][None, :]), tf.float32)
            target = same / tf.reduce_sum(same, 1, keepdims=True)
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(target, logits))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    t0 = time.perf_counter()
    for i, batch in enumerate(train_pipeline(cfg, "train", args.batch_size, seed=0).take(args.steps)):
        loss = step(batch)
        if i % 100 == 0:
            print(f"step {i} loss {float(loss):.3f}")
    train_s = time.perf_counter() - t0
    after = _recall(text, image, test)
    print(
        f"stand-in t2i recall on test ({len(test.captions)} captions x {len(test.images)} images): "
        f"untrained {before}, after {args.steps} steps ({train_s:.0f} s) {after}"
    )


if __name__ == "__main__":
    main()

"""Frozen, pretrained tower features of a dataset family: the converged regime of ``paper_tables.py`` on any family.

As ``pretrained_features.py`` does for the embedded shapes, the demo model's two towers are pretrained once,
each on its own modality, to predict the family's per-image attributes (multi-label sigmoid cross-entropy; the
captions predict the attributes of their image), frozen, and their pooled features (before the projection
layer) cached. The difference: the splits come from the family's files on disk through the project's real
loader (``data.load_retrieval_split``), the attributes from the family's sidecar, and the vocabulary is
learned from the family's training captions. No retrieval loss is involved, so no objective is favoured.

Cached in ``cache_dir`` (``features.npz`` + ``features.json`` with the key it was made with).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import numpy as np

from benchmarks.quality.pretrained_features import _embed, _feature_model, _pretrain


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Feature pretraining: passes over the images / captions, batch, seed, distractor count.

    The defaults give each tower about the optimizer steps of ``pretrained_features.FeatureConfig`` (~310 at batch
    128) on a family of 3,000 training images x 5 captions; with fewer (3 and 1 passes: ~70 and ~120 steps) the
    attribute bit accuracy stays at the all-zero baseline (0.91 / 0.88) and no objective gets past 2 % PR-AUC."""

    image_epochs: int = 13
    caption_epochs: int = 3
    pretrain_batch: int = 128
    pretrain_seed: int = 0
    num_distractors: int = 500
    # extra distractors of the family for the precision promises at 10x / 100x the test gallery (guarantee_coverage)
    num_promise_distractors: int = 0


def _towers(data_cfg, cache_dir: str, overrides=()):
    import tensorflow as tf

    from ce_retrieval import configs
    from ce_retrieval.cli.train import resolve_config
    from ce_retrieval.data import vocab_path_for
    from ce_retrieval.modeling.image_tower import build_image_tower
    from ce_retrieval.modeling.text_tower import build_text_tower

    cfg = configs.load_experiment(resolve_config("synthetic_demo"), list(overrides))
    vocab = vocab_path_for(data_cfg, cache_dir)
    text = _feature_model(
        build_text_tower(cfg.model.text, cfg.model.embedding_dim, vocab), "text_projection", "caption", tf.string
    )
    image = _feature_model(
        build_image_tower(cfg.model.image, cfg.model.embedding_dim), "image_projection", "image", tf.string
    )
    return text, image


def build_family_features(
    family: str, data_cfg, family_dir: str, pc: PretrainConfig, cache_dir: str, log=print, overrides=()
) -> dict:
    """``{"<split>_text", "<split>_text_ids", "<split>_image", "<split>_image_ids"}`` for train / val / test and
    ``distractor_image``, as NumPy arrays (the layout ``heads.train_heads`` reads), from cache or computed now.
    ``overrides`` change the demo config the towers are built from (the quick plan's tiny model)."""
    from benchmarks.quality.families.families import family_distractors
    from benchmarks.quality.families.family_format import read_sidecar
    from ce_retrieval import data
    from ce_retrieval.utils.seeding import seed_everything

    with open(os.path.join(family_dir, "family.json"), encoding="utf-8") as f:
        written = json.load(f)["request"]
    key = hashlib.sha256(
        json.dumps([written, dataclasses.asdict(pc), list(overrides)], sort_keys=True).encode()
    ).hexdigest()[:16]
    path, meta_path = os.path.join(cache_dir, "features.npz"), os.path.join(cache_dir, "features.json")
    if os.path.exists(path) and os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f).get("key") == key:
                with np.load(path) as z:
                    return {k: z[k] for k in z.files}
    t0 = time.perf_counter()
    os.makedirs(cache_dir, exist_ok=True)
    splits = {s: data.load_retrieval_split(data_cfg, s) for s in ("train", "val", "test")}
    seed_everything(pc.pretrain_seed)  # before the towers: same seed, same features in every process (#30)
    text, image = _towers(data_cfg, cache_dir, overrides)
    train = splits["train"]
    targets = read_sidecar(family_dir, "train", train.image_ids)["attributes"]
    position = {image_id: k for k, image_id in enumerate(train.image_ids.tolist())}
    caption_targets = targets[[position[i] for i in train.caption_ids.tolist()]]
    _pretrain(image, np.asarray(train.images, dtype=object), targets, pc, pc.image_epochs, "image", log)
    _pretrain(text, np.asarray(train.captions, dtype=object), caption_targets, pc, pc.caption_epochs, "text", log)
    out = {}
    for name, split in splits.items():
        out[f"{name}_text"] = _embed(text, split.captions)
        out[f"{name}_text_ids"] = np.asarray(split.caption_ids, np.int64)
        out[f"{name}_image"] = _embed(image, split.images)
        out[f"{name}_image_ids"] = np.asarray(split.image_ids, np.int64)
    order = np.argsort(out["train_image_ids"])  # heads.train_heads looks images up with searchsorted
    out["train_image"], out["train_image_ids"] = out["train_image"][order], out["train_image_ids"][order]
    size = written["size"]
    out["distractor_image"] = _embed(
        image, family_distractors(family, pc.num_distractors, seed=size["seed"], image_size=size["image_size"])
    )
    if pc.num_promise_distractors:
        out["promise_distractor_image"] = _embed(
            image,
            family_distractors(
                family, pc.num_promise_distractors, seed=size["seed"] + 1, image_size=size["image_size"]
            ),
        )
    np.savez(path + ".tmp.npz", **out)
    os.replace(path + ".tmp.npz", path)
    with open(meta_path + ".tmp", "w") as f:
        json.dump({"key": key, "family": written, "seconds": time.perf_counter() - t0}, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    log(f"[features] {family}: cached in {cache_dir} ({time.perf_counter() - t0:.0f} s)")
    return out

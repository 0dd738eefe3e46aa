"""The synthetic set written in each real format reads back as the same examples through the real loaders."""

import numpy as np
import pytest

from ce_retrieval.data import DataConfig, load_examples, load_report, load_retrieval_split
from ce_retrieval.data.export import export_synthetic

CFG = DataConfig(num_train_images=6, num_val_images=4, num_test_images=5, image_size=24, captions_per_image=3, seed=9)


@pytest.mark.parametrize("fmt", ["karpathy", "cc_tsv", "tfrecord"])
def test_export_reads_back_identically(tmp_path, fmt):
    cfg = export_synthetic(CFG, str(tmp_path / fmt), fmt=fmt)
    assert cfg.name == fmt
    for split in ("train", "test"):
        want = load_retrieval_split(CFG, split)
        got = load_retrieval_split(cfg, split)
        order = np.argsort(got.image_ids)
        if fmt == "cc_tsv":  # hashed ids: compare through the image bytes
            assert sorted(got.images) == sorted(want.images)
            by_bytes = dict(zip(want.images, want.image_ids.tolist(), strict=True))
            got_ids = dict(zip(got.image_ids.tolist(), got.images, strict=True))
            mapped = [by_bytes[got_ids[i]] for i in got.caption_ids.tolist()]
            assert sorted(zip(got.captions, mapped, strict=True)) == sorted(
                zip(want.captions, want.caption_ids.tolist(), strict=True)
            )
        else:
            assert np.array_equal(got.image_ids[order], want.image_ids)
            assert [got.images[i] for i in order] == want.images
            assert sorted(zip(got.captions, got.caption_ids.tolist(), strict=True)) == sorted(
                zip(want.captions, want.caption_ids.tolist(), strict=True)
            )
    examples = list(load_examples(cfg, "val").as_numpy_iterator())
    assert len(examples) == 4 * 3 and load_report(cfg, "val").skipped == 0


def test_export_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="format"):
        export_synthetic(CFG, str(tmp_path), fmt="csv")
    with pytest.raises(ValueError, match="synthetic"):
        export_synthetic(DataConfig(name="tfrecord"), str(tmp_path))

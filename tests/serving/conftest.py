"""Fixtures of the serving tests: a read-only export of the stand-in towers and per-test copies of it."""

import numpy as np
import pytest
from serving_fixtures import GALLERY_SIZE, THRESHOLDS, make_towers, png_images


@pytest.fixture
def towers():
    return make_towers()


@pytest.fixture(scope="session")
def base_export(tmp_path_factory):
    """Version 1 of an export of the stand-in towers, with a brute-force index of 300 images. Read-only:
    tests that change an export work on ``export_copy``."""
    from ce_retrieval.serving.export import embed_with_keras, export_encoders
    from ce_retrieval.serving.index import build_index

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

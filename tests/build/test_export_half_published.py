"""A crash between the two renames of ``export`` (found by ``benchmarks/serving/reliability.py``: SIGKILL right after
``text_encoder/<v>`` appeared) leaves a text encoder without its image encoder. Readers here never list it, but TF
Serving would serve it next to the previous image encoder: the next export removes it and does not reuse its
number."""

import os
import shutil

from ce_retrieval.build.export import export_encoders
from ce_retrieval.search import layout


def test_next_export_removes_a_half_published_version(export_copy, towers):
    shutil.copytree(os.path.join(export_copy, "text_encoder", "1"), os.path.join(export_copy, "text_encoder", "2"))
    assert layout.half_published(export_copy) == [os.path.join(export_copy, "text_encoder", "2")]
    assert layout.complete_versions(export_copy) == [1]  # never visible to the Searcher / service
    os.makedirs(os.path.join(export_copy, "image_encoder", "7"))  # not written by export: left alone
    paths = export_encoders(*towers, export_copy, verify=False)
    assert paths.version == 8  # numbers are never reused
    assert not os.path.exists(os.path.join(export_copy, "text_encoder", "2"))
    assert os.path.isdir(os.path.join(export_copy, "image_encoder", "7"))
    assert layout.complete_versions(export_copy) == [1, 8] and layout.half_published(export_copy) == []

"""Export: TF Serving layout, signatures (saved_model_cli), fresh-process reload equality, REST-style requests,
atomic versioning under simulated crashes."""

import base64
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from export_fixtures import captions, make_towers, png_images

from ce_retrieval.build import export as export_mod
from ce_retrieval.build.export import embed_with_keras, export_encoders
from ce_retrieval.search import layout
from ce_retrieval.utils import atomic

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")


def test_layout_and_metadata(base_export):
    root = base_export["dir"]
    assert layout.complete_versions(root) == [1] and layout.servable_versions(root) == [1]
    assert layout.next_version(root) == 2
    meta = layout.export_metadata(root, layout.TEXT_ENCODER, 1)
    assert meta == dict(layout.export_metadata(root, layout.IMAGE_ENCODER, 1), part=layout.TEXT_ENCODER)
    assert meta["embedding_dim"] == 16 and meta["normalization"] == "l2" and meta["logit_scale"] == 20.0
    assert meta["logit_bias"] is None  # a model without a logit bias (only SigLIP-style losses have one)
    assert meta["custom_ops"] == ["CaseFoldUTF8"]  # the stand-in text tower uses TF-Text, like the real one
    assert meta["text_fingerprint"] == export_mod.weights_fingerprint(base_export["text"])
    other_text, _ = make_towers(seed=1)
    assert export_mod.weights_fingerprint(other_text) != meta["text_fingerprint"]
    with pytest.raises(FileExistsError, match="immutable"):
        export_encoders(base_export["text"], base_export["image"], root, version=1)


_FRESH_PROCESS = r"""
import base64, json, sys
import numpy as np
import ce_retrieval  # legacy Keras; TensorFlow itself loads the SavedModels below
import tensorflow as tf
root, out = sys.argv[1], sys.argv[2]
# 1) Without TF-Text's ops registered the text tower cannot load: what a TF Serving build must provide.
try:
    tf.saved_model.load(root + "/text_encoder/1")
    missing = "loaded"
except Exception as exc:
    missing = str(exc)
import tensorflow_text  # noqa: F401  (registers CaseFoldUTF8 & co.)
result = {"missing_op_error": missing}
for part, inp in (("text_encoder", "text"), ("image_encoder", "image_bytes")):
    model = tf.saved_model.load(f"{root}/{part}/1")
    with open(f"{out}/{part}_request.json") as f:
        request = json.load(f)  # TF Serving REST "instances" format, binary values as {"b64": ...}
    values = [row[inp] for row in request["instances"]]
    values = [base64.b64decode(v["b64"]) if isinstance(v, dict) else v.encode("utf-8") for v in values]
    for name in model.signatures:
        emb = model.signatures[name](**{inp: tf.constant(values, dtype=tf.string)})["embedding"].numpy()
        np.save(f"{out}/{part}_{name}.npy", emb)
    result[part] = sorted(model.signatures)
# 2) The image tower's serving signature as saved_model_cli prints it (its show code, run in this process to
#    spare a second TensorFlow start-up; the text tower is checked with the saved_model_cli program itself).
import contextlib, io
from tensorflow.python.tools import saved_model_cli
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    saved_model_cli._show_inputs_outputs(root + "/image_encoder/1", "serve", "serving_default")
result["image_signature"] = buf.getvalue()
json.dump(result, open(f"{out}/result.json", "w"))
"""


def test_fresh_process_reload_equals_keras_with_rest_requests(base_export, tmp_path):
    # the example requests shipped in export/requests/, plus generated ones (unicode text, PNG and JPEG bytes)
    with open(os.path.join(REPO, "export", "requests", "text_predict.json"), encoding="utf-8") as f:
        text_request = json.load(f)
    with open(os.path.join(REPO, "export", "requests", "image_predict.json"), encoding="utf-8") as f:
        image_request = json.load(f)
    texts = [row["text"] for row in text_request["instances"]] + captions(6, seed=3) + ["Ünïcode Straße 東京 ✓"]
    images = [base64.b64decode(row["image_bytes"]["b64"]) for row in image_request["instances"]]
    images += png_images(4, seed=9) + [tf.io.encode_jpeg(np.full((20, 30, 3), 90, np.uint8)).numpy()]
    with open(tmp_path / "text_encoder_request.json", "w") as f:
        json.dump(dict(text_request, instances=[{"text": t} for t in texts]), f, ensure_ascii=False)
    with open(tmp_path / "image_encoder_request.json", "w") as f:
        json.dump(
            dict(image_request, instances=[{"image_bytes": {"b64": base64.b64encode(b).decode()}} for b in images]), f
        )
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, base_export["dir"], str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert "CaseFoldUTF8" in result["missing_op_error"]
    assert result["text_encoder"] == ["embed_text", "serving_default"]
    assert result["image_encoder"] == ["embed_image", "serving_default"]
    want_text = embed_with_keras(base_export["text"], texts)
    want_image = embed_with_keras(base_export["image"], images)
    for name in ("serving_default", "embed_text"):
        np.testing.assert_allclose(np.load(tmp_path / f"text_encoder_{name}.npy"), want_text, atol=1e-5, rtol=0)
    for name in ("serving_default", "embed_image"):
        np.testing.assert_allclose(np.load(tmp_path / f"image_encoder_{name}.npy"), want_image, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(want_image, axis=1), 1.0, atol=1e-5)
    sig = result["image_signature"]
    assert "inputs['image_bytes'] tensor_info:\n      dtype: DT_STRING\n      shape: (-1)" in sig, sig
    assert "outputs['embedding'] tensor_info:\n      dtype: DT_FLOAT\n      shape: (-1, 16)" in sig, sig
    assert "Method name is: tensorflow/serving/predict" in sig


def test_saved_model_cli_signatures(base_export):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    root = base_export["dir"]
    proc = subprocess.run(
        [cli, "show", "--dir", f"{root}/text_encoder/1", "--all"], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text_out = proc.stdout
    for sig in ("serving_default", "embed_text"):
        block = text_out.split(f"signature_def['{sig}']")[1].split("signature_def[")[0]
        assert "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in block
        assert "outputs['embedding'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, 16)" in block
        assert "Method name is: tensorflow/serving/predict" in block
    assert "CaseFoldUTF8" in text_out  # the op list a TF Serving build must cover


def _numeric_and_hidden(root):
    out = {}
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        names = os.listdir(os.path.join(root, part))
        out[part] = (sorted(n for n in names if n.isdigit()), sorted(n for n in names if not n.isdigit()))
    return out


def test_crash_between_towers_rolls_back(base_export, export_copy, monkeypatch):
    before = layout.export_metadata(export_copy, layout.TEXT_ENCODER, 1)
    real_publish = atomic.publish_directory

    def publish(tmp, final, **kw):
        if os.sep + layout.IMAGE_ENCODER + os.sep in final:
            raise OSError("simulated crash while publishing the image tower")
        return real_publish(tmp, final, **kw)

    monkeypatch.setattr(atomic, "publish_directory", publish)
    with pytest.raises(OSError, match="simulated crash"):
        export_encoders(base_export["text"], base_export["image"], export_copy)
    assert _numeric_and_hidden(export_copy) == {p: (["1"], []) for p in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER)}
    assert layout.complete_versions(export_copy) == [1]
    assert layout.export_metadata(export_copy, layout.TEXT_ENCODER, 1) == before


def test_crash_mid_write_leaves_previous_version(base_export, export_copy, monkeypatch):
    real_save = tf.saved_model.save

    def save(obj, path, **kw):
        real_save(obj, path, **kw)
        with open(os.path.join(path, "variables", "variables.index"), "wb") as f:
            f.write(b"\0truncated")  # a half-written file ...
        raise KeyboardInterrupt("simulated kill mid-write")  # ... then the process is interrupted

    monkeypatch.setattr(tf.saved_model, "save", save)
    with pytest.raises(KeyboardInterrupt):
        export_encoders(base_export["text"], base_export["image"], export_copy, version=5)
    assert _numeric_and_hidden(export_copy) == {p: (["1"], []) for p in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER)}
    assert layout.servable_versions(export_copy) == [1]


def test_hard_kill_leftovers_are_invisible(export_copy):
    # What a SIGKILL can leave: a hidden temporary folder, and a text tower published without its image tower.
    os.makedirs(os.path.join(export_copy, layout.TEXT_ENCODER, ".tmp-2-123-deadbeef", "variables"))
    os.rename(os.path.join(export_copy, layout.IMAGE_ENCODER, "1"), os.path.join(export_copy, "image_v1_aside"))
    assert layout.complete_versions(export_copy) == []
    os.rename(os.path.join(export_copy, "image_v1_aside"), os.path.join(export_copy, layout.IMAGE_ENCODER, "1"))
    import shutil

    shutil.copytree(
        os.path.join(export_copy, layout.TEXT_ENCODER, "1"), os.path.join(export_copy, layout.TEXT_ENCODER, "3")
    )
    assert layout.versions(os.path.join(export_copy, layout.TEXT_ENCODER)) == [1, 3]
    assert layout.complete_versions(export_copy) == [1] and layout.servable_versions(export_copy) == [1]
    assert layout.next_version(export_copy) == 4  # a half-published number is never reused


def test_export_cli_uses_load_trained(base_export, tmp_path, monkeypatch, capsys):
    import dataclasses
    import types

    import ce_retrieval.training
    from ce_retrieval import cli

    @dataclasses.dataclass
    class FakeConfig:
        name: str = "tiny"

    model = types.SimpleNamespace(
        text_encoder=base_export["text"],
        image_encoder=base_export["image"],
        logit_scale=tf.constant(12.5),
        logit_bias=tf.constant(-7.25),  # a learned SigLIP bias is exported with λ
    )
    calls = []
    monkeypatch.setattr(
        ce_retrieval.training, "load_trained", lambda d: calls.append(d) or (FakeConfig(), model), raising=False
    )
    out = str(tmp_path / "cli_export")
    assert cli.main(["export", "--model_dir", "some/run", "--export_dir", out, "--version", "7", "--no_verify"]) == 0
    assert calls == ["some/run"] and "custom ops a TF Serving build must link: CaseFoldUTF8" in capsys.readouterr().out
    meta = layout.export_metadata(out, layout.IMAGE_ENCODER, 7)
    assert (
        meta["logit_scale"] == 12.5 and meta["logit_bias"] == -7.25 and meta["metadata"]["config"] == {"name": "tiny"}
    )
    assert layout.complete_versions(out) == [7]

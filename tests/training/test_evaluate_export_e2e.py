"""``ce-retrieval train``, ``evaluate``, ``export`` and ``index`` end to end through the command's entry point
(``ce_retrieval.cli.main``, in this process: the commands in fresh processes are test_train_e2e.py's and
test_demo_e2e.py's; loading an export in a fresh process is tests/build/test_serving_export.py's), on a model directory
the command trains (no monkeypatched loaders): the evaluation report agrees with figures computed here from the same
towers, and the exported SavedModels reproduce the Keras towers."""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
from sklearn.metrics import average_precision_score
from tiny import TINY_OVERRIDE


def _cli(*args):
    """``ce-retrieval ARGS`` through the command's entry point; what it printed."""
    from ce_retrieval.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([str(a) for a in args])
    assert code == 0, printed.getvalue()[-3000:]
    return printed.getvalue()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "model"
    override = TINY_OVERRIDE + ",evaluation.every_n_epochs=0"
    _cli("train", "--config", "synthetic_demo", "--model_dir", out, "--params_override", override)
    assert (out / "train_summary.json").exists()
    return out


@pytest.fixture(scope="module")
def trained(model_dir):
    from ce_retrieval import data
    from ce_retrieval.training import load_trained

    cfg, model = load_trained(str(model_dir))
    return cfg, model, data.load_retrieval_split(cfg.data, "test")


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory):
    """``ce-retrieval export`` of the trained model, run once: (export directory, what the command printed).
    Read-only: a test that adds to it works on a copy."""
    export_dir = tmp_path_factory.mktemp("exported") / "export"
    printed = _cli("export", "--model_dir", model_dir, "--export_dir", export_dir)
    return export_dir, printed


@pytest.mark.slow
def test_evaluate_on_a_trained_model_dir(model_dir, trained, tmp_path):
    from ce_retrieval.evaluation.embed import embed_split

    out = tmp_path / "eval"
    printed = _cli("evaluate", "--model_dir", model_dir, "--split", "test", "--output_dir", out, "--no_plots")
    report = json.loads((out / "eval_test.json").read_text())
    assert "PR-AUC" in printed and report["run_name"] == "model" and report["split"].endswith("test")
    # Independent figures from the same towers, loaded in this process: every caption x image pair ranked by
    # scikit-learn for the average precision, and text->image R@1 by argmax.
    _, model, test = trained
    q, d, qids, dids = embed_split(model.text_encoder, model.image_encoder, test)
    s = q.astype(np.float64) @ d.T.astype(np.float64)
    relevant = qids[:, None] == dids[None, :]
    assert report["num_captions"] == len(qids) and report["num_images"] == len(dids)
    assert report["summary"]["average_precision"] == pytest.approx(
        average_precision_score(relevant.ravel(), s.ravel()), abs=1e-6
    )
    assert report["summary"]["t2i_r1"] == pytest.approx(float(np.mean(dids[np.argmax(s, axis=1)] == qids)))


@pytest.mark.slow
def test_export_reproduces_the_keras_towers(exported, trained):
    from ce_retrieval.build.export import embed_with_keras, graph_functions, load_signature

    export_dir, printed = exported
    assert "exported version 1" in printed
    _, model, test = trained
    captions, images = list(test.captions[:20]), list(test.images[:8])
    for tower, encoder, key, inputs in (
        ("text_encoder", model.text_encoder, "text", captions),
        ("image_encoder", model.image_encoder, "image_bytes", images),
    ):
        for signature in ("serving_default", "embed_text" if key == "text" else "embed_image"):
            _, fn = load_signature(str(export_dir / tower / "1"), signature)
            got = fn(**{key: np.asarray(inputs, dtype=object)})["embedding"].numpy()
            want = embed_with_keras(encoder, inputs)
            assert got.shape == want.shape == (len(inputs), 16)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{tower} {signature}")
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        # Only the signatures are saved: no Keras trace of a layer's call (a served tower never runs one; saving
        # them made the export 4x slower, benchmarks/serving/export_time.py).
        functions = graph_functions(str(export_dir / tower / "1"))
        assert functions and not [name for name in functions if "layer_call" in name], tower


@pytest.mark.slow
def test_index_command_embeds_calibrates_and_builds(exported, trained, tmp_path):
    """``ce-retrieval index`` through each of its steps on a real export: the test split embedded, synthetic
    distractors added, the validation split calibrated (guaranteed thresholds for this gallery's size), the index
    built and loadable."""
    export_dir = tmp_path / "export"
    shutil.copytree(exported[0], export_dir)  # the index goes into the export: leave the shared one as it was
    printed = _cli(
        "index", "--export_dir", export_dir, "--images", "test", "--calibration_split", "val", "--distractors", 5
    )
    manifest = json.loads((export_dir / "index" / "1" / "manifest.json").read_text())
    _, _, test = trained
    assert manifest["num_items"] == len(test.images) + 5 and "index version 1" in printed
    assert manifest["gallery"]["distractors"] == 5 and manifest["gallery"]["calibration_split"] == "val"
    assert manifest["thresholds"]["guaranteed"]["gallery_size"] == manifest["num_items"]
    assert manifest["thresholds"]["calibration"]["source"] == {"split": "val"}


@pytest.mark.slow
def test_the_demo_coverage_study_embeds_each_model_and_checks_its_promises(model_dir, trained, tmp_path):
    """``benchmarks/quality/demo_coverage.py`` then ``guarantee_coverage.py`` on a demo-seeds layout whose four
    models are this trained model: the arrays are the towers' embeddings of the validation and test splits and of
    distractors no caption is about, and every promise is checked on the galleries they allow."""
    import os

    from benchmarks.quality import demo_coverage, guarantee_coverage
    from ce_retrieval.evaluation.embed import embed_split

    seed_dir = tmp_path / "demo_seeds" / "seed3"
    for sub, _ in demo_coverage.MODELS:
        (seed_dir / sub).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(model_dir, seed_dir / sub)
    (tmp_path / "demo_seeds" / "seed9").mkdir()  # no models: not a run
    out = tmp_path / "coverage"
    args = ["--demo_runs", str(tmp_path / "demo_seeds"), "--out", str(out), "--distractors", "108"]
    assert demo_coverage.main(args) == 0
    _, model, test = trained
    q, d, q_ids, d_ids = embed_split(model.text_encoder, model.image_encoder, test)
    for _, label in demo_coverage.MODELS:
        with np.load(out / "runs" / "demo" / "scenes" / f"{label}-seed3.npz") as z:
            np.testing.assert_allclose(z["q"], q, atol=1e-5)
            np.testing.assert_allclose(z["d"], d, atol=1e-5)
            assert np.array_equal(z["q_ids"], q_ids) and np.array_equal(z["d_ids"], d_ids)
            assert z["val_q"].shape[0] == len(z["val_q_ids"]) > 0 and z["promise_d"].shape == (108, d.shape[1])
    results = tmp_path / "results"
    argv = ["--runs", str(out), "--results", str(results), "--name", "cov", "--resamples", "1"]
    assert guarantee_coverage.main(argv) == 0
    record = json.loads((results / "cov.json").read_text())
    labels = sorted(label for _, label in demo_coverage.MODELS)
    assert record["num_runs"] == 4 and record["regimes"] == ["demo"] and record["objectives"] == labels
    galleries = {g["multiplier"] for g in record["groups"]}
    assert galleries == {1, 10}, galleries  # 12 test images and 108 distractors: x1 and x10, not x100

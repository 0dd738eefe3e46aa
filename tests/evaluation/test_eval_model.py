"""End to end with stand-in towers: embedding, evaluate_model (JSON + plots), the callback inside fit, the CLIs."""

import json
import os
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from _eval_standins import COLOURS, TwoTowerStandIn, make_split, png, train_dataset

import ce_retrieval.data
import ce_retrieval.training
from ce_retrieval import cli
from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.callback import RetrievalEvaluationCallback
from ce_retrieval.evaluation.embed import embed_split
from ce_retrieval.evaluation.evaluate import dataset_fingerprint, evaluate_model
from ce_retrieval.evaluation.retrieval import recall_at_k


@pytest.fixture
def towers():
    model = TwoTowerStandIn()
    split = make_split(num_images=16, captions_per_image=2, seed=1, name="val")
    model(next(iter(train_dataset(split))))  # build
    return model, split


def _png_ok(path):
    with open(path, "rb") as f:
        head = f.read(8)
    return head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


def test_embed_split_batches_like_a_direct_call(towers):
    model, split = towers
    q, d, qi, di = embed_split(model.text_encoder, model.image_encoder, split, batch_size=5)
    assert q.shape == (32, 8) and d.shape == (16, 8) and q.dtype == np.float32
    np.testing.assert_allclose(q, model.text_encoder(tf.constant(split.captions)).numpy(), atol=1e-6)
    np.testing.assert_allclose(d, model.image_encoder(tf.constant(split.images)).numpy(), atol=1e-6)
    np.testing.assert_array_equal(qi, split.caption_ids)
    np.testing.assert_array_equal(di, split.image_ids)


def test_evaluate_model_writes_json_and_plots(towers, tmp_path):
    model, split = towers
    rng = np.random.default_rng(5)
    distractors = [png(rgb, rng) for rgb in COLOURS.values()] * 2
    result = evaluate_model(
        model.text_encoder,
        model.image_encoder,
        split,
        distractor_images=distractors,
        output_dir=str(tmp_path),
        run_name="standin",
        config={"loss": "in-batch"},
        batch_size=7,
    )
    with open(tmp_path / "eval_val.json") as f:
        doc = json.load(f)
    assert doc["run_name"] == "standin" and doc["split"] == "val" and doc["config"] == {"loss": "in-batch"}
    assert doc["dataset_fingerprint"] == dataset_fingerprint(split) == result["dataset_fingerprint"]
    assert doc["num_distractors"] == 16 and doc["metrics"]["distractors"]["gallery_size"] == 32
    q, d, qi, di = embed_split(
        model.text_encoder, model.image_encoder, split, batch_size=7
    )  # the batches evaluate_model used
    recall = recall_at_k(q, d, qi, di)
    cal = global_pr_auc(q, d, qi, di)
    assert doc["summary"]["t2i_r1"] == pytest.approx(recall["t2i"][1])
    assert doc["summary"]["rsum"] == pytest.approx(recall["rsum"])
    assert doc["summary"]["pr_auc"] == pytest.approx(cal["pr_auc"], rel=1e-6)
    assert set(doc["summary"]) >= {"dis_t2i_r1", "dis_t2i_r100", "i2t_r10", "average_precision"}
    for key in ("pr_curve", "score_distribution", "retrieval_sheet"):
        assert _png_ok(doc["files"][key]), key
    other = make_split(num_images=16, captions_per_image=2, seed=2)
    assert dataset_fingerprint(other) != dataset_fingerprint(split)


def test_callback_inside_fit_feeds_history_checkpoint_and_tensorboard(tmp_path):
    train = make_split(num_images=32, captions_per_image=4, seed=0, name="train")
    val = make_split(num_images=16, captions_per_image=2, seed=1, name="val")
    model = TwoTowerStandIn()
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05))
    data = train_dataset(train, batch_size=16)
    model(next(iter(data)))
    before = RetrievalEvaluationCallback(val)
    before.set_model(model)
    start = before.evaluate()
    callback = RetrievalEvaluationCallback(val, every_n_epochs=2, log_dir=str(tmp_path / "logs"), batch_size=8)
    checkpoint = tf_keras.callbacks.ModelCheckpoint(
        str(tmp_path / "best.weights.h5"), monitor="val_pr_auc", mode="max", save_best_only=True, save_weights_only=True
    )
    history = model.fit(data, epochs=5, callbacks=[callback, checkpoint], verbose=0)
    logged = history.history
    # evaluated at epochs 2, 4 and the last (5): History only keeps keys from the first epoch on, so check logs
    assert callback.last_results is not None and set(callback.last_results) >= {"pr_auc", "rsum", "t2i_r1", "i2t_r10"}
    assert "loss" in logged
    assert os.path.exists(tmp_path / "best.weights.h5")
    events = [f for f in os.listdir(tmp_path / "logs" / "retrieval") if f.startswith("events")]
    assert events
    assert callback.last_results["rsum"] > start["rsum"] + 0.5
    assert callback.last_results["pr_auc"] > start["pr_auc"]


def test_callback_every_epoch_puts_metrics_in_history(towers):
    model, split = towers
    model.compile(optimizer=tf_keras.optimizers.Adam(0.01))
    history = model.fit(
        train_dataset(split), epochs=2, callbacks=[RetrievalEvaluationCallback(split, pr_auc=False)], verbose=0
    )
    assert len(history.history["val_rsum"]) == 2 and "val_pr_auc" not in history.history
    with pytest.raises(ValueError, match="every_n_epochs"):
        RetrievalEvaluationCallback(split, every_n_epochs=0)


def _fake_result(path, run_name, pr_auc, r1, distractors=True):
    summary = {
        "pr_auc": pr_auc,
        "average_precision": pr_auc,
        "best_f1": 0.3,
        "rsum": 3.0 + r1,
        "t2i_r1": r1,
        "t2i_r5": 0.5,
        "t2i_r10": 0.6,
        "i2t_r1": 0.2,
        "i2t_r5": 0.5,
        "i2t_r10": 0.6,
    }
    if distractors:
        summary.update(dis_t2i_r1=0.0138, dis_t2i_r5=0.0399, dis_t2i_r10=0.0616, dis_t2i_r100=0.2044)
    curve = {"recall": [0.0, 0.5, 1.0], "precision": [1.0, pr_auc + 0.1, pr_auc]}
    doc = {
        "run_name": run_name,
        "summary": summary,
        "num_distractors": 3318333 if distractors else 0,
        "dataset_fingerprint": "abc",
        "metrics": {"calibration": {"pr_auc": pr_auc, "curve": curve}},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_report_table_markdown_and_plot(tmp_path, capsys):
    files = [
        _fake_result(tmp_path / "a1.json", "Sampled Softmax", 0.1461, 0.2587),
        _fake_result(tmp_path / "b1.json", "CE-Softmax", 0.2000, 0.2690),
        _fake_result(tmp_path / "b2.json", "CE-Softmax", 0.2024, 0.2700),
    ]
    md, plot = tmp_path / "table.md", tmp_path / "pr.png"
    assert cli.main(["report", *files, "--markdown", str(md), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "Recall on test set" in out and "+3,318,333 distractors" in out
    assert "PR AUC" in out and "@100" in out and "rsum" in out
    sampled = next(line for line in out.splitlines() if line.startswith("Sampled Softmax"))
    assert "14.61" in sampled and "25.87" in sampled and "1.38" in sampled and "20.44" in sampled
    ce = next(line for line in out.splitlines() if line.startswith("CE-Softmax"))
    assert "20.12 ± 0.17" in ce and " 2 " in ce
    text = md.read_text()
    assert "| Sampled Softmax | 1 | 14.61 | 25.87 |" in text and "20.12 ± 0.17" in text and "R@100 dis." in text
    assert _png_ok(plot)


def test_report_rejects_non_evaluation_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="not an evaluation JSON"):
        cli.main(["report", str(bad)])


def test_evaluate_command_with_stand_in_loaders(towers, tmp_path, monkeypatch, capsys):
    model, split = towers
    from ce_retrieval.configs.experiment import ExperimentConfig
    from ce_retrieval.data import DataConfig

    cfg = ExperimentConfig(data=DataConfig(name="synthetic", image_size=16))  # what load_trained returns
    seen = {}

    def load_trained(model_dir):
        seen["model_dir"] = model_dir
        return cfg, model

    def load_retrieval_split(data_cfg, name):
        assert data_cfg is cfg.data
        return make_split(num_images=16, captions_per_image=2, seed=1, name=name)

    def distractor_images(n, seed, image_size):
        rng = np.random.default_rng(seed)
        return [png((128, 128, 128), rng, image_size) for _ in range(n)]

    monkeypatch.setattr(ce_retrieval.training, "load_trained", load_trained, raising=False)
    monkeypatch.setattr(ce_retrieval.data, "load_retrieval_split", load_retrieval_split, raising=False)
    monkeypatch.setitem(
        sys.modules, "ce_retrieval.data.synthetic", types.SimpleNamespace(distractor_images=distractor_images)
    )
    out_dir = tmp_path / "out"
    code = cli.main(
        [
            "evaluate",
            "--model_dir",
            str(tmp_path / "run7"),
            "--split",
            "test",
            "--distractors",
            "5",
            "--output_dir",
            str(out_dir),
            "--no_plots",
            "--ann",
        ]
    )
    assert code == 0 and seen["model_dir"] == str(tmp_path / "run7")
    doc = json.loads((out_dir / "eval_test.json").read_text())
    assert doc["run_name"] == "run7" and doc["num_distractors"] == 5 and doc["split"] == "test"
    assert doc["metrics"]["ann"]["loss"]["1"] == 0.0  # 16 images: ScaNN runs brute force, the same top-1 as exact
    assert "PR-AUC" in capsys.readouterr().out


def test_git_commit_names_the_commit_and_marks_uncommitted_changes(tmp_path):
    import subprocess

    from ce_retrieval.evaluation.evaluate import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert git_commit(str(tmp_path)) is None  # not a checkout
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path)) == head + "-dirty"

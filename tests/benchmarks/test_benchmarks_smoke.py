"""The benchmark scripts run end to end on tiny sizes (their figures live in BENCHMARKS.md; here only that every
registered loss gets a row and a finite ratio, so a new loss cannot silently break the benchmark)."""

import math

import pytest

from benchmarks.losses import all_losses, dml_pairs_check
from benchmarks.quality import paper_tables
from ce_retrieval import losses


@pytest.mark.slow  # 37 s under load 6-8: every registered loss traced once
def test_losses_benchmark_covers_every_registered_loss(capsys):
    assert all_losses.main(["--sizes", "32", "--modes", "function", "--repeats", "1"]) == 0
    rows = [
        line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line
    ]
    ratios = {cells[1].strip(): cells[5].strip() for cells in rows[1:]}
    assert set(ratios) == set(losses.available())
    for name, ratio in ratios.items():
        assert math.isfinite(float(ratio)) and float(ratio) > 0, (name, ratio)


@pytest.mark.slow  # 29 s under load 6-8
def test_dml_pairs_benchmark_runs(capsys, monkeypatch):
    argv = [
        "dml_pairs_check.py",
        "--n",
        "32",
        "--repeats",
        "1",
        "--per-class",
        "4",
        "--only",
        "TripletLoss(all),+npair",
    ]
    monkeypatch.setattr("sys.argv", argv)
    dml_pairs_check.main()
    out = capsys.readouterr().out
    assert "TripletLoss(all)" in out and "AngularLoss(+npair)" in out


@pytest.mark.slow
def test_paper_tables_smoke_writes_every_artefact(tmp_path):
    """``python -m benchmarks.quality.paper_tables --smoke``: every stage on tiny sizes. Two feature draws (towers
    pretrained with seeds 0 and 1), four objectives (one that only CE is paired with, one with a learned t and b), λ
    chosen per objective on validation (draw 0, seed 0) and
    used on every draw with SigLIP's learned t and b not swept (#30 parts 2 and 3), the paired differences with the
    draw as the unit, both sweeps and the figures."""
    import json

    import numpy as np

    losses = ["SampledSoftmax", "CrossExampleSoftmax", "SymmetricInfoNCE", "SigLIP"]  # every other: the test below
    assert paper_tables.main(["--smoke", "--out", str(tmp_path), "--losses", *losses]) == 0
    table = (tmp_path / "table.md").read_text()
    for label in losses:
        assert f"| {label} | 2 |" in table, label
    assert "CrossExampleSoftmax − SampledSoftmax | global PR-AUC" in table
    assert "CrossExampleSoftmax − SigLIP | global PR-AUC" in table
    assert "CE gain against global batch size" in table and "CE gain against logit scale" in table
    for name in ("curves", "reliability", "separation", "sweep_batch", "sweep_scale"):
        assert (tmp_path / f"{name}.png").stat().st_size > 5_000, name
    draws = [np.load(tmp_path / d / "features.npz")["test_image"] for d in ("features", "features-draw1")]
    assert not np.array_equal(*draws)  # two pretrainings, two sets of features
    summary = json.loads((tmp_path / "summary.json").read_text())
    for label in ("SampledSoftmax", "CrossExampleSoftmax", "SymmetricInfoNCE"):
        choice = summary["scales"][label]
        assert [r["scale"] for r in choice["sweep"]] == [10.0, 40.0]
        assert choice["scale"] == max(choice["sweep"], key=lambda r: r["score"])["scale"]
        for name in (f"{label}-seed0", f"{label}-draw1-seed0"):
            train = json.loads((tmp_path / "runs" / f"{name}.json").read_text())["config"]["train"]
            assert train["scale"] == choice["scale"] and train["scales"] == [10.0, 40.0]
    assert summary["scales"]["SigLIP"]["sweep"] == []
    siglip = json.loads((tmp_path / "runs" / "SigLIP-draw1-seed0.json").read_text())["config"]["train"]
    assert siglip["scale"] is None and set(siglip["learned"]) == {"log_temperature", "logit_bias"}
    ce = summary["paired"]["CrossExampleSoftmax-SampledSoftmax:pr_auc"]
    assert ce["by"] == "feature draw" and ce["units"] == 2 and set(ce["draw_diffs"]) == {"0", "1"}
    run = json.loads((tmp_path / "runs" / "CrossExampleSoftmax-seed0.json").read_text())
    assert run["curve"]["step"] == [10, 20] and run["config"]["train"]["batch_size"] == 64
    assert "transfer" in run["metrics"] and run["summary"]["threshold_spread"] is not None
    promises = table.split("## Promises of precision (thresholds from validation")[1]
    assert "| SigLIP | 2 |" in promises and "P ≥ 0.1 | P ≥ 0.2 | P ≥ 0.3 | P ≥ 0.4 | P ≥ 0.5 | P ≥ 0.8" in promises


def test_every_paper_tables_objective_gives_a_finite_loss_and_gradient():
    """Each of the table's eight objectives builds through ``suite_objectives.heads_loss`` at a λ of the sweep (SigLIP
    with its learned t and b) and gives a finite loss and gradient on a small batch with repeated ids."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.quality import suite_objectives as so

    rng = np.random.default_rng(0)
    x = tf.Variable(rng.normal(size=(6, 8)).astype(np.float32))
    y = tf.constant(rng.normal(size=(6, 8)).astype(np.float32))
    ids = np.array([0, 0, 1, 2, 3, 4])
    relevance = tf.constant((ids[:, None] == ids[None, :]).astype(np.float32))
    for label, objective in paper_tables.OBJECTIVES.items():
        loss_fn, extra = so.heads_loss(objective, 10.0)
        with tf.GradientTape() as tape:
            scores = tf.matmul(tf.math.l2_normalize(x, -1), tf.math.l2_normalize(y, -1), transpose_b=True)
            value = loss_fn(relevance, scores)
        grads = tape.gradient(value, [x, *extra])
        assert np.isfinite(float(value)), label
        assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads), label
        assert bool(extra) == (label == "SigLIP"), label


def test_paper_tables_full_refuses_what_only_the_frozen_feature_table_does():
    """``--full`` trains the paper's six losses end to end: SigLIP, InfoNCE, feature draws and a λ sweep belong to
    the frozen-feature table, and asking for them says so before anything is trained."""
    for argv in (["--losses", "SigLIP"], ["--draws", "3"], ["--scales", "5", "10"]):
        with pytest.raises(SystemExit, match="drop --full"):
            paper_tables.main(["--full", *argv])

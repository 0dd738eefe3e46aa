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
    """``python -m benchmarks.quality.paper_tables --smoke``: every stage (features, six objectives x 2 seeds,
    paired CE - SS, both sweeps, the figures) on tiny sizes."""
    import json

    assert paper_tables.main(["--smoke", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    for loss in paper_tables.PAPER_LOSSES:
        assert f"| {loss} | 2 |" in table, loss
    assert "CrossExampleSoftmax − SampledSoftmax | global PR-AUC" in table
    assert "CE gain against global batch size" in table and "CE gain against logit scale" in table
    for name in ("curves", "reliability", "separation", "sweep_batch", "sweep_scale"):
        assert (tmp_path / f"{name}.png").stat().st_size > 5_000, name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["paired"]["CrossExampleSoftmax-SampledSoftmax:pr_auc"]["n"] == 2
    run = json.loads((tmp_path / "runs" / "CrossExampleSoftmax-seed0.json").read_text())
    assert run["curve"]["step"] == [10, 20] and run["config"]["train"]["batch_size"] == 64
    assert "transfer" in run["metrics"] and run["summary"]["threshold_spread"] is not None

"""The benchmark scripts run end to end on tiny sizes (their figures live in BENCHMARKS.md; here only that every
registered loss gets a row and a finite ratio, so a new loss cannot silently break the benchmark)."""
import importlib.util
import math
import pathlib

from ce_retrieval import losses

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_losses_benchmark_covers_every_registered_loss(capsys):
    bench = _load("losses")
    assert bench.main(["--sizes", "32", "--modes", "function", "--repeats", "1"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    ratios = {cells[1].strip(): cells[5].strip() for cells in rows[1:]}
    assert set(ratios) == set(losses.available())
    for name, ratio in ratios.items():
        assert math.isfinite(float(ratio)) and float(ratio) > 0, (name, ratio)


def test_dml_pairs_benchmark_runs(capsys, monkeypatch):
    bench = _load("dml_pairs_check")
    argv = ["dml_pairs_check.py", "--n", "32", "--repeats", "1", "--per-class", "4", "--only", "TripletLoss(all),+npair"]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    out = capsys.readouterr().out
    assert "TripletLoss(all)" in out and "AngularLoss(+npair)" in out

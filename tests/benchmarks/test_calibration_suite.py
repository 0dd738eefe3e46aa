"""The calibration suite (#21): its ``--quick`` plan end to end, the paired table and the part-3 analysis maths."""

import json

import numpy as np
import pytest
from bench_loader import load_benchmark

from ce_retrieval import losses


def _registered(name):
    try:
        losses.lookup(name)
        return True
    except ValueError:
        return False


@pytest.mark.slow
def test_quick_plan_writes_tables_plots_and_analysis(tmp_path):
    suite = load_benchmark("calibration_suite")
    results = tmp_path / "results"
    args = ["--quick", "--out", str(tmp_path), "--results", str(results), "--analyse", "--promise_distractors", "80"]
    assert suite.main(args) == 0
    md = (results / "suite.md").read_text()
    for regime in ("heads", "scratch"):
        assert f"## {regime} regime, digits" in md
    objectives = suite.QUICK.heads_objectives
    for name in objectives:
        objective = suite.so.OBJECTIVES[name]
        if all(_registered(n) for n in filter(None, (objective.loss, objective.regularizer))):
            assert f"| {name} | " in md, name
        else:
            assert f"heads/digits/{name}: **not available**" in md, name
    record = json.loads((results / "suite.json").read_text())
    ce = next(row for row in record["tables"]["heads/digits"] if row["objective"] == "CE")
    assert ce["pr_auc"]["n"] == 2 and ce["pr_auc"]["pairs"] == 2 and ce["pr_auc"]["diff"] is not None
    ss_runs = [r for r in record["runs"] if r["run_name"] == "SS" and r["regime"] == "scratch"]
    assert sorted(r["seed"] for r in ss_runs) == [0, 1]
    assert ss_runs[0]["curve"]["step"] == [3] and ss_runs[0]["curve"]["split"] == "val"
    assert (results / "digits.png").stat().st_size > 5_000
    analysis = (results / "analysis.md").read_text()
    assert "## heads regime, digits" in analysis and "## scratch regime, digits" in analysis
    assert "fits-aware R@1" in analysis and "Against steps" in analysis
    # every run keeps what the coverage study reads; the study runs on them (#29 part 2)
    with np.load(tmp_path / "runs" / "heads" / "digits" / "CE-seed0.npz") as z:
        assert {"val_q", "val_d", "promise_d"} <= set(z.files) and len(z["promise_d"]) == 80
    assert "guaranteed_recall_0.5" in ce_doc_summary(tmp_path)
    coverage = load_benchmark("guarantee_coverage")
    assert coverage.main(["--runs", str(tmp_path), "--results", str(results), "--resamples", "2"]) == 0
    cov = json.loads((results / "guarantee_coverage.json").read_text())
    assert cov["num_runs"] == len(record["runs"]) and {t["multiplier"] for t in cov["totals"]} == {1, 10}
    assert "## Totals" in (results / "guarantee_coverage.md").read_text()


def ce_doc_summary(out):
    return json.loads((out / "runs" / "heads" / "digits" / "CE-seed0.json").read_text())["summary"]


def _doc(name, seed, **summary):
    return {"run_name": name, "regime": "heads", "family": "f", "config": {"train": {"seed": seed}}, "summary": summary}


def test_table_rows_pair_by_seed_and_test_the_difference():
    report = load_benchmark("calibration_suite_report")
    ss = [_doc("SS", s, pr_auc=v) for s, v in ((0, 0.30), (1, 0.32), (2, 0.31))]
    ce = [_doc("CE", s, pr_auc=v) for s, v in ((2, 0.36), (0, 0.33), (1, 0.36))]  # out of order: paired by seed
    rows = {r["objective"]: r for r in report.table_rows({"SS": ss, "CE": ce})}
    cell = rows["CE"]["pr_auc"]
    diffs = np.asarray([0.03, 0.04, 0.05])
    assert cell["diff"] == pytest.approx(diffs.mean()) and cell["pairs"] == 3
    t = diffs.mean() / (diffs.std(ddof=1) / np.sqrt(3))
    from scipy import stats

    assert cell["p"] == pytest.approx(2 * stats.t.sf(abs(t), df=2))
    assert "diff" not in rows["SS"]["pr_auc"] and rows["CE"]["opis"]["mean"] is None


def test_per_query_ranks_fits_and_offsets_match_a_brute_force_count():
    analysis = load_benchmark("calibration_analysis")
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    q_ids, d_ids = np.asarray([10, 11, 12, 13, 14, 10, 99]), np.asarray([14, 13, 12, 11, 10])
    fits = [{10, 12}, {11}, {12}, {13, 10}, {14}, {10}, {12}]
    out = analysis.per_query(q, d, q_ids, d_ids, fits)
    s = (q.astype(np.float32) @ d.astype(np.float32).T).astype(np.float64)
    for i in range(7):
        cols = [j for j in range(5) if d_ids[j] == q_ids[i]]
        if not cols:
            assert np.isnan(out["rank"][i]) and np.isnan(out["z_positive"][i])
            continue
        own = s[i, cols[0]]
        assert out["rank"][i] == 1 + sum(s[i, j] > own for j in range(5))
        assert out["z_positive"][i] == pytest.approx((own - s.mean()) / s.std(), rel=1e-4)
        assert out["fits_top"][i] == (d_ids[int(np.argmax(s[i]))] in fits[i])
    from sklearn.metrics import average_precision_score

    relevant = np.asarray([[d_ids[j] in fits[i] for j in range(5)] for i in range(7)])
    assert out["fits_ap"] == pytest.approx(average_precision_score(relevant.ravel(), s.ravel()), rel=1e-6)
    np.testing.assert_allclose(out["z_row"], (s.mean(axis=1) - s.mean()) / s.std(), rtol=1e-4, atol=1e-6)


def test_objectives_not_in_the_project_are_reported_not_faked():
    objectives = load_benchmark("suite_objectives")
    missing = objectives.Objective("NoSuchLoss")
    assert objectives.unavailable(missing, "heads") == "NoSuchLoss is not registered in ce_retrieval.losses"
    assert objectives.unavailable(objectives.OBJECTIVES["CE"], "heads") is None
    with pytest.raises(ValueError, match="needs a 'loss'"):
        objectives.recipe_objective({"kwargs": {}})

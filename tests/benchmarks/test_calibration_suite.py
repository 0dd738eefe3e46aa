"""The calibration suite (#21): its ``--quick`` plan end to end, the paired table and the part-3 analysis maths."""

import json

import numpy as np
import pytest

from benchmarks.quality import calibration_analysis as analysis
from benchmarks.quality import calibration_suite as suite
from benchmarks.quality import calibration_suite_report as report
from benchmarks.quality import guarantee_coverage as coverage
from benchmarks.quality import suite_objectives as objectives
from ce_retrieval import losses


def _registered(name):
    try:
        losses.lookup(name)
        return True
    except ValueError:
        return False


@pytest.mark.slow
def test_quick_plan_writes_tables_plots_and_analysis(tmp_path):
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
    heads_ss = [r for r in record["runs"] if r["run_name"] == "SS" and r["regime"] == "heads"]
    assert sorted(r["seed"] for r in heads_ss) == [0, 1]
    scratch = [r for r in record["runs"] if r["regime"] == "scratch"]  # the quick plan: one scratch seed
    assert sorted((r["run_name"], r["seed"]) for r in scratch) == [("CE", 0), ("SS", 0)]
    ss_run = next(r for r in scratch if r["run_name"] == "SS")
    assert ss_run["curve"]["step"] == [3] and ss_run["curve"]["split"] == "val"
    assert (results / "digits.png").stat().st_size > 5_000
    analysis = (results / "analysis.md").read_text()
    assert "## heads regime, digits" in analysis and "## scratch regime, digits" in analysis
    assert "fits-aware R@1" in analysis and "Against steps" in analysis
    # every run keeps what the coverage study reads; the study runs on them (#29 part 2)
    with np.load(tmp_path / "runs" / "heads" / "digits" / "CE-seed0.npz") as z:
        assert {"val_q", "val_d", "promise_d"} <= set(z.files) and len(z["promise_d"]) == 80
    assert "guaranteed_recall_0.5" in ce_doc_summary(tmp_path)
    assert coverage.main(["--runs", str(tmp_path), "--results", str(results), "--resamples", "2"]) == 0
    cov = json.loads((results / "guarantee_coverage.json").read_text())
    assert cov["num_runs"] == len(record["runs"]) and {t["multiplier"] for t in cov["totals"]} == {1, 10}
    text = (results / "guarantee_coverage.md").read_text()
    assert "## Totals" in text and "## Highest precision certified" in text


def ce_doc_summary(out):
    return json.loads((out / "runs" / "heads" / "digits" / "CE-seed0.json").read_text())["summary"]


def _doc(name, seed, **summary):
    return {"run_name": name, "regime": "heads", "family": "f", "config": {"train": {"seed": seed}}, "summary": summary}


def test_table_rows_pair_by_seed_and_test_the_difference():
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
    missing = objectives.Objective("NoSuchLoss")
    assert objectives.unavailable(missing, "heads") == "NoSuchLoss is not registered in ce_retrieval.losses"
    assert objectives.unavailable(objectives.OBJECTIVES["CE"], "heads") is None
    with pytest.raises(ValueError, match="needs a 'loss'"):
        objectives.recipe_objective({"kwargs": {}})


def _features(rng, n_img=24, caps=2, dim=8):
    out = {}
    for split in ("train", "val", "test"):
        ids = np.arange(n_img) + {"train": 0, "val": 1000, "test": 2000}[split]
        img = rng.normal(size=(n_img, dim)).astype(np.float32)
        out[f"{split}_image"], out[f"{split}_image_ids"] = img, ids
        out[f"{split}_text"] = np.repeat(img, caps, 0) + 0.3 * rng.normal(size=(n_img * caps, dim)).astype(np.float32)
        out[f"{split}_text_ids"] = np.repeat(ids, caps)
    out["distractor_image"] = rng.normal(size=(4, dim)).astype(np.float32)
    return out


def test_the_scale_is_chosen_on_validation_only():
    """#30 part 3: the sweep's choice reads the validation split only (the features given have no test arrays to
    read: any access would fail) and takes the λ with the best validation PR-AUC + R@1."""
    plan = suite.dataclasses.replace(suite.QUICK, scales=(5.0, 40.0), heads_steps=4, heads_batch=8)
    features = _features(np.random.default_rng(0))

    class NoTest(dict):
        def __getitem__(self, key):
            assert not key.startswith("test_"), f"the sweep read {key}"
            return super().__getitem__(key)

    scale, sweep = suite.choose_scale(plan, suite.so.OBJECTIVES["CE"], NoTest(features))
    assert [r["scale"] for r in sweep] == [5.0, 40.0]
    assert scale == max(sweep, key=lambda r: r["score"])["scale"]
    assert all(r["score"] == r["pr_auc"] + r["t2i_r1"] for r in sweep)
    assert suite.choose_scale(plan, suite.so.OBJECTIVES["SigLIP"], features) == (suite.so.SCALE, [])  # learned


def test_paired_by_draw_takes_the_draw_as_the_unit():

    def doc(name, draw, seed, v):
        return {"run_name": name, "config": {"train": {"seed": seed, "feature_draw": draw}}, "summary": {"k": v}}

    # CE - SS: +1 on every seed of draw 0, +3 on draw 1, +2 on draw 2 -> per-draw means 1, 3, 2
    ss = [doc("SS", d, s, 0.0) for d in range(3) for s in range(3)]
    ce = [doc("CE", d, s, [1.0, 3.0, 2.0][d] + 0.1 * (s - 1)) for d in range(3) for s in range(3)]
    out = report.paired_by_draw(ce, ss, "k")
    assert out["by"] == "feature draw" and out["units"] == 3
    assert out["draw_diffs"] == pytest.approx({0: 1.0, 1: 3.0, 2: 2.0})
    assert out["diff"] == pytest.approx(2.0) and out["sd"] == pytest.approx(1.0)
    assert out["seed_sd"] == pytest.approx(0.1)
    one = report.paired_by_draw(ce[:3], ss[:3], "k")
    assert one["by"] == "seed" and one["units"] == 3 and one["diff"] == pytest.approx(1.0)

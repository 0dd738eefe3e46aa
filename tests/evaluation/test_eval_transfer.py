"""Threshold transfer (calibrated on one split, measured on another) and per-query thresholds against brute force;
the reliability plot; the new figures in evaluate JSONs, the report (incl. the paired CE − SS difference) and the
callback."""

import json
import math
import os
import re

import numpy as np
import pytest
import tf_keras
from _eval_standins import TwoTowerStandIn, make_split, train_dataset
from PIL import Image

import ce_retrieval.data
import ce_retrieval.training
from ce_retrieval import cli
from ce_retrieval.evaluation import report
from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.callback import RetrievalEvaluationCallback
from ce_retrieval.evaluation.embed import embed_split
from ce_retrieval.evaluation.evaluate import dataset_fingerprint, evaluate_embeddings, evaluate_model
from ce_retrieval.evaluation.plots import plot_reliability
from ce_retrieval.evaluation.promise_check import check_promises
from ce_retrieval.evaluation.split_calibration import Calibration
from ce_retrieval.evaluation.transfer import (
    RELIABILITY_LEVELS,
    per_query_thresholds,
    reliability_curve,
    threshold_transfer,
)


def _case(rng, n, m, dim, num_ids, levels=None):
    """Embeddings on a 1/8 grid or small integers: dot products are exact, ties are real ties."""
    if levels is None:
        q = (np.round(rng.standard_normal((n, dim)) * 8) / 8).astype(np.float32)
        d = (np.round(rng.standard_normal((m, dim)) * 8) / 8).astype(np.float32)
    else:
        q = rng.integers(-levels, levels + 1, (n, dim)).astype(np.float32)
        d = rng.integers(-levels, levels + 1, (m, dim)).astype(np.float32)
    return q, d, rng.integers(0, num_ids, n), rng.integers(0, num_ids, m)


def _transfer_reference(thresholds, q, d, qi, di):
    """Every score materialised, counted directly; compared in float64 against the (float64) thresholds."""
    s = (q @ d.T).astype(np.float64)
    y = qi[:, None] == di[None, :]
    out = {}
    for key, t in thresholds.items():
        if t is None:
            out[f"{float(key):g}"] = None
            continue
        predicted = s >= t
        tp, n_pred = int((predicted & y).sum()), int(predicted.sum())
        out[f"{float(key):g}"] = (tp, n_pred, tp / n_pred if n_pred else None, tp / y.sum())
    return out


def _per_query_reference(q, d, qi, di):
    """A loop over queries: sort descending, try every cutoff at the end of a run of equal scores."""
    s = q @ d.T
    thresholds, f1s = np.full(len(q), np.nan), np.full(len(q), np.nan)
    for i in range(len(q)):
        y = di == qi[i]
        if not y.any():
            continue
        order = np.argsort(-s[i], kind="stable")
        scores, labels = s[i][order], y[order]
        best = -1.0
        for k in range(1, len(scores) + 1):
            if k < len(scores) and scores[k] == scores[k - 1]:
                continue  # inside a run of ties: not a threshold
            f1 = 2 * labels[:k].sum() / (k + y.sum())
            if f1 > best:  # strict: the first (highest) threshold wins ties in F1
                best, thresholds[i], f1s[i] = f1, scores[k - 1], f1
    return thresholds, f1s


# ----------------------------------------------------------------------------------------------------------------
# threshold_transfer


@pytest.mark.parametrize("levels", [None, 1, 2])
def test_transfer_matches_brute_force_with_ties_and_unreachable_levels(rng, levels):
    checked = 0
    for _ in range(10):
        n, m, dim = int(rng.integers(2, 30)), int(rng.integers(2, 30)), int(rng.integers(1, 5))
        q, d, qi, di = _case(rng, n, m, dim, num_ids=6, levels=levels)
        if not np.any(qi[:, None] == di[None, :]):
            continue
        scores = np.unique(q @ d.T)
        thresholds = {
            "0.3": float(rng.choice(scores)),  # exactly a score: ties at the threshold count as predicted
            0.5: float(rng.choice(scores)) + 1e-9,  # just above a score (not a float32): that score is excluded
            "0.8": float(scores.min()) - 1.0,  # everything predicted
            0.9: None,  # unreachable on the calibration split
            "0.95": float(scores.max()) + 1.0,  # nothing predicted
        }
        ref = _transfer_reference(thresholds, q, d, qi, di)
        for block in (1, 3, n):
            out = threshold_transfer(thresholds, q, d, qi, di, block_size=block)
            assert list(out["levels"]) == ["0.3", "0.5", "0.8", "0.9", "0.95"]
            for key, expect in ref.items():
                got = out["levels"][key]
                if expect is None:
                    assert got is None
                    continue
                tp, n_pred, precision, recall = expect
                assert (got["num_true_positives"], got["num_predicted"]) == (tp, n_pred), (key, block)
                assert got["precision"] == precision and got["recall"] == pytest.approx(recall, rel=1e-15)
                if precision is None:
                    assert got["error"] is None and got["shortfall"] is None
                else:
                    assert got["error"] == pytest.approx(abs(precision - float(key)))
                    assert got["shortfall"] == pytest.approx(max(0.0, float(key) - precision))
            empty = sum(1 for e in ref.values() if e is not None and e[1] == 0)  # "0.95", and "0.5" above the top score
            assert out["num_levels"] == 5 and out["num_unreachable"] == 1 and out["num_empty"] == empty >= 1
            errors = [abs(e[2] - float(k)) for k, e in ref.items() if e is not None and e[2] is not None]
            assert out["mean_abs_error"] == pytest.approx(np.mean(errors))
            assert out["max_abs_error"] == pytest.approx(np.max(errors))
        checked += 1
    assert checked >= 5


def test_transfer_to_the_calibration_split_itself_gives_back_its_precision(rng):
    # Continuous scores: the thresholds are float32 scores, so s >= t must hold bit-exactly at the tie.
    q = rng.standard_normal((120, 12)).astype(np.float32)
    d = rng.standard_normal((90, 12)).astype(np.float32)
    qi, di = rng.integers(0, 100, 120), np.arange(90)
    q[qi < 90] += 0.7 * d[qi[qi < 90]]
    cal = global_pr_auc(q, d, qi, di, target_precisions=RELIABILITY_LEVELS)
    out = threshold_transfer(cal["threshold_at_precision"], q, d, qi, di)
    assert out["num_levels"] == len(RELIABILITY_LEVELS)
    for key, expect in cal["precision_thresholds"].items():
        got = out["levels"][key]
        if expect is None:
            assert got is None
        else:
            assert got["precision"] == expect["precision"] and got["recall"] == expect["recall"]
            assert got["precision"] >= got["promised"] and got["shortfall"] == 0.0
    # precision_thresholds entries are accepted as well
    assert threshold_transfer(cal["precision_thresholds"], q, d, qi, di)["levels"] == out["levels"]


def test_transfer_hand_made_precision_two_thirds():
    # query 0 scores d0..d3: .875 (relevant), .75, .25, .125; query 1: .25, .5 (relevant), .375, .0625
    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    d = np.array([[0.875, 0.25], [0.75, 0.5], [0.25, 0.375], [0.125, 0.0625]], np.float32)
    qi, di = np.array([0, 1]), np.array([0, 1, 2, 3])
    out = threshold_transfer({"0.9": 0.5, "0.5": 0.5, "0.99": 0.8, "0.8": 1.0, "0.6": None}, q, d, qi, di)
    # t = 0.5 predicts .875 (relevant), .75, .5 (relevant): precision 2/3, recall 1
    for key in ("0.9", "0.5"):
        e = out["levels"][key]
        assert e["precision"] == pytest.approx(2 / 3) and e["recall"] == 1.0 and e["num_predicted"] == 3
    assert out["levels"]["0.9"]["error"] == pytest.approx(0.9 - 2 / 3)
    assert out["levels"]["0.9"]["shortfall"] == pytest.approx(0.9 - 2 / 3)
    assert out["levels"]["0.5"]["error"] == pytest.approx(2 / 3 - 0.5) and out["levels"]["0.5"]["shortfall"] == 0.0
    assert out["levels"]["0.99"]["precision"] == 1.0 and out["levels"]["0.99"]["recall"] == 0.5
    assert out["levels"]["0.8"]["num_predicted"] == 0 and out["levels"]["0.8"]["precision"] is None
    assert out["levels"]["0.6"] is None
    assert out["mean_abs_error"] == pytest.approx(((0.9 - 2 / 3) + (2 / 3 - 0.5) + 0.01) / 3)
    assert out["max_abs_error"] == pytest.approx(0.9 - 2 / 3)
    assert (out["num_unreachable"], out["num_empty"], out["num_positives"], out["num_pairs"]) == (1, 1, 2, 8)
    assert reliability_curve(out) == {"promised": [0.5, 0.9, 0.99], "achieved": [pytest.approx(2 / 3)] * 2 + [1.0]}


def test_transfer_rejects_bad_inputs(rng):
    q, d = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    with pytest.raises(ValueError, match="no positive pairs"):
        threshold_transfer({"0.5": 0.1}, q, d, [0, 1, 2], [5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="not a number"):
        threshold_transfer({"high": 0.1}, q, d, [0, 1, 2], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"precision in \[0, 1\]"):
        threshold_transfer({1.5: 0.1}, q, d, [0, 1, 2], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="NaN"):
        threshold_transfer({0.5: float("nan")}, q, d, [0, 1, 2], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="given twice"):
        threshold_transfer({0.5: 0.1, "0.5": 0.2}, q, d, [0, 1, 2], [0, 1, 2, 3, 4])


# ----------------------------------------------------------------------------------------------------------------
# per_query_thresholds


@pytest.mark.parametrize("levels", [None, 1, 2])
def test_per_query_thresholds_match_a_loop_over_queries(rng, levels):
    checked = 0
    for _ in range(10):
        n, m, dim = int(rng.integers(2, 30)), int(rng.integers(2, 30)), int(rng.integers(1, 5))
        q, d, qi, di = _case(rng, n, m, dim, num_ids=8, levels=levels)  # some queries have no relevant document
        if not np.any(qi[:, None] == di[None, :]):
            continue
        ref_t, ref_f1 = _per_query_reference(q, d, qi, di)
        s = q @ d.T
        y = qi[:, None] == di[None, :]
        for block in (1, 4, n):
            out = per_query_thresholds(q, d, qi, di, block_size=block, return_per_query=True)
            np.testing.assert_array_equal(out["per_query"]["threshold"], ref_t.astype(np.float32))
            np.testing.assert_allclose(out["per_query"]["f1"], ref_f1, rtol=1e-15)
        has = ~np.isnan(ref_t)
        p5, p25, p50, p75, p95 = np.percentile(ref_t[has], [5, 25, 50, 75, 95])
        t = out["thresholds"]
        assert (t["p5"], t["p25"], t["median"], t["p75"], t["p95"]) == pytest.approx((p5, p25, p50, p75, p95))
        assert t["std"] == pytest.approx(ref_t[has].std()) and t["mean"] == pytest.approx(ref_t[has].mean())
        assert out["spread"] == pytest.approx(p95 - p5)
        gap = s[y].mean() - (s[~y].mean() if (~y).any() else np.nan)
        if (~y).any() and gap > 0:
            assert out["relative_spread"] == pytest.approx((p95 - p5) / gap)
        else:
            assert out["relative_spread"] is None
        assert out["num_queries"] == int(has.sum()) and out["num_queries_without_relevant"] == int((~has).sum())
        assert out["mean_f1"] == pytest.approx(ref_f1[has].mean())
        checked += 1
    assert checked >= 5


def test_per_query_threshold_never_splits_a_run_of_ties():
    # One query, scores 5 (relevant), 5, 5, 5, 1 (relevant), 0: cutting after the first 5 would give F1 2/3,
    # but the four 5s are one threshold (F1 2/6); the best real threshold is 1 (F1 4/7).
    q = np.array([[1.0]], np.float32)
    d = np.array([[5.0], [5.0], [5.0], [5.0], [1.0], [0.0]], np.float32)
    out = per_query_thresholds(q, d, [7], [7, 1, 2, 3, 7, 4], return_per_query=True)
    assert out["per_query"]["threshold"][0] == 1.0 and out["per_query"]["f1"][0] == pytest.approx(4 / 7)


def test_integer_keys_keep_the_order_and_the_ties_of_float32_scores(rng):
    from ce_retrieval.evaluation.transfer import _ordered_keys

    x = np.array([-np.inf, -3e38, -2.5, -1e-40, -0.0, 0.0, 1e-45, 1e-40, 0.5, 3e38, np.inf], np.float32)
    x = np.concatenate([x, rng.standard_normal(500).astype(np.float32)])
    keys = _ordered_keys(x)
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(keys[order].astype(np.int64)) >= 0)
    # equal floats (-0.0 == 0.0 included) get equal keys, different floats different keys
    same = x[:, None] == x[None, :]
    np.testing.assert_array_equal(keys[:, None] == keys[None, :], same)


def test_relative_spread_compares_score_scales(rng):
    q, d, qi, di = _case(rng, 40, 30, 4, num_ids=30)
    a = per_query_thresholds(q, d, qi, di)
    b = per_query_thresholds(4 * q, d, qi, di)  # scores x4 (exact on this grid): same ranking, same relative spread
    assert b["spread"] == pytest.approx(4 * a["spread"])
    assert b["relative_spread"] == pytest.approx(a["relative_spread"])
    with pytest.raises(ValueError, match="no positive pairs"):
        per_query_thresholds(q, d, np.full(40, -1), di)


# ----------------------------------------------------------------------------------------------------------------
# reliability plot


def test_plot_reliability_writes_a_png(tmp_path):
    curves = {
        "CrossExampleSoftmax": {"promised": [0.5, 0.8, 0.9], "achieved": [0.52, 0.78, 0.86], "std": [0.01, 0.02, None]},
        "SampledSoftmax": {"promised": [0.5, 0.8, 0.9], "achieved": [0.4, None, 0.7]},
    }
    path = plot_reliability(curves, str(tmp_path / "sub" / "reliability.png"))
    assert path == str(tmp_path / "sub" / "reliability.png") and os.path.getsize(path) > 5000
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 300 and img.size[1] > 300
    with pytest.raises(ValueError, match="no curves"):
        plot_reliability({}, str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="promised"):
        plot_reliability({"a": {"promised": [0.5], "achieved": [0.5, 0.6]}}, str(tmp_path / "x.png"))


# ----------------------------------------------------------------------------------------------------------------
# evaluate: JSON keys


_NEW_SUMMARY_KEYS = {
    "achieved_precision_0.5",
    "achieved_precision_0.8",
    "achieved_precision_0.9",
    "achieved_recall_0.5",
    "achieved_recall_0.8",
    "achieved_recall_0.9",
    "calibration_error_0.5",
    "calibration_error_0.8",
    "calibration_error_0.9",
    "mean_calibration_error",
    "threshold_spread",
    "relative_threshold_spread",
}


def test_evaluate_embeddings_adds_transfer_and_query_thresholds(rng):
    q, d, qi, di = _case(rng, 50, 40, 4, num_ids=40)
    from ce_retrieval.evaluation.evaluate import summary

    plain = evaluate_embeddings(q, d, qi, di)
    assert plain["transfer"] is None and plain["query_thresholds"] == per_query_thresholds(q, d, qi, di)
    s = summary(plain)
    assert _NEW_SUMMARY_KEYS <= set(s) and s["achieved_precision_0.9"] is None and s["mean_calibration_error"] is None
    assert s["threshold_spread"] == plain["query_thresholds"]["spread"]
    thresholds = {"0.5": 1.0, "0.8": 2.0, "0.9": None}
    metrics = evaluate_embeddings(q, d, qi, di, calibration_thresholds=thresholds)
    assert metrics["transfer"] == threshold_transfer(thresholds, q, d, qi, di)
    s = summary(metrics)
    assert s["achieved_precision_0.5"] == metrics["transfer"]["levels"]["0.5"]["precision"]
    assert s["achieved_recall_0.8"] == metrics["transfer"]["levels"]["0.8"]["recall"]
    assert s["calibration_error_0.8"] == metrics["transfer"]["levels"]["0.8"]["error"]
    assert s["achieved_precision_0.9"] is None and s["mean_calibration_error"] == metrics["transfer"]["mean_abs_error"]
    assert s["relative_threshold_spread"] == metrics["query_thresholds"]["relative_spread"]


@pytest.fixture
def towers():
    model = TwoTowerStandIn()
    split = make_split(num_images=16, captions_per_image=2, seed=1, name="synthetic/test")
    model(next(iter(train_dataset(split))))  # build
    return model, split


def test_evaluate_model_calibrates_on_another_split(towers, tmp_path):
    model, split = towers
    val = make_split(num_images=16, captions_per_image=2, seed=3, name="synthetic/val")
    result = evaluate_model(
        model.text_encoder,
        model.image_encoder,
        split,
        output_dir=str(tmp_path),
        run_name="standin",
        batch_size=8,
        calibration_split=val,
    )
    doc = json.loads((tmp_path / "eval_test.json").read_text())
    source = doc["calibration_split"]
    assert source["name"] == "synthetic/val" and source["dataset_fingerprint"] == dataset_fingerprint(val)
    assert source["same_as_evaluated"] is False and set(source["threshold_at_precision"]) == {
        f"{c:g}" for c in RELIABILITY_LEVELS
    }
    q, d, qi, di = embed_split(model.text_encoder, model.image_encoder, split, batch_size=8)
    vq, vd, vqi, vdi = embed_split(model.text_encoder, model.image_encoder, val, batch_size=8)
    expected = global_pr_auc(vq, vd, vqi, vdi, target_precisions=RELIABILITY_LEVELS)["threshold_at_precision"]
    assert source["threshold_at_precision"] == expected
    assert doc["metrics"]["transfer"] == threshold_transfer(expected, q, d, qi, di)
    assert doc["metrics"]["transfer"]["num_levels"] == len(RELIABILITY_LEVELS)
    assert _NEW_SUMMARY_KEYS <= set(doc["summary"])
    assert doc["summary"]["mean_calibration_error"] == doc["metrics"]["transfer"]["mean_abs_error"]
    assert doc["summary"]["threshold_spread"] == per_query_thresholds(q, d, qi, di)["spread"]
    assert doc["metrics"]["query_thresholds"]["num_queries"] == 32
    assert "calibrate" in doc["seconds"]
    with Image.open(doc["files"]["reliability"]) as img:
        assert img.format == "PNG"
    assert os.path.basename(doc["files"]["reliability"]) == "reliability_test.png"
    assert result["summary"] == doc["summary"]
    # the same split's calibration with the guarantee: stored, and its promises checked on this gallery
    cal = Calibration.from_json(source["split_calibration"])
    assert doc["metrics"]["promises"] == json.loads(json.dumps(check_promises(cal, q, d, qi, di)))
    assert cal.rates.num_queries == len(vq) and cal.levels == (0.5, 0.8, 0.9) and cal.delta == 0.1
    for level in ("0.5", "0.8", "0.9"):
        entry = doc["metrics"]["promises"]["levels"][level]
        assert doc["summary"][f"guaranteed_recall_{level}"] == entry["recall"]
    with pytest.raises(ValueError, match="not both"):
        evaluate_model(model.text_encoder, model.image_encoder, split, calibration_split=val, calibration_thresholds={})


def test_evaluate_model_without_calibration_keeps_the_old_outputs(towers, tmp_path):
    model, split = towers
    result = evaluate_model(model.text_encoder, model.image_encoder, split, output_dir=str(tmp_path), batch_size=8)
    assert result["calibration_split"] is None and result["metrics"]["transfer"] is None
    assert "reliability" not in result["files"] and not (tmp_path / "reliability_test.png").exists()
    assert result["summary"]["achieved_precision_0.9"] is None and result["summary"]["threshold_spread"] is not None
    assert set(result["files"]) == {"pr_curve", "score_distribution", "retrieval_sheet", "json"}


def test_evaluate_command_calibration_split_option(towers, tmp_path, monkeypatch, capsys):
    model, _ = towers
    from ce_retrieval.configs.experiment import ExperimentConfig
    from ce_retrieval.data import DataConfig

    cfg = ExperimentConfig(data=DataConfig(name="synthetic", image_size=16))  # what load_trained returns
    loaded = []

    def load_retrieval_split(data_cfg, name):
        loaded.append(name)
        if name == "missing":
            raise ValueError("unknown split 'missing'")
        return make_split(num_images=16, captions_per_image=2, seed=len(loaded), name=f"synthetic/{name}")

    monkeypatch.setattr(ce_retrieval.training, "load_trained", lambda model_dir: (cfg, model), raising=False)
    monkeypatch.setattr(ce_retrieval.data, "load_retrieval_split", load_retrieval_split, raising=False)

    def evaluate(*extra):
        loaded.clear()
        out_dir = tmp_path / f"out{len(os.listdir(tmp_path))}"
        assert (
            cli.main(
                ["evaluate", "--model_dir", str(tmp_path / "m"), "--output_dir", str(out_dir), "--no_plots", *extra]
            )
            == 0
        )
        return json.loads(next(out_dir.glob("eval_*.json")).read_text()), capsys.readouterr()

    doc, out = evaluate("--split", "test")  # default: thresholds from val
    assert loaded == ["test", "val"] and doc["calibration_split"]["name"] == "synthetic/val"
    assert doc["summary"]["mean_calibration_error"] is not None and "calibrated on synthetic/val" in out.out
    doc, _ = evaluate("--split", "test", "--calibration_split", "none")
    assert loaded == ["test"] and doc["calibration_split"] is None and doc["metrics"]["transfer"] is None
    doc, _ = evaluate("--split", "val")  # evaluating val: nothing to calibrate on by default
    assert loaded == ["val"] and doc["calibration_split"] is None
    doc, _ = evaluate("--split", "val", "--calibration_split", "train")
    assert loaded == ["val", "train"] and doc["calibration_split"]["name"] == "synthetic/train"
    with pytest.raises(ValueError, match="unknown split"):  # asked for explicitly: an error
        evaluate("--split", "test", "--calibration_split", "missing")


# ----------------------------------------------------------------------------------------------------------------
# report


def _result(path, run_name, seed, pr_auc, r1, achieved=(0.55, 0.75, 0.85), cal_error=0.03, rel_spread=0.8):
    summary = {
        "pr_auc": pr_auc,
        "average_precision": pr_auc,
        "best_f1": 0.3,
        "rsum": 3.0,
        "t2i_r1": r1,
        "t2i_r5": 0.5,
        "t2i_r10": 0.6,
        "i2t_r1": 0.2,
        "i2t_r5": 0.5,
        "i2t_r10": 0.6,
        "achieved_precision_0.5": achieved[0],
        "achieved_precision_0.8": achieved[1],
        "achieved_precision_0.9": achieved[2],
        "mean_calibration_error": cal_error,
        "relative_threshold_spread": rel_spread,
    }
    levels = {
        f"{c:g}": None if a is None else {"promised": c, "precision": a}
        for c, a in zip((0.5, 0.8, 0.9), achieved, strict=True)
    }
    doc = {
        "run_name": run_name,
        "summary": summary,
        "split": "synthetic/test",
        "dataset_fingerprint": "abc",
        "num_distractors": 0,
        "calibration_split": {"name": "synthetic/val"},
        "config": {"train": {"seed": seed}} if seed is not None else {},
        "metrics": {"calibration": {"pr_auc": pr_auc}, "transfer": {"levels": levels}},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def _files(tmp_path, seeds_ce=(1, 2, 3), seeds_ss=(2, 1, 3)):
    ce = {1: (0.20, 0.30), 2: (0.22, 0.31), 3: (0.25, 0.29)}
    ss = {1: (0.14, 0.25), 2: (0.15, 0.26), 3: (0.18, 0.25)}
    files = [
        _result(
            tmp_path / f"ce{s}.json",
            "CrossExampleSoftmax",
            s,
            *ce[s],
            achieved=(0.5, 0.8 - 0.01 * s, 0.9),
            cal_error=0.01 * s,
            rel_spread=0.5 + 0.1 * s,
        )
        for s in seeds_ce
    ]
    files += [
        _result(
            tmp_path / f"ss{s}.json",
            "SampledSoftmax",
            s,
            *ss[s],
            achieved=(0.6, None, 0.7),
            cal_error=0.1,
            rel_spread=1.5,
        )
        for s in seeds_ss
    ]
    return files


def test_paired_difference_pairs_by_seed_and_tests(tmp_path):
    results = report.load_results(_files(tmp_path))
    d = report.paired_difference(results, "CrossExampleSoftmax", "SampledSoftmax", "pr_auc")
    # seeds 1, 2, 3: differences .06, .07, .07 (SampledSoftmax files come in the order 2, 1, 3)
    assert d["paired_by"] == "seed" and d["n"] == 3
    assert [p["seed"] for p in d["pairs"]] == [1, 2, 3]
    assert d["mean"] == pytest.approx(0.2 / 3) and d["std"] == pytest.approx(math.sqrt(0.0001 / 3))
    # t = mean / (std / sqrt 3) = 20 with 2 degrees of freedom: p = 1 - t / sqrt(2 + t^2)
    assert d["p_value"] == pytest.approx(1 - 20 / math.sqrt(402), rel=1e-6)
    r1 = report.paired_difference(results, "CrossExampleSoftmax", "SampledSoftmax", "t2i_r1")
    assert r1["mean"] == pytest.approx((0.05 + 0.05 + 0.04) / 3)
    # no seeds: paired by order (CE 1, 2, 3 with SS 2, 1, 3)
    for doc in results:
        doc["config"] = {}
    d = report.paired_difference(results, "CrossExampleSoftmax", "SampledSoftmax", "pr_auc")
    assert d["paired_by"] == "order" and d["mean"] == pytest.approx((0.05 + 0.08 + 0.07) / 3)
    with pytest.raises(ValueError, match="no run named"):
        report.paired_difference(results, "CrossExampleSoftmax", "Other", "pr_auc")


def test_runs_of_several_feature_draws_pair_by_draw_and_seed(tmp_path):
    """Seeds repeat across draws of frozen features: runs naming ``feature_draw`` pair by (draw, seed), never by
    the order the files came in, and ``format_markdown(..., paired=False)`` leaves the seed-unit lines out."""
    results = report.load_results(_files(tmp_path))
    for doc in results:
        doc["config"]["train"]["feature_draw"] = 0
    moved = [dict(d, config={"train": {"seed": d["config"]["train"]["seed"], "feature_draw": 1}}) for d in results]
    ss_draw1 = [d for d in moved if d["run_name"] == "SampledSoftmax"]
    for d in ss_draw1:
        d["summary"] = dict(d["summary"], pr_auc=d["summary"]["pr_auc"] - 0.5)
    both = results + moved
    d = report.paired_difference(both, "CrossExampleSoftmax", "SampledSoftmax", "pr_auc")
    assert d["paired_by"] == "seed" and d["n"] == 6
    assert sorted(tuple(p["seed"]) for p in d["pairs"]) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert d["mean"] == pytest.approx((0.2 / 3 + (0.2 / 3 + 0.5)) / 2)
    assert "CE − SS" in report.format_markdown(both) and "CE − SS" not in report.format_markdown(both, paired=False)


def test_paired_difference_drops_missing_seeds_and_values(tmp_path):
    results = report.load_results(_files(tmp_path, seeds_ce=(1, 2), seeds_ss=(2, 1, 3)))
    d = report.paired_difference(results, "CrossExampleSoftmax", "SampledSoftmax", "pr_auc")
    assert d["n"] == 2 and d["mean"] == pytest.approx(0.065) and d["p_value"] is not None
    d = report.paired_difference(results, "CrossExampleSoftmax", "SampledSoftmax", "achieved_precision_0.8")
    assert d["n"] == 0 and d["mean"] is None and d["std"] is None and d["p_value"] is None


def test_report_shows_calibration_columns_paired_lines_and_reliability(tmp_path, capsys):
    files = _files(tmp_path)
    md, png = tmp_path / "table.md", tmp_path / "reliability.png"
    assert cli.main(["report", *files, "--markdown", str(md), "--reliability", str(png)]) == 0
    out = capsys.readouterr().out
    assert "precision, val thresholds" in out and "@90%" in out and "cal.err" in out and "rel.spread" in out

    def cells(run):
        return re.split(r"\s{2,}", next(line for line in out.splitlines() if line.startswith(run)).strip())

    # @50% 50; @80% mean of 79/78/77; @90% 90; cal.err 1/2/3 points; relative spread .6/.7/.8 (a ratio, not %)
    assert cells("CrossExampleSoftmax")[-6:-1] == [
        "50.00 ± 0.00",
        "78.00 ± 1.00",
        "90.00 ± 0.00",
        "2.00 ± 1.00",
        "0.70 ± 0.10",
    ]
    assert cells("SampledSoftmax")[-6:-1] == ["60.00 ± 0.00", "-", "70.00 ± 0.00", "10.00 ± 0.00", "1.50 ± 0.00"]
    assert cells("CrossExampleSoftmax")[:3] == ["CrossExampleSoftmax", "3", "22.33 ± 2.52"]  # the old columns stay
    assert "CE − SS PR AUC: +6.67 ± 0.58 points (n = 3 paired by seed, paired t-test p = 0.00249)" in out
    assert "CE − SS R@1: +4.67 ± 0.58 points" in out
    text = md.read_text()
    assert "Prec. @90% (val thr.)" in text and "Rel. thr. spread" in text and "CE − SS PR AUC: +6.67" in text
    assert "| 78.00 ± 1.00 | 90.00 ± 0.00 | 2.00 ± 1.00 | 0.70 ± 0.10 |" in text
    with Image.open(png) as img:
        assert img.format == "PNG"


def test_report_without_the_two_runs_prints_no_paired_lines(tmp_path, capsys):
    files = [
        _result(tmp_path / "a.json", "A", 1, 0.2, 0.3),
        _result(tmp_path / "b.json", "SampledSoftmax", 1, 0.1, 0.2),
    ]
    assert cli.main(["report", *files]) == 0
    assert "CE − SS" not in capsys.readouterr().out
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"run_name": "A", "summary": {"pr_auc": 0.1}}))
    with pytest.raises(SystemExit, match="no calibration transfer"):
        cli.main(["report", str(bare), "--reliability", str(tmp_path / "r.png")])


# ----------------------------------------------------------------------------------------------------------------
# callback


def test_callback_logs_calibration_transfer_and_spread(towers):
    model, split = towers
    cal_split = make_split(num_images=16, captions_per_image=2, seed=3, name="cal")
    callback = RetrievalEvaluationCallback(split, calibration_split=cal_split, batch_size=8)
    callback.set_model(model)
    got = callback.evaluate()
    q, d, qi, di = embed_split(model.text_encoder, model.image_encoder, split, batch_size=8)
    cq, cd, cqi, cdi = embed_split(model.text_encoder, model.image_encoder, cal_split, batch_size=8)
    thresholds = global_pr_auc(cq, cd, cqi, cdi, target_precisions=RELIABILITY_LEVELS)["threshold_at_precision"]
    transfer = threshold_transfer(thresholds, q, d, qi, di)
    for c in ("0.5", "0.8", "0.9"):
        entry = transfer["levels"][c]
        expect = entry["precision"] if entry and entry["precision"] is not None else float("nan")
        assert got[f"achieved_precision_{c}"] == pytest.approx(expect, nan_ok=True)
    assert got["mean_calibration_error"] == pytest.approx(transfer["mean_abs_error"])
    spread = per_query_thresholds(q, d, qi, di)
    assert got["threshold_spread"] == pytest.approx(spread["spread"])
    assert got["relative_threshold_spread"] == pytest.approx(spread["relative_spread"] or float("nan"), nan_ok=True)

    model.compile(optimizer=tf_keras.optimizers.Adam(0.01))
    history = model.fit(
        train_dataset(split),
        epochs=1,
        verbose=0,
        callbacks=[RetrievalEvaluationCallback(split, calibration_split=cal_split)],
    )
    assert {
        "val_achieved_precision_0.5",
        "val_achieved_precision_0.8",
        "val_achieved_precision_0.9",
        "val_mean_calibration_error",
        "val_threshold_spread",
        "val_relative_threshold_spread",
    } <= set(history.history)


def test_callback_without_calibration_split_logs_spread_only(towers):
    model, split = towers
    callback = RetrievalEvaluationCallback(split)
    callback.set_model(model)
    got = callback.evaluate()
    assert "threshold_spread" in got and "relative_threshold_spread" in got
    assert not any(k.startswith("achieved_precision") for k in got) and "mean_calibration_error" not in got
    off = RetrievalEvaluationCallback(split, pr_auc=False, calibration_split=split)
    off.set_model(model)
    assert "threshold_spread" not in off.evaluate()

"""OPIS (operating-point inconsistency) against brute force: plain loops over queries, float64, on every constant
piece and on a fine threshold grid; hand-made values; the calibration range; the figure in evaluate JSONs, the
report and the callback."""

import json
import re

import numpy as np
import pytest
import tf_keras
from _eval_standins import TwoTowerStandIn, make_split, train_dataset

from ce_retrieval import cli
from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.callback import RetrievalEvaluationCallback
from ce_retrieval.evaluation.embed import embed_split
from ce_retrieval.evaluation.evaluate import evaluate_embeddings, evaluate_model, summary
from ce_retrieval.evaluation.opis import calibration_range, operating_point_inconsistency, opis
from ce_retrieval.evaluation.transfer import RELIABILITY_LEVELS


def _scores_as_embeddings(s):
    """Queries = rows of ``s``, documents = the identity: ``Q D^T == s`` exactly in float32."""
    s = np.asarray(s, np.float32)
    return s, np.eye(s.shape[1], dtype=np.float32)


def _utility_loop(row, rel, tau):
    """U_i(tau) for one query, by counting (the harmonic mean of TPR and TNR)."""
    tp = sum(1 for x, y in zip(row, rel, strict=True) if y and x >= tau)
    tn = sum(1 for x, y in zip(row, rel, strict=True) if not y and x < tau)
    tpr, tnr = tp / sum(rel), tn / (len(rel) - sum(rel))
    return 0.0 if tpr + tnr == 0 else 2 * tpr * tnr / (tpr + tnr)


def _variance_loop(s, rel, tau):
    values = [_utility_loop(row, y, tau) for row, y in zip(s, rel, strict=True) if 0 < sum(y) < len(y)]
    mean = sum(values) / len(values)
    return sum((u - mean) ** 2 for u in values) / len(values)


def _opis_pieces(s, rel, lo, hi):
    """Exact brute force: Var_i U_i at the midpoint of every constant piece between the distinct scores."""
    cuts = sorted({lo, hi} | {float(x) for x in np.ravel(s) if lo < x < hi})
    total = 0.0
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        total += (b - a) * _variance_loop(s, rel, (a + b) / 2)
    return total / (hi - lo)


def _opis_grid(s, rel, lo, hi, num=4001):
    """Brute force on a fine grid (midpoint rule): converges to the integral as the grid gets finer."""
    step = (hi - lo) / num
    return sum(_variance_loop(s, rel, lo + (k + 0.5) * step) for k in range(num)) / num


def _case(rng, n, m, num_ids, levels=None):
    if levels is None:
        s = np.round(rng.standard_normal((n, m)) * 64) / 64
    else:
        s = rng.integers(-levels, levels + 1, (n, m)).astype(np.float64)
    return s.astype(np.float32), rng.integers(0, num_ids, n), rng.integers(0, num_ids, m)


@pytest.mark.parametrize("levels", [None, 2])
def test_opis_equals_brute_force_on_every_piece(rng, levels):
    checked = 0
    for _ in range(10):
        n, m = int(rng.integers(2, 12)), int(rng.integers(2, 12))
        s, qi, di = _case(rng, n, m, num_ids=4, levels=levels)
        rel = (qi[:, None] == di[None, :]).tolist()
        lo, hi = sorted(rng.choice(np.ravel(s).astype(np.float64), 2, replace=False).tolist())
        if lo == hi:
            continue
        lo -= float(rng.uniform(0, 0.1))  # ranges that end on a score and ranges that do not
        q, d = _scores_as_embeddings(s)
        out = opis(q, d, qi, di, (lo, hi), block_size=int(rng.integers(1, 5)))
        counted = sum(0 < sum(y) < len(y) for y in rel)
        assert out["num_queries"] == counted
        assert out["num_queries_without_relevant"] == sum(sum(y) == 0 for y in rel)
        assert out["num_queries_without_irrelevant"] == sum(sum(y) == len(y) for y in rel)
        if counted == 0:
            assert out["opis"] is None
            continue
        assert out["opis"] == pytest.approx(_opis_pieces(s.tolist(), rel, lo, hi), abs=1e-12)
        checked += 1
    assert checked >= 5


def test_opis_converges_to_a_fine_grid_brute_force(rng):
    s, qi, di = _case(rng, 6, 9, num_ids=3)
    rel = (qi[:, None] == di[None, :]).tolist()
    lo, hi = float(np.quantile(s, 0.2)), float(np.quantile(s, 0.95))
    q, d = _scores_as_embeddings(s)
    exact = opis(q, d, qi, di, (lo, hi))["opis"]
    assert exact > 0.01
    # The midpoint rule misplaces at most half a grid step per breakpoint, each worth at most Var <= 1/4.
    breakpoints = int(((s > lo) & (s < hi)).sum())
    assert exact == pytest.approx(_opis_grid(s.tolist(), rel, lo, hi), abs=breakpoints * 0.25 / 4001)


def test_identical_score_distributions_give_zero():
    # Three queries, each with the same scores for its relevant and its irrelevant documents (in other columns).
    s = np.array([[0.9, 0.1, 0.5, 0.3], [0.1, 0.9, 0.3, 0.5], [0.3, 0.5, 0.9, 0.1]], np.float32)
    q, d = _scores_as_embeddings(s)
    out = opis(q, d, np.array([0, 1, 2]), np.array([0, 1, 2, 3]), (-1.0, 2.0))
    assert out["num_queries"] == 3 and out["opis"] == pytest.approx(0.0, abs=1e-15)
    assert out["mean_utility"] > 0
    # A different curve for one query makes it positive.
    s[2] = [0.3, 0.5, 0.2, 0.1]
    assert opis(*_scores_as_embeddings(s), np.array([0, 1, 2]), np.array([0, 1, 2, 3]), (-1.0, 2.0))["opis"] > 0


def test_hand_made_value_and_queries_without_relevant_documents_are_left_out():
    # Query A (id 0): relevant doc 0 at .75, irrelevant doc 1 at .25 -> U = 1 on (.25, .75), else 0.
    # Query B (id 1): irrelevant doc 0 at .75, relevant doc 1 at .25 -> U = 0 everywhere.
    # Var = 1/4 on (.25, .75), 0 elsewhere: OPIS over [0, 1] = (1/4 * 1/2) / 1 = 1/8; mean utility = 1/4.
    s = np.array([[0.75, 0.25], [0.75, 0.25], [0.5, 0.6]], np.float32)
    q, d = _scores_as_embeddings(s)
    out = opis(q[:2], d, np.array([0, 1]), np.array([0, 1]), (0.0, 1.0))
    assert out["opis"] == pytest.approx(1 / 8, abs=1e-15) and out["mean_utility"] == pytest.approx(1 / 4)
    assert out["num_breakpoints"] == 4
    # A third query without a relevant document changes nothing; it is counted as left out.
    out = opis(q, d, np.array([0, 1, 99]), np.array([0, 1]), (0.0, 1.0))
    assert out["opis"] == pytest.approx(1 / 8, abs=1e-15) and out["num_queries"] == 2
    assert out["num_queries_without_relevant"] == 1
    # Nor does one whose every document is relevant (no TNR): docs 0 and 1 both get id 0 here.
    out = opis(q, d, np.array([0, 5, 0]), np.array([0, 0]), (0.0, 1.0))
    assert out["num_queries"] == 0 and out["num_queries_without_irrelevant"] == 2 and out["opis"] is None
    # Half the range: (.5, 1) holds (.5, .75) of Var 1/4 -> OPIS 1/8 as well; (.75, 1) -> 0.
    assert opis(q[:2], d, [0, 1], [0, 1], (0.5, 1.0))["opis"] == pytest.approx(1 / 8)
    assert opis(q[:2], d, [0, 1], [0, 1], (0.75, 1.0))["opis"] == pytest.approx(0.0, abs=1e-15)


def test_opis_does_not_depend_on_the_block_size_or_the_score_scale(rng):
    s, qi, di = _case(rng, 40, 30, num_ids=10)
    q, d = _scores_as_embeddings(s)
    ref = opis(q, d, qi, di, (-0.5, 1.5))
    for block in (1, 3, 7, 40):
        assert opis(q, d, qi, di, (-0.5, 1.5), block_size=block)["opis"] == pytest.approx(ref["opis"], abs=1e-14)
    # Scores x4 with the range x4: the same utilities on a stretched axis, so the same average.
    assert opis(4 * q, d, qi, di, (-2.0, 6.0))["opis"] == pytest.approx(ref["opis"], abs=1e-14)


def test_calibration_range_spans_the_reached_levels(rng):
    assert calibration_range({"0.5": 0.2, "0.9": 0.7, "0.95": None}) == {
        "threshold_min": 0.2,
        "threshold_max": 0.7,
        "level_min": 0.5,
        "level_max": 0.9,
    }
    assert calibration_range({"0.5": {"threshold": 0.3}, "0.8": {"threshold": 0.4}})["threshold_max"] == 0.4
    assert calibration_range({"0.5": 0.2, "0.9": 0.2}) is None and calibration_range({"0.5": None}) is None
    # Both directions over this split's own range for RELIABILITY_LEVELS; image queries by transposing.
    s, qi, di = _case(rng, 30, 20, num_ids=8)
    q, d = _scores_as_embeddings(s)
    thresholds = global_pr_auc(q, d, qi, di, target_precisions=RELIABILITY_LEVELS)["threshold_at_precision"]
    both = operating_point_inconsistency(q, d, qi, di, thresholds)
    span = calibration_range(thresholds)
    assert both["range"] == span and both["t2i"] == opis(q, d, qi, di, span)
    lo, hi = span["threshold_min"], span["threshold_max"]
    rel_t = (di[:, None] == qi[None, :]).tolist()
    assert both["i2t"]["opis"] == pytest.approx(_opis_pieces(s.T.tolist(), rel_t, lo, hi), abs=1e-12)
    assert operating_point_inconsistency(q, d, qi, di, {"0.5": None}) == {"range": None, "t2i": None, "i2t": None}


def test_opis_rejects_bad_ranges(rng):
    q, d = _scores_as_embeddings(np.ones((2, 2)))
    for bad in [(1.0, 1.0), (2.0, 1.0), (0.0, float("inf")), "ab", None]:
        with pytest.raises(ValueError, match="threshold_range"):
            opis(q, d, [0, 1], [0, 1], bad)


# ----------------------------------------------------------------------------------------------------------------
# evaluate, report, callback


def _expected(q, d, qi, di):
    thresholds = global_pr_auc(q, d, qi, di, target_precisions=RELIABILITY_LEVELS)["threshold_at_precision"]
    return operating_point_inconsistency(q, d, qi, di, thresholds)


def test_evaluate_embeddings_reports_opis_both_ways(rng):
    s, qi, di = _case(rng, 40, 30, num_ids=25)
    q, d = _scores_as_embeddings(s)
    metrics = evaluate_embeddings(q, d, qi, di)
    expected = _expected(q, d, qi, di)
    assert metrics["opis"] == expected and expected["t2i"]["opis"] > 0 and expected["i2t"]["opis"] > 0
    assert set(metrics["calibration"]["threshold_at_precision"]) == {f"{c:g}" for c in RELIABILITY_LEVELS}
    s = summary(metrics)
    assert s["opis"] == expected["t2i"]["opis"] and s["i2t_opis"] == expected["i2t"]["opis"]


@pytest.fixture
def towers():
    model = TwoTowerStandIn()
    split = make_split(num_images=16, captions_per_image=2, seed=1, name="synthetic/test")
    model(next(iter(train_dataset(split))))  # build
    return model, split


def test_evaluate_model_json_holds_opis(towers, tmp_path):
    model, split = towers
    evaluate_model(model.text_encoder, model.image_encoder, split, output_dir=str(tmp_path), batch_size=8, plots=False)
    doc = json.loads((tmp_path / "eval_test.json").read_text())
    q, d, qi, di = embed_split(model.text_encoder, model.image_encoder, split, batch_size=8)
    expected = _expected(q, d, qi, di)
    assert doc["metrics"]["opis"]["range"] == expected["range"]
    assert doc["metrics"]["opis"]["t2i"]["num_queries"] == 32 and doc["metrics"]["opis"]["i2t"]["num_queries"] == 16
    assert doc["summary"]["opis"] == pytest.approx(expected["t2i"]["opis"])
    assert doc["summary"]["i2t_opis"] == pytest.approx(expected["i2t"]["opis"])


def test_report_shows_the_opis_column(tmp_path, capsys):
    files = []
    for k, (run, value) in enumerate([("A", 0.012), ("A", 0.014), ("B", None)]):
        path = tmp_path / f"r{k}.json"
        path.write_text(json.dumps({"run_name": run, "summary": {"pr_auc": 0.2, "opis": value}}))
        files.append(str(path))
    md = tmp_path / "t.md"
    assert cli.main(["report", *files, "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("Run"))
    assert re.split(r"\s{2,}", header.strip())[-2:] == ["rel.spread", "OPIS"]
    row = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line[:2] in ("A ", "B ")}
    assert row["A"][-1] == "13.00 ± 1.41" and row["B"][-1] == "-"  # x 10^3, mean ± sample std over the seeds
    assert "OPIS:" in out and "lower = more threshold-consistent" in out
    text = md.read_text()
    assert "| Rel. thr. spread | OPIS (×10⁻³) |" in text and "| 13.00 ± 1.41 |" in text


def test_callback_logs_opis(towers):
    model, split = towers
    callback = RetrievalEvaluationCallback(split, batch_size=8)
    callback.set_model(model)
    got = callback.evaluate()
    q, d, qi, di = embed_split(model.text_encoder, model.image_encoder, split, batch_size=8)
    expected = _expected(q, d, qi, di)
    assert expected["range"] is not None and got["opis"] > 0 and got["i2t_opis"] > 0
    assert got["opis"] == pytest.approx(expected["t2i"]["opis"])
    assert got["i2t_opis"] == pytest.approx(expected["i2t"]["opis"])
    model.compile(optimizer=tf_keras.optimizers.Adam(0.01))
    history = model.fit(train_dataset(split), epochs=1, verbose=0, callbacks=[RetrievalEvaluationCallback(split)])
    assert {"val_opis", "val_i2t_opis"} <= set(history.history)
    off = RetrievalEvaluationCallback(split, pr_auc=False)
    off.set_model(model)
    assert "opis" not in off.evaluate()

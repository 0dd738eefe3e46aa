"""check_promises: the guaranteed and estimated thresholds of a calibration, derived for the evaluated gallery's size,
counted on another split."""

import numpy as np
from test_guarantee import _embeddings

from ce_retrieval.evaluation.promise_check import check_promises, promise_summary
from ce_retrieval.evaluation.split_calibration import calibrate_split


def _split(seed):
    return _embeddings(seed, images=150, captions=3, noise=0.7)


def test_promises_counted_exactly_on_the_evaluated_gallery():
    val, test = _split(0), _split(1)
    cal = calibrate_split(*val, levels=(0.5, 0.8, 0.9, 0.999))
    check = check_promises(cal, *test)
    q, d, qi, di = test
    s = q @ d.T
    rel = qi[:, None] == di[None, :]
    block = cal.for_gallery(len(d))
    for key, entry in check["levels"].items():
        tau = block["guaranteed"]["threshold_at_precision"][key]
        level = block["guaranteed"]["levels"][key]
        if tau is None:
            assert entry["refused"] and entry["recall"] == 0.0 and entry["kept"] is None
            # the best it can certify, below the level, and the figure the refusal states
            assert entry["best_certified"] == level["best_precision_lower_bound"] < float(key)
            assert f"the highest certified precision is {entry['best_certified']:.3f}" in entry["refused"]
            continue
        assert entry["best_certified"] == level["precision_lower_bound"] >= float(key)
        hit = s >= np.float32(tau)
        assert entry["guaranteed"]["num_true_positives"] == np.sum(hit & rel)
        assert entry["recall"] == np.sum(hit & rel) / rel.sum()
        assert entry["kept"] == (np.sum(hit & rel) / hit.sum() >= float(key))
        assert entry["recall"] <= entry["estimate_recall"]  # the guarantee costs recall, never adds any
    assert check["levels"]["0.999"]["refused"]
    flat = promise_summary(check, (0.5, 0.999))
    assert flat["guarantee_refused_0.999"] and flat["guaranteed_recall_0.999"] == 0.0
    assert flat["guaranteed_recall_0.5"] == check["levels"]["0.5"]["recall"]
    assert promise_summary(None)["guaranteed_recall_0.9"] is None


def test_distractors_raise_the_thresholds():
    val, test = _split(0), _split(1)
    cal = calibrate_split(*val)
    q, d, qi, di = test
    rng = np.random.default_rng(5)
    extra = rng.normal(size=(10 * len(d), d.shape[1])).astype(np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    big = check_promises(cal, q, np.concatenate([d, extra]), qi, np.concatenate([di, -1 - np.arange(len(extra))]))
    small = check_promises(cal, *test)
    assert big["gallery_size"] == 11 * len(d)
    for key, entry in big["levels"].items():
        g, g_small = entry["guaranteed"], small["levels"][key]["guaranteed"]
        assert g is None or g_small is None or g["threshold"] >= g_small["threshold"]

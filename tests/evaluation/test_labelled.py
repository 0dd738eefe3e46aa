"""Class-labelled metrics: a hand-computed case, a plain-loop reference, pytorch-metric-learning, chunking."""

import numpy as np
import pytest

from ce_retrieval.evaluation.labelled import labelled_retrieval_metrics


def _angles(deg):
    rad = np.deg2rad(np.asarray(deg, np.float64))
    return np.stack([np.cos(rad), np.sin(rad)], 1)


def test_hand_computed_case():
    # 0° and 90° share class 0, 30° is alone in class 1: each class-0 query ranks the class-1 point first.
    m = labelled_retrieval_metrics(_angles([0, 90, 30]), [0, 0, 1], ks=(1, 2), compute_nmi=False)
    assert m["num_queries"] == 2  # the lone class-1 query has nothing to retrieve
    assert m["recall@1"] == 0.0 and m["recall@2"] == 1.0 and m["precision@1"] == 0.0 and m["map@r"] == 0.0
    assert m["pi_intra"] == pytest.approx(np.sqrt(2))
    mu0, mu1 = np.array([0.5, 0.5]), _angles([30])[0]
    assert m["pi_inter"] == pytest.approx(np.linalg.norm(mu0 - mu1))
    assert m["pi_ratio"] == pytest.approx(np.sqrt(2) / np.linalg.norm(mu0 - mu1))


def test_map_at_r_hand_case():
    # query 0° (class 0, R = 3): ranking 10°(+), 20°(-), 30°(+), 40°(-), 50°(+) -> AP@R = (1 + 2/3) / 3.
    x = _angles([0, 10, 20, 30, 40, 50])
    labels = np.array([0, 0, 1, 0, 1, 0])
    ref = _reference(x, labels, ks=(1,))
    assert ref["ap"][0] == pytest.approx(5 / 9)
    assert labelled_retrieval_metrics(x, labels, ks=(1,))["map@r"] == pytest.approx(np.mean(ref["ap"]))


def _reference(x, labels, ks):
    """Plain per-query loops: full sort, leave-one-out."""
    scores = x @ x.T
    out = {"ap": [], **{k: [] for k in ks}}
    for q in range(len(x)):
        others = np.array([j for j in range(len(x)) if j != q])
        ranked = others[np.argsort(-scores[q, others], kind="stable")]
        rel = labels[ranked] == labels[q]
        r = int(rel.sum())
        if r == 0:
            continue
        out["ap"].append(sum(rel[: i + 1].sum() / (i + 1) for i in range(r) if rel[i]) / r)
        for k in ks:
            out[k].append(float(rel[:k].any()))
    return out


def test_matches_plain_reference_and_is_chunk_invariant(rng):
    y = rng.integers(0, 7, 90)
    y[-1] = 99  # a lone query
    x = rng.normal(size=(8, 5))[y % 8] + 0.8 * rng.normal(size=(90, 5))
    ref = _reference(x, y, ks=(1, 2, 4, 8))
    full = labelled_retrieval_metrics(x, y, chunk_size=1000)
    chunked = labelled_retrieval_metrics(x, y, chunk_size=7)
    assert full == pytest.approx(chunked, rel=1e-6)
    assert full["num_queries"] == 89
    assert full["map@r"] == pytest.approx(np.mean(ref["ap"]), rel=1e-5)
    for k in (1, 2, 4, 8):
        assert full[f"recall@{k}"] == pytest.approx(np.mean(ref[k]))
    # pi_intra: mean Euclidean distance over ordered same-class pairs
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    same = (y[:, None] == y[None]) & ~np.eye(len(y), dtype=bool)
    assert full["pi_intra"] == pytest.approx(d[same].mean(), rel=1e-5)


def test_matches_pytorch_metric_learning(rng):
    import torch  # pinned (requirements-dev.txt); tests/conftest.py fails the run when it is missing
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator  # uses faiss, also pinned

    y = rng.integers(0, 10, 300)
    x = rng.normal(size=(10, 16))[y] + rng.normal(size=(300, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # pml ranks by L2 distance: equal to dot order on the sphere
    ours = labelled_retrieval_metrics(x, y, compute_nmi=False)
    pml = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"), k="max_bin_count"
    ).get_accuracy(torch.tensor(x, dtype=torch.float32), torch.tensor(y), ref_includes_query=True)
    assert ours["precision@1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-5)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-5)


def test_nmi_and_pi_ratio_reflect_cluster_quality(rng):
    y = np.repeat(np.arange(5), 20)
    centres = 10 * np.eye(5)
    tight = labelled_retrieval_metrics(centres[y] + 0.1 * rng.normal(size=(100, 5)), y)
    loose = labelled_retrieval_metrics(centres[y] + 6.0 * rng.normal(size=(100, 5)), y)
    assert tight["nmi"] == pytest.approx(1.0) and tight["recall@1"] == 1.0 and tight["map@r"] == pytest.approx(1.0)
    assert loose["nmi"] < 0.8 and tight["pi_ratio"] < 0.1 < loose["pi_ratio"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="embeddings"):
        labelled_retrieval_metrics(np.ones(3), [0, 1, 2])
    with pytest.raises(ValueError, match="NaN"):
        labelled_retrieval_metrics(np.array([[np.nan], [1.0]]), [0, 0])
    with pytest.raises(ValueError, match="ks"):
        labelled_retrieval_metrics(np.ones((3, 2)), [0, 0, 1], ks=(0,))


def test_callback_logs_metrics_during_fit(rng):
    import tf_keras

    from ce_retrieval.evaluation.labelled_callback import LabelledRetrievalCallback
    from ce_retrieval.losses import ProxyNCALoss
    from ce_retrieval.modeling.proxies import ProxySimilarity, proxy_relevance

    y = np.arange(60) % 4
    x = (rng.normal(size=(4, 6))[y] + 0.5 * rng.normal(size=(60, 6))).astype(np.float32)
    inputs = tf_keras.Input([6])
    emb = tf_keras.layers.Dense(3)(inputs)
    model = tf_keras.Model(inputs, ProxySimilarity(4)(emb))
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss=ProxyNCALoss())
    callback = LabelledRetrievalCallback(tf_keras.Model(inputs, emb), x, y, ks=(1,), every=2)
    history = model.fit(x, proxy_relevance(y, 4).numpy(), batch_size=20, epochs=4, verbose=0, callbacks=[callback])
    assert len(history.history["val_recall@1"]) == 2  # epochs 2 and 4 (History fills only logged epochs)
    expected = labelled_retrieval_metrics(
        tf_keras.Model(inputs, emb).predict(x, verbose=0), y, ks=(1,), compute_nmi=False
    )
    assert history.history["val_map@r"][-1] == pytest.approx(expected["map@r"])

"""Sharded gallery index: exact merge (NumPy reference, ties by id, short shards), top-k and threshold answers
against one search over the whole gallery, the manifest and its checks against every shard, atomic publishing
(an exception or a kill mid-build leaves no version), and the ``index --shards`` / ``--embeddings`` command."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
from export_fixtures import THRESHOLDS, captions, clustered_unit_vectors

from ce_retrieval.build import sharded as sharded_module
from ce_retrieval.build.index import BuildConfig
from ce_retrieval.build.sharded import ShardBuildError, build_sharded_index
from ce_retrieval.search import layout
from ce_retrieval.search.assignment import shard_name, shard_of, splitmix64
from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.gallery import GalleryIndex, IndexMismatchError, embeddings_digest, ids_digest
from ce_retrieval.search.merge import PAD_ID, merge_threshold, merge_topk
from ce_retrieval.search.sharded import ShardedIndex, load_index

VECTORS = clustered_unit_vectors(6200, 16, seed=3)
X, QUERIES = VECTORS[:6000], VECTORS[6000:]
IDS = np.random.default_rng(0).permutation(10**6)[:6000].astype(np.int64)


def _encoders_only(base_export, root) -> str:
    """A fresh export directory holding version 1's encoders of the session export and no index."""
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        shutil.copytree(os.path.join(base_export["dir"], part), os.path.join(root, part))
    return str(root)


def _index_listing(root) -> list[str]:
    return sorted(os.listdir(os.path.join(root, layout.INDEX)))


# Shards compute the same float32 dot products as one search over the whole gallery, but BLAS may round the last
# bit differently for a matrix of another shape. Items whose scores differ by that much may therefore swap places
# (or, at a threshold, fall on the other side of it); the answers are compared up to that rounding.
ROUNDING = 1e-6


def _true_scores(queries, x, ids, b, some_ids):
    """float64 q_b.x of the items ``some_ids``."""
    order = np.argsort(ids)
    rows = order[np.searchsorted(ids, some_ids, sorter=order)]
    assert np.array_equal(ids[rows], some_ids)
    return x[rows].astype(np.float64) @ queries[b].astype(np.float64)


def _assert_same_topk(got, want, queries, x, ids):
    """Same score sequence; a different id in a slot only where it truly scores that slot's score."""
    (got_ids, got_scores), (want_ids, want_scores) = got, want
    assert got_ids.shape == want_ids.shape
    np.testing.assert_allclose(got_scores, want_scores, rtol=0, atol=ROUNDING)
    for b in range(len(got_ids)):
        assert len(np.unique(got_ids[b])) == got_ids.shape[1]
        differ = got_ids[b] != want_ids[b]
        true = _true_scores(queries, x, ids, b, got_ids[b][differ])
        np.testing.assert_allclose(true, want_scores[b][differ], rtol=0, atol=ROUNDING)


def _assert_same_threshold_answer(got, want, queries, x, ids, tau):
    """Same set of ids except items scoring tau within rounding; scores descending, equal scores by id."""
    (got_ids, got_scores), (want_ids, _) = got, want
    assert len(got_ids) == len(want_ids) == len(queries)
    for b in range(len(queries)):
        only = np.setxor1d(got_ids[b], want_ids[b])
        assert np.all(np.abs(_true_scores(queries, x, ids, b, only) - tau) <= ROUNDING), only
        np.testing.assert_allclose(got_scores[b], _true_scores(queries, x, ids, b, got_ids[b]), rtol=0, atol=ROUNDING)
        assert np.all(np.diff(got_scores[b]) <= 0)
        ties = np.flatnonzero(np.diff(got_scores[b]) == 0)
        assert np.all(got_ids[b][ties] < got_ids[b][ties + 1])


# ------------------------------------------------------------------------------------------- pure functions
def _reference_topk(per_ids, per_scores, k):
    rows = []
    for b in range(per_ids[0].shape[0]):
        pairs = [
            (float(s), int(i))
            for ids, scores in zip(per_ids, per_scores, strict=True)
            for i, s in zip(ids[b], scores[b], strict=True)
            if np.isfinite(s)
        ]
        rows.append(sorted(pairs, key=lambda p: (-p[0], p[1]))[:k])
    return rows


def test_merge_topk_matches_a_numpy_reference_with_ties_short_shards_and_padding():
    rng = np.random.default_rng(7)
    for _ in range(200):
        batch, num_shards, k = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 9))
        pool = rng.permutation(np.arange(-20, 80))  # unique ids, negative ones included (distractors)
        per_ids, per_scores, used = [], [], 0
        for _ in range(num_shards):
            width = int(rng.integers(0, k + 1))  # a shard may hold fewer than k items, or none
            ids = pool[used : used + batch * width].reshape(batch, width)
            used += batch * width
            scores = (rng.integers(0, 4, size=(batch, width)) / 4).astype(np.float32)  # many exact ties
            pad = rng.random((batch, width)) < 0.15
            scores[pad] = rng.choice([np.nan, -np.inf], size=int(pad.sum()))
            per_ids.append(ids)
            per_scores.append(scores)
        if sum(i.shape[1] for i in per_ids) == 0:
            continue
        got_ids, got_scores = merge_topk(per_ids, per_scores, k)
        want = _reference_topk(per_ids, per_scores, k)
        assert got_ids.shape[1] == min(k, max(len(r) for r in want))
        for b, row in enumerate(want):
            n = len(row)
            assert got_ids[b, :n].tolist() == [i for _, i in row]
            np.testing.assert_array_equal(got_scores[b, :n], np.array([s for s, _ in row], np.float32))
            assert np.all(got_ids[b, n:] == PAD_ID) and np.all(np.isneginf(got_scores[b, n:]))


def test_merge_topk_orders_ties_by_id_and_keeps_id_minus_one():
    ids, scores = merge_topk(
        [np.array([[5, 3]]), np.array([[2]]), np.array([[-1, 7, 8]]), np.zeros((1, 0), np.int64)],
        [np.array([[0.9, 0.5]]), np.array([[0.9]]), np.array([[0.5, 0.5, np.nan]]), np.zeros((1, 0))],
        4,
    )
    assert ids.tolist() == [[2, 5, -1, 3]]  # -1 is a real id here: padding is told by its score only
    np.testing.assert_allclose(scores, [[0.9, 0.9, 0.5, 0.5]])
    with pytest.raises(ValueError, match="k must be >= 1"):
        merge_topk([np.zeros((1, 1))], [np.zeros((1, 1))], 0)
    with pytest.raises(ValueError, match="shard 1 answered 2 queries"):
        merge_topk([np.zeros((1, 1)), np.zeros((2, 1))], [np.zeros((1, 1)), np.zeros((2, 1))], 1)


def test_merge_threshold_is_the_sorted_union():
    rng = np.random.default_rng(3)
    per_ids, per_scores = [], []
    for s in range(3):
        sizes = [0, 5, 2]
        per_ids.append([np.arange(100 * s, 100 * s + m) for m in sizes])
        per_scores.append([np.round(rng.random(m), 1).astype(np.float32) for m in sizes])
    per_scores[1][1][0] = np.nan  # padding is dropped
    ids, scores = merge_threshold(per_ids, per_scores)
    limited, _ = merge_threshold(per_ids, per_scores, limit=3)
    for b in range(3):
        pairs = sorted(
            (float(v), int(i))
            for s in range(3)
            for i, v in zip(per_ids[s][b], per_scores[s][b], strict=True)
            if np.isfinite(v)
        )
        pairs.sort(key=lambda p: (-p[0], p[1]))
        assert ids[b].tolist() == [i for _, i in pairs] and limited[b].tolist() == [i for _, i in pairs][:3]
        np.testing.assert_array_equal(scores[b], np.array([v for v, _ in pairs], np.float32))
    with pytest.raises(ValueError, match="shard 1 answered"):
        merge_threshold([[np.arange(2)], []], [[np.ones(2)], []])


def test_shard_assignment_is_splitmix64_of_the_id():
    def reference(i):  # splitmix64 on Python integers
        z = (i + 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)

    assert int(splitmix64([0])[0]) == 0xE220A8397B1DCDAF  # the first output of SplitMix64 seeded with 0
    sample = [0, 1, 2, -1, -7, 2**62, -(2**63), *IDS[:50].tolist()]
    assert splitmix64(sample).tolist() == [reference(i % 2**64) for i in sample]
    shards = shard_of(IDS, 4)
    assert shards.tolist() == [reference(int(i) % 2**64) % 4 for i in IDS]
    assert shard_of(IDS[::-1], 4).tolist() == shards[::-1].tolist()  # a function of the id, not its position
    assert np.all(np.abs(np.bincount(shards) - 1500) < 150)  # spreads a gallery evenly
    assert np.all(shard_of(IDS, 1) == 0) and shard_name(3, 8) == "shard-00003-of-00008"


# --------------------------------------------------------------------------------------------- ScaNN shards
@pytest.fixture(scope="module", params=[3, 4], ids=["S3-process-pool", "S4-in-process"])
def scann_sharded(request, tmp_path_factory, base_export):
    num_shards = request.param
    root = _encoders_only(base_export, tmp_path_factory.mktemp(f"sharded{num_shards}"))
    manifest = build_sharded_index(
        X,
        IDS,
        root,
        1,
        num_shards=num_shards,
        workers=2 if num_shards == 3 else 1,  # the spawned process pool once; in-process otherwise (faster here)
        thresholds={0.9: 0.8},
        config=BuildConfig(brute_force_below=500),
    )
    index = load_index(os.path.join(root, "index", "1"))
    yield {"dir": root, "manifest": manifest, "index": index, "num_shards": num_shards}
    index.close()


def test_scann_shards_merge_exactly_and_reach_the_target_recall(scann_sharded):
    m, index, num_shards = scann_sharded["manifest"], scann_sharded["index"], scann_sharded["num_shards"]
    assert isinstance(index, ShardedIndex) and len(index) == 6000 and index.dim == 16
    assert m["format"] == "ce_retrieval.sharded_index/1" and m["num_shards"] == num_shards and m["num_items"] == 6000
    assert m["workers"] == (2 if num_shards == 3 else 1)
    assert m["thresholds"]["threshold_at_precision"] == {"0.9": 0.8} and "splitmix64" in m["shard_assignment"]
    assert m["ann"]["recall_at_10"] >= 0.95 and m["ann"]["meets_target"] and m["ann"]["num_queries"] == 1000
    assert [e["name"] for e in m["shards"]] == [shard_name(i, num_shards) for i in range(num_shards)]
    assert sorted(os.listdir(index.path)) == ["manifest.json", *(e["name"] for e in m["shards"])]  # no leftovers
    for i, (entry, shard) in enumerate(zip(m["shards"], index.shards, strict=True)):
        assert isinstance(shard, GalleryIndex) and shard.manifest["format"] == "ce_retrieval.index/1"
        assert entry["kind"] == shard.manifest["kind"] == "scann" and entry["recall_at_10"] >= 0.95
        assert entry["num_items"] == len(shard) and np.all(shard_of(shard.ids, num_shards) == i)
        assert entry["ids_sha256"] == ids_digest(shard.ids)
        assert entry["embeddings_sha256"] == embeddings_digest(shard.embeddings)
        assert shard.manifest["thresholds"] == m["thresholds"]  # one global threshold, valid on every shard
    assert sorted(np.concatenate([s.ids for s in index.shards]).tolist()) == sorted(IDS.tolist())

    got_ids, got_scores = index.topk(QUERIES, 10)
    answers = [shard.topk(QUERIES, 10) for shard in index.shards]
    want_ids, want_scores = merge_topk([a[0] for a in answers], [a[1] for a in answers], 10)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_scores, want_scores)
    exact_rows, exact_scores = exact_search(QUERIES, X, 10)
    recall = np.mean([len(np.intersect1d(a, IDS[b])) for a, b in zip(got_ids, exact_rows, strict=True)]) / 10
    assert recall >= 0.9, recall  # fresh held-out queries of the same distribution
    row_of = {int(i): r for r, i in enumerate(IDS)}
    rescored = np.array([[QUERIES[b] @ X[row_of[int(i)]] for i in row] for b, row in enumerate(got_ids)])
    np.testing.assert_allclose(got_scores, rescored, atol=1e-5)  # exact dot products, descending
    assert np.all(np.diff(got_scores, axis=1) <= 0)
    exact = index.topk(QUERIES, 10, exact=True)  # exact shards: one exact search over the union
    _assert_same_topk(exact, (IDS[exact_rows], exact_scores), QUERIES, X, IDS)
    big_ids, _ = index.topk(QUERIES[:2], 7000)  # k beyond every shard and the gallery: the whole gallery
    assert big_ids.shape == (2, 6000) and sorted(big_ids[0].tolist()) == sorted(IDS.tolist())


@pytest.mark.parametrize("tau", [0.0, 0.9])
def test_sharded_threshold_equals_the_single_index(scann_sharded, tau):
    single = GalleryIndex("single", {"params": {}}, X, IDS, None)  # exact brute force over the whole gallery
    want = single.threshold(QUERIES, tau)
    got = scann_sharded["index"].threshold(QUERIES, tau, exact=True)  # every shard exact: the union is exact
    _assert_same_threshold_answer(got, want, QUERIES, X, IDS, tau)
    # the default: each shard's own (approximate) search, merged exactly over what they return
    block = scann_sharded["manifest"]["threshold_search"]
    approx_ids, approx_scores = scann_sharded["index"].threshold(QUERIES, tau)
    found = sum(len(np.intersect1d(a, w)) for a, w in zip(approx_ids, want[0], strict=True))
    total = sum(len(w) for w in want[0])
    assert total == 0 or found / total >= block["shard_set_recall_min"] - 0.03, (found, total, block)
    assert all(set(a.tolist()) <= set(w.tolist()) for a, w in zip(approx_ids, want[0], strict=True))
    assert all(np.all(np.diff(s) <= 0) for s in approx_scores)
    # each query's answer merged over the shards: exact on request; otherwise exact only where every shard's was
    _, _, asked = scann_sharded["index"].answer_threshold(QUERIES, tau, exact=True)
    assert all(a.exact and a.set_recall == 1.0 for a in asked) and len(asked) == len(QUERIES)
    per_shard = [shard.answer_threshold(QUERIES, tau)[2] for shard in scann_sharded["index"].shards]
    _, _, merged = scann_sharded["index"].answer_threshold(QUERIES, tau)
    assert [a.exact for a in merged] == [all(s[b].exact for s in per_shard) for b in range(len(QUERIES))]


# --------------------------------------------------------------------------------------- brute-force shards
@pytest.fixture(scope="module")
def brute_sharded(tmp_path_factory, base_export):
    root = _encoders_only(base_export, tmp_path_factory.mktemp("brute"))
    # ids ascending with the rows, so the exact search's tie rule (lower row) is also "lower id"; 30 duplicates
    # of other rows under other ids make ties across shards
    x = np.concatenate([X[:2970], X[:30]])
    ids = np.arange(3000, dtype=np.int64) * 3 - 50
    manifest = build_sharded_index(x, ids, root, 1, num_shards=3, workers=1, thresholds=THRESHOLDS)
    return {"dir": root, "manifest": manifest, "x": x, "ids": ids}


def test_brute_force_shards_equal_one_exact_search(brute_sharded):
    m, x, ids = brute_sharded["manifest"], brute_sharded["x"], brute_sharded["ids"]
    assert {e["kind"] for e in m["shards"]} == {"brute_force"} and m["ann"]["recall_at_10"] == 1.0
    index = load_index(os.path.join(brute_sharded["dir"], "index", "1"))
    queries = np.concatenate([QUERIES[:50], x[:5]])  # the last five queries tie with duplicated rows
    for k in (1, 10, 1500, 5000):  # 1500 and 5000: more than a shard / the gallery holds
        rows, scores = exact_search(queries, x, k)
        _assert_same_topk(index.topk(queries, k), (ids[rows], scores), queries, x, ids)
    single = GalleryIndex("single", {"params": {}}, x, ids, None)
    for tau in (0.5, 0.95):
        got, want = index.threshold(queries, tau), single.threshold(queries, tau)
        _assert_same_threshold_answer(got, want, queries, x, ids, tau)
    index.close()


def test_tampered_or_mismatched_shards_are_refused_by_name(brute_sharded, tmp_path, base_export):
    def copy():
        dst = tmp_path / f"copy{len(os.listdir(tmp_path))}"
        shutil.copytree(os.path.join(brute_sharded["dir"], "index", "1"), dst)
        return str(dst)

    path = copy()  # a shard's ids changed after the manifests were written
    ids_file = os.path.join(path, "shard-00001-of-00003", "ids.npy")
    np.save(ids_file, np.load(ids_file)[::-1].copy())
    with pytest.raises(IndexMismatchError, match="shard shard-00001-of-00003.*checksum"):
        ShardedIndex.load(path)

    path = copy()  # a shard holding other ids than the top-level manifest says (a consistent, but foreign, shard)
    os.rename(os.path.join(path, "shard-00000-of-00003"), os.path.join(path, "tmp"))
    os.rename(os.path.join(path, "shard-00001-of-00003"), os.path.join(path, "shard-00000-of-00003"))
    os.rename(os.path.join(path, "tmp"), os.path.join(path, "shard-00001-of-00003"))
    with pytest.raises(IndexMismatchError, match="shard shard-00000-of-00003: holds"):
        load_index(path)

    path = copy()  # a count edited in the top-level manifest
    manifest = layout.read_json(os.path.join(path, "manifest.json"))
    manifest["shards"][2]["num_items"] += 1
    layout.write_json(os.path.join(path, "manifest.json"), manifest)
    with pytest.raises(IndexMismatchError, match="shard shard-00002-of-00003: holds .* items"):
        load_index(path)

    path = copy()  # embeddings changed in place: only the opt-in re-hash can see it
    emb_file = os.path.join(path, "shard-00002-of-00003", "embeddings.npy")
    emb = np.load(emb_file)
    np.save(emb_file, emb[:, ::-1].copy())
    ShardedIndex.load(path).close()
    with pytest.raises(IndexMismatchError, match="shard-00002-of-00003: embeddings"):
        ShardedIndex.load(path, verify_embeddings=True)

    path = copy()
    shutil.rmtree(os.path.join(path, "shard-00002-of-00003"))
    with pytest.raises(IndexMismatchError, match="shard shard-00002-of-00003 is missing"):
        load_index(path)

    meta = layout.export_metadata(base_export["dir"], layout.TEXT_ENCODER, 1)
    with pytest.raises(IndexMismatchError, match="fingerprint"):
        load_index(os.path.join(brute_sharded["dir"], "index", "1"), expected_model=dict(meta, fingerprint="0" * 64))
    with pytest.raises(IndexMismatchError, match="is a sharded index"):
        GalleryIndex.load(os.path.join(brute_sharded["dir"], "index", "1"))
    single = load_index(os.path.join(base_export["dir"], "index", "1"), expected_model=meta)
    assert isinstance(single, GalleryIndex) and len(single) == 300


def test_bad_shard_counts_are_refused(base_export, tmp_path):
    root = _encoders_only(base_export, tmp_path)
    x = X[:20]
    with pytest.raises(ValueError, match="between 1 and the gallery size 20, got 0"):
        build_sharded_index(x, IDS[:20], root, 1, num_shards=0)
    with pytest.raises(ValueError, match="between 1 and the gallery size 20, got 21"):
        build_sharded_index(x, IDS[:20], root, 1, num_shards=21)
    candidates = np.arange(10_000, dtype=np.int64)
    ids = candidates[shard_of(candidates, 3) != 1][:20]  # nothing for shard 1
    with pytest.raises(ValueError, match="shard-00001-of-00003 would be empty"):
        build_sharded_index(x, ids, root, 1, num_shards=3)
    with pytest.raises(ValueError, match="unique"):
        build_sharded_index(x, np.zeros(20), root, 1, num_shards=2)
    assert not os.path.exists(os.path.join(root, "index"))
    build_sharded_index(x, IDS[:20], root, 1, num_shards=2, workers=1)
    with pytest.raises(FileExistsError, match="overwrite"):
        build_sharded_index(x, IDS[:20], root, 1, num_shards=2, workers=1)


def test_every_shard_is_built_with_the_one_build_config(base_export, tmp_path, monkeypatch):
    """The sharded build takes the single build's BuildConfig and hands all of it to each shard (it once had no
    target_set_recall of its own)."""
    root = _encoders_only(base_export, tmp_path)
    real, seen = sharded_module.write_index_folder, []

    def spy(*a, config, **kw):
        seen.append(config)
        return real(*a, config=config, **kw)

    monkeypatch.setattr(sharded_module, "write_index_folder", spy)
    config = BuildConfig(target_recall=0.9, target_set_recall=0.97, threshold_partitions=False, seed=3)
    manifest = build_sharded_index(X[:300], IDS[:300], root, 1, num_shards=3, workers=1, config=config)
    assert seen == [config] * 3
    assert manifest["ann"]["target"] == 0.9 and manifest["brute_force_below"] == config.brute_force_below


# ---------------------------------------------------------------------------------------- atomic publishing
def test_a_failed_build_publishes_nothing(base_export, tmp_path, monkeypatch):
    root = _encoders_only(base_export, tmp_path)
    real = sharded_module.write_index_folder

    def fail_on_second_shard(x, ids, folder, *a, **kw):
        if os.path.basename(folder) == "shard-00001-of-00003":
            raise RuntimeError("disk full")
        return real(x, ids, folder, *a, **kw)

    monkeypatch.setattr(sharded_module, "write_index_folder", fail_on_second_shard)
    with pytest.raises(ShardBuildError, match="building shard-00001-of-00003 failed: RuntimeError: disk full"):
        build_sharded_index(X[:300], IDS[:300], root, 1, num_shards=3, workers=1)
    assert _index_listing(root) == []  # neither index/1 nor a temporary folder
    monkeypatch.undo()

    def fail_after_the_shards(*a, **kw):
        raise RuntimeError("global check failed")

    monkeypatch.setattr(sharded_module, "_global_ann", fail_after_the_shards)
    with pytest.raises(RuntimeError, match="global check failed"):
        build_sharded_index(X[:300], IDS[:300], root, 1, num_shards=3, workers=1)
    assert _index_listing(root) == []


KILLED_BUILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from ce_retrieval.build.index import BuildConfig
    from ce_retrieval.build.sharded import build_sharded_index

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    config = BuildConfig(brute_force_below=500)
    build_sharded_index(x, np.arange(40000), sys.argv[1], 7, num_shards=4, workers=1, config=config)
    """
)


def test_a_killed_build_leaves_no_version_and_the_next_build_cleans_up(base_export, tmp_path):
    root = _encoders_only(base_export, tmp_path / "export")
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):  # the build's export version: 7
        os.rename(os.path.join(root, part, "1"), os.path.join(root, part, "7"))
    script = tmp_path / "build.py"
    script.write_text(KILLED_BUILD)
    proc = subprocess.Popen([sys.executable, str(script), root], start_new_session=True)
    index_parent = os.path.join(root, "index")
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            names = os.listdir(index_parent) if os.path.isdir(index_parent) else []
            temps = [n for n in names if n.startswith(".tmp-7")]
            if temps and os.path.isdir(os.path.join(index_parent, temps[0], "shard-00000-of-00004")):
                break  # mid-build: the first shard is being written
            time.sleep(0.01)
        assert proc.poll() is None, "the build ended before it could be killed"
        assert "7" not in os.listdir(index_parent) and layout.servable_versions(root) == []  # invisible while built
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the build and anything it started: a crash, no clean-up runs
        proc.wait()
    leftovers = os.listdir(index_parent)
    assert "7" not in leftovers and len(leftovers) == 1 and leftovers[0].startswith(".tmp-7")
    build_sharded_index(X[:300], IDS[:300], root, 7, num_shards=2, workers=1)
    assert _index_listing(root) == ["7"] and layout.servable_versions(root) == [7]


# ----------------------------------------------------------------------------------------------------- CLI
def test_index_cli_with_shards_serves_the_single_index_answers(base_export, export_copy, tmp_path, capsys):
    from ce_retrieval import cli
    from ce_retrieval.build.export import load_signature
    from ce_retrieval.serve.searcher import Searcher

    folder = tmp_path / "gallery"
    folder.mkdir()
    for image_id, image in zip(base_export["ids"], base_export["gallery"], strict=True):
        (folder / f"{image_id}.png").write_bytes(image)
    report = tmp_path / "thresholds.json"
    report.write_text(json.dumps({"threshold_at_precision": THRESHOLDS}))
    argv = ["index", "--export_dir", export_copy, "--images", str(folder), "--thresholds_json", str(report)]
    assert cli.main([*argv, "--shards", "3", "--overwrite"]) == 0
    assert "index version 1: 300 items, 3 shards (brute_force)" in capsys.readouterr().out
    meta = layout.export_metadata(export_copy, layout.TEXT_ENCODER, 1)
    index = load_index(os.path.join(export_copy, "index", "1"), expected_model=meta)
    assert isinstance(index, ShardedIndex) and index.manifest["gallery"]["source"] == str(folder)
    assert index.manifest["workers"] == 1  # brute-force shards only: built in-process by default
    _, text_fn = load_signature(layout.version_dir(export_copy, layout.TEXT_ENCODER, 1))
    sharded = Searcher(export_copy, 1, text_fn, meta, index)
    single = Searcher.load(base_export["dir"])
    texts = captions(12, seed=4)
    for want, got in zip(single.search(texts, k=10), sharded.search(texts, k=10), strict=True):
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)
        assert got.precision_levels == want.precision_levels
    for want, got in zip(
        single.search(texts, precision=0.5, guarantee=False),
        sharded.search(texts, precision=0.5, guarantee=False),
        strict=True,
    ):
        assert sorted(got.ids.tolist()) == sorted(want.ids.tolist())
    index.close()


def test_index_cli_from_pipeline_embeddings(base_export, export_copy, monkeypatch, capsys):
    from ce_retrieval import cli

    single = GalleryIndex.load(os.path.join(base_export["dir"], "index", "1"))
    meta = layout.export_metadata(export_copy, layout.IMAGE_ENCODER, 1)
    recorded = {"fingerprint": meta["fingerprint"], "image_fingerprint": meta["image_fingerprint"]}
    calls = []

    def load_embedded_gallery(path, verify=True):  # stands in for ce_retrieval.build.pipeline's loader
        calls.append((path, verify))
        manifest = {"export": dict(recorded), "corrupt": {"count": 0, "items": []}}
        return np.array(single.embeddings), single.ids.copy(), manifest

    fake = types.ModuleType("ce_retrieval.build.pipeline")
    fake.load_embedded_gallery = load_embedded_gallery
    monkeypatch.setitem(sys.modules, "ce_retrieval.build.pipeline", fake)
    argv = ["index", "--export_dir", export_copy, "--embeddings", "/beam/out", "--overwrite"]
    assert cli.main([*argv, "--shards", "2", "--workers", "1"]) == 0
    assert "300 items, 2 shards" in capsys.readouterr().out and calls == [("/beam/out", True)]
    index = load_index(os.path.join(export_copy, "index", "1"))
    assert sorted(np.concatenate([s.ids for s in index.shards]).tolist()) == sorted(single.ids.tolist())
    assert index.manifest["gallery"]["source"] == "/beam/out"
    recorded["fingerprint"] = "f" * 64  # embedded by another model: refused
    with pytest.raises(SystemExit, match="embedded by model fingerprint ffffffffffff"):
        cli.main(argv)
    del recorded["fingerprint"]  # only the image tower's fingerprint recorded: that one must match
    assert cli.main(argv) == 0 and isinstance(load_index(os.path.join(export_copy, "index", "1")), GalleryIndex)
    recorded["image_fingerprint"] = "e" * 64
    with pytest.raises(SystemExit, match="embedded by model fingerprint eeeeeeeeeeee"):
        cli.main(argv)

"""``ce-retrieval calibrate`` end to end on a real export (the stand-in towers' export with its 300-image index):
labelled captions -> a new version whose thresholds are ``calibrate_split``'s on the same embeddings, served after
a reload; bad label files refused with the line; sharded and ScaNN indexes; a kill at every point of publishing
leaves every servable version whole, and the next run cleans up."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import httpx
import numpy as np
import pytest
from export_fixtures import GALLERY_SIZE, captions

from ce_retrieval import cli
from ce_retrieval.build.export import embed_with_keras
from ce_retrieval.build.index import BuildConfig
from ce_retrieval.build.sharded import build_sharded_index
from ce_retrieval.data.relevance_labels import RelevanceLabels, query_units, read_labels
from ce_retrieval.evaluation.split_calibration import calibrate_split
from ce_retrieval.search import layout
from ce_retrieval.search.gallery import GalleryIndex
from ce_retrieval.serve.recalibrate import calibrate_on_index, publish_recalibration, recalibrate_index
from ce_retrieval.serve.searcher import Searcher
from ce_retrieval.serve.service import create_app, serve_in_thread

LEVELS = "0.3,0.5,0.8"


def labelled(base_export, n, seed=0, extra_every=0):
    """``n`` captions, each relevant to the gallery image the stand-in model scores highest for it (so the labels
    certify something); with ``extra_every`` k, every k-th caption is also relevant to its second best."""
    texts = captions(n, seed=seed)
    scores = (
        embed_with_keras(base_export["text"], texts) @ embed_with_keras(base_export["image"], base_export["gallery"]).T
    )
    order = np.argsort(-scores, axis=1)
    ids = base_export["ids"]
    relevant = [[int(ids[row[0]])] for row in order]
    for i in range(0, n, extra_every) if extra_every else ():
        relevant[i].append(int(ids[order[i, 1]]))
    return texts, relevant


def write_jsonl(path, texts, relevant):
    path.write_text(
        "".join(json.dumps({"caption": t, "relevant": r}) + "\n" for t, r in zip(texts, relevant, strict=True))
    )
    return str(path)


def calibrate_cli(export_dir, labels, *extra):
    return cli.main(["calibrate", "--export_dir", export_dir, "--labels", labels, "--precision_levels", LEVELS, *extra])


def test_calibrate_publishes_what_calibrate_split_computes(export_copy, base_export, tmp_path, capsys):
    texts, relevant = labelled(base_export, 120, seed=3)
    labels = write_jsonl(tmp_path / "new_domain.jsonl", texts, relevant)
    assert calibrate_cli(export_copy, labels) == 0
    out = capsys.readouterr().out
    assert "recalibrated index version 1 on 120 labelled captions" in out and "published version 2" in out
    assert layout.servable_versions(export_copy) == [1, 2]

    # independently: the exported encoder's caption embeddings, the index's stored gallery, id equality
    queries = Searcher.load(export_copy, 1).embed(texts)
    old = GalleryIndex.load(os.path.join(export_copy, "index", "1"))
    want = calibrate_split(
        queries, old.embeddings, [r[0] for r in relevant], old.ids, levels=(0.3, 0.5, 0.8), delta=0.1
    ).for_gallery(GALLERY_SIZE)
    manifest = layout.read_json(os.path.join(export_copy, "index", "2", "manifest.json"))
    got = manifest["thresholds"]
    for block in ("guaranteed", "estimated"):
        assert got[block]["threshold_at_precision"] == want[block]["threshold_at_precision"]
    for level, entry in want["guaranteed"]["levels"].items():  # bounds: to rounding (the units are summed in
        for key, value in entry.items():  # another order: components, not sorted ids)
            assert got["guaranteed"]["levels"][level][key] == (
                value if isinstance(value, str | None) else pytest.approx(value)
            )
    assert got["probability"] == want["probability"]
    assert got["guaranteed"]["gallery_size"] == GALLERY_SIZE and got["guaranteed"]["threshold_at_precision"]["0.3"]

    provenance = manifest["recalibration"]
    assert provenance["from_version"] == 1 and provenance["num_labelled_queries"] == 120
    assert provenance["labels"]["file"] == "new_domain.jsonl" and len(provenance["labels"]["sha256"]) == 64
    assert provenance["date"] and provenance["previous_thresholds"]["estimated"] == {"0.5": 0.2, "0.8": 0.5, "0.9": 0.7}
    assert got["calibration"]["source"]["file"] == "new_domain.jsonl"
    # the new version is version 1's model and gallery: hard links, a new export_id shared by both encoders
    meta = layout.export_metadata(export_copy, layout.TEXT_ENCODER, 2)
    assert meta["derived_from"]["version"] == 1 and meta["fingerprint"] == old.manifest["model"]["fingerprint"]
    assert meta["export_id"] == layout.export_metadata(export_copy, layout.IMAGE_ENCODER, 2)["export_id"]
    assert meta["export_id"] == manifest["model"]["export_id"] != old.manifest["model"]["export_id"]
    for part, name in ((layout.TEXT_ENCODER, "saved_model.pb"), (layout.INDEX, "embeddings.npy")):
        assert os.path.samefile(f"{export_copy}/{part}/1/{name}", f"{export_copy}/{part}/2/{name}")
    assert layout.export_metadata(export_copy, layout.TEXT_ENCODER, 1)["version"] == 1  # version 1 untouched
    assert Searcher.load(export_copy).search(texts[:3], precision=0.3)[0].ids.size >= 0


def test_the_service_switches_to_the_recalibrated_version(export_copy, base_export, tmp_path):
    texts, relevant = labelled(base_export, 60, seed=4, extra_every=3)
    labels = read_labels(write_jsonl(tmp_path / "labels.jsonl", texts, relevant))
    app = create_app(export_copy, reload_interval_s=0)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/healthz").json()["version"] == 1
        r = c.post("/search", json={"texts": ["a dog"], "precision": 0.5})
        assert r.status_code == 422  # version 1 was built from bare thresholds: no guarantee to serve
        done = recalibrate_index(export_copy, labels, levels=(0.3, 0.5))
        assert done.manifest["recalibration"]["num_relevant_pairs"] == 60 + 20  # every third has two
        assert c.post("/admin/reload").json() == {"reloaded": True, "version": 2, "last_error": None}
        health = c.get("/healthz").json()
        assert health["version"] == 2 and health["confidence"] == 0.9
        taus = done.manifest["thresholds"]["guaranteed"]["threshold_at_precision"]
        body = c.post("/search", json={"texts": ["a dog"], "precision": 0.3}).json()
        assert body["guarantee"] and body["threshold"] == taus["0.3"]


def test_bad_label_files_are_refused_with_the_line(export_copy, base_export, tmp_path):
    texts, relevant = labelled(base_export, 30, seed=5)

    def refused(labels, *extra):
        with pytest.raises(SystemExit) as exc:
            calibrate_cli(export_copy, labels, *extra)
        return str(exc.value)

    bad = [list(r) for r in relevant]
    bad[2] = [123456]
    assert "bad.jsonl:3: relevant id 123456 is not in the gallery (300 items)" in refused(
        write_jsonl(tmp_path / "bad.jsonl", texts, bad)
    )
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "no labelled caption" in refused(str(tmp_path / "empty.jsonl"))
    assert "5 labelled captions are too few: at least 20" in refused(
        write_jsonl(tmp_path / "few.jsonl", texts[:5], relevant[:5])
    )
    lines = (tmp_path / "bad.jsonl").read_text().splitlines()
    (tmp_path / "broken.jsonl").write_text("\n".join([*lines[:4], '{"caption": "x", "relevant": ["7"]}']))
    assert "broken.jsonl:5: 'relevant' must be a list of integer gallery ids" in refused(str(tmp_path / "broken.jsonl"))
    (tmp_path / "typo.jsonl").write_text('{"caption": "a dog", "relevent": [1000]}\n')
    assert "typo.jsonl:1: expected" in refused(str(tmp_path / "typo.jsonl"))
    assert "a split applies to a Karpathy JSON file" in refused(str(tmp_path / "bad.jsonl"), "--split", "test")
    nothing = write_jsonl(tmp_path / "none.jsonl", texts, [[] for _ in texts])
    assert "no labelled caption names a relevant item" in refused(nothing)
    assert layout.servable_versions(export_copy) == [1]  # nothing was published


def test_karpathy_labels_map_images_as_the_index_numbered_them(export_copy, base_export, tmp_path):
    texts, relevant = labelled(base_export, 60, seed=6)
    images = {}
    for text, (image_id,) in zip(texts, relevant, strict=True):
        images.setdefault(image_id, []).append({"raw": text})
    entries = [{"filename": f"{i}.jpg", "imgid": i, "split": "test", "sentences": s} for i, s in images.items()] + [
        {"filename": "0000000001.jpg", "imgid": 1, "split": "train", "sentences": [{"raw": "not in the gallery"}]}
    ]
    path = tmp_path / "dataset_new.json"
    path.write_text(json.dumps({"images": entries}))
    by_filename = read_labels(str(path), split="test", karpathy_ids="filename")
    assert [int(r[0]) for r in by_filename.relevant] == [i for i, s in images.items() for _ in s]
    assert "relevant id 1 is not in the gallery" in str(
        pytest.raises(SystemExit, calibrate_cli, export_copy, str(path)).value
    )
    assert calibrate_cli(export_copy, str(path), "--split", "test") == 0
    manifest = layout.read_json(os.path.join(export_copy, "index", "2", "manifest.json"))
    assert manifest["recalibration"]["labels"]["split"] == "test"
    assert manifest["recalibration"]["num_labelled_queries"] == 60


def test_query_units_group_captions_with_the_same_relevant_items():
    relevant = [[5], [6, 9], [9, 6], [], [], [5]]
    labels = RelevanceLabels([str(i) for i in range(6)], [np.unique(r).astype(np.int64) for r in relevant], [], {})
    units = query_units(labels)
    assert units[0] == units[5] and units[1] == units[2] and len(set(units.tolist())) == 4


def test_sharded_scann_index_is_recalibrated_per_shard_and_as_a_whole(export_copy, base_export, tmp_path):
    x = embed_with_keras(base_export["image"], base_export["gallery"])
    build_sharded_index(
        x,
        base_export["ids"],
        export_copy,
        1,
        num_shards=2,
        workers=1,
        overwrite=True,
        config=BuildConfig(brute_force_below=100),
    )
    texts, relevant = labelled(base_export, 80, seed=7)
    done = recalibrate_index(
        export_copy, read_labels(write_jsonl(tmp_path / "l.jsonl", texts, relevant)), levels=(0.3,)
    )
    top = done.manifest
    assert top["thresholds"]["guaranteed"]["gallery_size"] == GALLERY_SIZE and top["version"] == 2
    for entry in top["shards"]:
        shard = layout.read_json(os.path.join(export_copy, "index", "2", entry["name"], "manifest.json"))
        assert shard["kind"] == "scann" and shard["thresholds"]["guaranteed"]["gallery_size"] == entry["num_items"]
        assert shard["threshold_search"]["approximate"]["query_source"] == "labelled captions of the recalibration"
        assert shard["model"] == top["model"] and shard["recalibration"]["from_version"] == 1
    s = Searcher.load(export_copy)
    assert s.version == 2 and s.num_shards == 2
    assert s.threshold_for_precision(0.3) == top["thresholds"]["guaranteed"]["threshold_at_precision"]["0.3"]


KILLED_PUBLISH = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from ce_retrieval.evaluation.split_calibration import Calibration
    from ce_retrieval.build import derived_version
    from ce_retrieval.search import layout
    from ce_retrieval.serve.recalibrate import publish_recalibration
    from ce_retrieval.utils import atomic

    export_dir, calibration_file, kill_at = sys.argv[1:4]
    calls = {"publish": 0, "link": 0}
    publish_directory, link_or_copy = atomic.publish_directory, derived_version._link_or_copy

    def publish(tmp, final, **kw):  # kill_at "publish-k": SIGKILL just before the k-th rename (0: text encoder)
        if kill_at == f"publish-{calls['publish']}":
            os.kill(os.getpid(), signal.SIGKILL)
        calls["publish"] += 1
        return publish_directory(tmp, final, **kw)

    def link(src, dst):  # kill_at "copying": SIGKILL while version 1's files are being linked
        calls["link"] += 1
        if kill_at == "copying" and calls["link"] == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return link_or_copy(src, dst)

    atomic.publish_directory, derived_version._link_or_copy = publish, link
    calibration = Calibration.from_json(json.load(open(calibration_file)))
    old = layout.read_json(os.path.join(export_dir, "index", "1", "manifest.json"))
    publish_recalibration(export_dir, 1, calibration, np.zeros((1, 16), np.float32), old, {"file": "labels.jsonl"})
    """
)


def assert_every_version_whole(root):
    """Every numeric folder is a whole part (SavedModel + metadata, or an index that loads), and every servable
    version serves."""
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        for v in layout.versions(os.path.join(root, part)):
            folder = layout.version_dir(root, part, v)
            assert os.path.isfile(os.path.join(folder, "saved_model.pb")) and layout.export_metadata(root, part, v)
    for v in layout.versions(os.path.join(root, layout.INDEX)):
        GalleryIndex.load(layout.version_dir(root, layout.INDEX, v))
    for v in layout.servable_versions(root):
        assert len(Searcher.load(root, v).search(["a red dog"], k=3)[0].ids) == 3


@pytest.fixture(scope="module")
def calibration_json(base_export, tmp_path_factory):
    texts, relevant = labelled(base_export, 40, seed=8)
    labels = read_labels(write_jsonl(tmp_path_factory.mktemp("labels") / "l.jsonl", texts, relevant))
    index = GalleryIndex.load(os.path.join(base_export["dir"], "index", "1"))
    cal = calibrate_on_index(embed_with_keras(base_export["text"], texts), index, labels, levels=(0.5,), delta=0.1)
    return cal.to_json()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at, left",
    [("copying", [1]), ("publish-0", [1]), ("publish-1", [1]), ("publish-2", [1, 2])],
)
def test_a_kill_while_publishing_leaves_nothing_half_written(export_copy, tmp_path, calibration_json, kill_at, left):
    from ce_retrieval.evaluation.split_calibration import Calibration

    calibration_file = tmp_path / "calibration.json"
    calibration_file.write_text(json.dumps(calibration_json))
    script = tmp_path / "publish.py"
    script.write_text(KILLED_PUBLISH)
    proc = subprocess.run([sys.executable, str(script), export_copy, str(calibration_file), kill_at], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert layout.servable_versions(export_copy) == [1]  # the new version never became servable
    assert layout.complete_versions(export_copy) == left  # at most its encoders, without an index
    assert_every_version_whole(export_copy)

    old = layout.read_json(os.path.join(export_copy, "index", "1", "manifest.json"))
    done = publish_recalibration(export_copy, 1, Calibration.from_json(calibration_json), None, old, {"file": "l"})
    assert done.version == (2 if kill_at in ("copying", "publish-0") else 3)  # a number once visible is not reused
    assert layout.servable_versions(export_copy) == [1, done.version]
    assert layout.complete_versions(export_copy) == [1, done.version]  # the abandoned encoders are gone
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER, layout.INDEX):
        assert sorted(os.listdir(os.path.join(export_copy, part))) == ["1", str(done.version)]  # no temporaries
    assert_every_version_whole(export_copy)

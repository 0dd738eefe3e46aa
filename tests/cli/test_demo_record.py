"""The main job's record (ce_retrieval/cli/demo_record.py) and the range over seeds (``benchmarks.quality.demo_seeds``):
figures read from the report, files written, ranges and positions computed, the shipped range well formed."""

import json
import os
import types

import pytest

from benchmarks.quality import demo_seeds
from ce_retrieval.cli import demo_record


def _report(pr_auc, r1, levels_reached, precision_05):
    levels = {f"{p / 20:g}": (0.1 if i < levels_reached else None) for i, p in enumerate(range(1, 20))}
    summary = {k: 0.5 for k in demo_record.FIGURES if k not in ("levels_reached", "threshold_0.5")}
    summary.update(pr_auc=pr_auc, t2i_r1=r1, **{"achieved_precision_0.5": precision_05})
    return {
        "summary": summary,
        "metrics": {"transfer": {"levels": levels}},
        "calibration_split": {"threshold_at_precision": {"0.5": 0.83 if precision_05 is not None else None}},
        "git_commit": "abc",
    }


def _cfg(seed):
    ns = types.SimpleNamespace
    return ns(
        name="synthetic_demo",
        train=ns(seed=seed, epochs=5, steps_per_epoch=100, batch_size=64),
        data=ns(seed=0),
        loss=ns(name="CrossExampleSoftmax"),
    )


def test_headline_reads_the_report():
    h = demo_record.headline(_report(0.3, 0.4, 16, None))
    assert list(h) == list(demo_record.FIGURES)
    assert (h["pr_auc"], h["t2i_r1"], h["levels_reached"], h["threshold_0.5"]) == (0.3, 0.4, 16, None)
    assert h["achieved_precision_0.5"] is None


def test_write_makes_json_and_markdown_and_places_figures_in_the_range(tmp_path, monkeypatch, capsys):
    shipped = {
        "seeds": [0, 1, 2],
        "date": "2026-11-25T10:00:00+00:00",
        "machine": {"cpu": "test cpu"},
        "runs": {"CrossExampleSoftmax": {k: [0.2, 0.6] for k in demo_record.FIGURES}},
    }
    shipped["runs"]["CrossExampleSoftmax"]["levels_reached"] = [10, 16]
    (tmp_path / "range.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(demo_record, "RANGE_FILE", str(tmp_path / "range.json"))
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)  # scripts/test.sh sets it; the range has the default
    reports = {"CrossExampleSoftmax": _report(0.1, 0.4, 17, 0.45), "SampledSoftmax": _report(0.1, 0.3, 6, None)}
    record = demo_record.write(str(tmp_path / "w"), _cfg(2), reports, 12.34)
    saved = json.loads((tmp_path / "w" / "record.json").read_text())
    assert saved == record and saved["seed"] == 2 and saved["steps"] == 500 and saved["seconds"] == 12.3
    assert len(saved["load_average_1_5_15"]) == 3 and saved["machine"]["cpu_count"] == os.cpu_count()
    md = (tmp_path / "w" / "record.md").read_text()
    assert "seed 2" in md and "| global PR-AUC (%) | 10.0 | 10.0 |" in md
    out = capsys.readouterr().out
    assert "CrossExampleSoftmax: global PR-AUC 10.0 in [20.0, 60.0]: BELOW" in out
    assert "CrossExampleSoftmax: text->image R@1 40.0 in [20.0, 60.0]: inside" in out
    assert "CrossExampleSoftmax: precision levels reachable on val (of 19) 17 in [10, 16]: ABOVE" in out
    assert "SampledSoftmax: no range shipped for this loss" in out
    assert "intra-op threads" not in out  # neither side names a setting: both default
    assert "differs from the range's" not in out  # the range names no steps here


def test_the_demo_says_when_its_steps_differ_from_the_range(tmp_path, monkeypatch, capsys):
    """A run with other steps (e.g. ``train.epochs=15``) is compared with a range of another setting: it says so."""
    shipped = {"seeds": [0], "date": "2026-11-25", "machine": {"cpu": "c"}, "runs": {}, "steps": 500}
    shipped |= {"config": "synthetic_demo", "batch_size": 64}
    (tmp_path / "range.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(demo_record, "RANGE_FILE", str(tmp_path / "range.json"))
    demo_record.write(str(tmp_path / "a"), _cfg(0), {"CrossExampleSoftmax": _report(0.1, 0.4, 1, None)}, 1)
    assert "differs from the range's" not in capsys.readouterr().out  # _cfg: 500 steps at batch 64
    cfg = _cfg(0)
    cfg.train.epochs *= 3
    demo_record.write(str(tmp_path / "b"), cfg, {"CrossExampleSoftmax": _report(0.1, 0.4, 1, None)}, 1)
    assert "this run's steps (1500) differs from the range's (500)" in capsys.readouterr().out


def test_the_record_names_the_thread_setting_and_the_demo_warns_when_it_differs(tmp_path, monkeypatch, capsys):
    """One intra-op thread trains another model than the default (benchmarks/results/demo_seeds_1thread.md): the
    record says which setting made it, and a run whose setting differs from the shipped range's says so."""
    shipped = {"seeds": [0], "date": "2026-11-25T10:00:00+00:00", "machine": {"cpu": "c"}, "runs": {}}
    (tmp_path / "range.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(demo_record, "RANGE_FILE", str(tmp_path / "range.json"))
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    record = demo_record.write(str(tmp_path / "w"), _cfg(0), {"CrossExampleSoftmax": _report(0.1, 0.4, 1, None)}, 1)
    assert record["machine"]["tf_intra_op_threads"] == "1"
    assert "(intra-op threads 1)" in (tmp_path / "w" / "record.md").read_text()
    assert "intra-op threads (1) differ from the range's (default)" in capsys.readouterr().out
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
    assert demo_record.machine()["tf_intra_op_threads"] == "default"


def test_range_over_seeds_counts_seeds_without_a_value(tmp_path):
    records = []
    for seed, (pr, r1, p05) in enumerate([(0.30, 0.40, 0.45), (0.20, 0.31, None), (0.34, 0.52, 0.41)]):
        rec = demo_record.write(str(tmp_path / f"seed{seed}"), _cfg(seed), {"CE": _report(pr, r1, 16, p05)}, 1.0)
        records.append(rec)
    rng = demo_seeds.summary(records)
    ce = rng["runs"]["CE"]
    assert ce["pr_auc"] == [0.20, 0.34] and ce["achieved_precision_0.5"] == [0.41, 0.45]
    assert ce["missing"] == {"achieved_precision_0.5": 1, "threshold_0.5": 1} and rng["seeds"] == [0, 1, 2]
    assert (
        demo_seeds.main(
            ["--seeds", "0", "1", "2", "--workdir", str(tmp_path), "--out", str(tmp_path / "r"), "--no_run"]
        )
        == 0
    )
    assert json.loads((tmp_path / "r.json").read_text())["range"]["runs"]["CE"]["pr_auc"] == [0.20, 0.34]
    text = (tmp_path / "r.md").read_text()
    assert "| global PR-AUC (%) | 20.0 – 34.0 |" in text
    assert "Text→image R@1 spread over the seeds (max − min, points; the goal is ≤ 10): CE 21.0." in text
    assert "Mean over the seeds (global PR-AUC / text→image R@1, %): CE 28.0 / 41.0." in text
    assert f"demo_seeds --seeds 0 1 2 --workdir {tmp_path} --out {tmp_path / 'r'} --no_run" in text  # as run
    assert "--package" not in text


def test_the_shipped_range_is_well_formed():
    shipped = demo_record.load_range()
    if shipped is None:
        pytest.fail(f"{demo_record.RANGE_FILE} is missing: run benchmarks/quality/demo_seeds.py --package")
    assert len(shipped["seeds"]) >= 3 and shipped["machine"]["cpu"]
    for name in ("CrossExampleSoftmax", "SampledSoftmax"):
        for key in demo_record.FIGURES:
            lo, hi = shipped["runs"][name][key]
            assert lo is None or lo <= hi, (name, key)


def test_the_range_record_carries_each_training_s_last_epoch_and_seconds(tmp_path):
    rec = demo_record.write(str(tmp_path / "seed0"), _cfg(0), {"CE": _report(0.3, 0.4, 16, 0.45)}, 1.0)
    model_dir = tmp_path / "seed0" / "model"
    model_dir.mkdir()
    history = {"loss": [6.0, 5.1233], "in_batch_recall_at_1": [0.3, 0.6125]}
    summary = {"loss": "CE", "seconds": 41.57, "history": history}
    (model_dir / "train_summary.json").write_text(json.dumps(summary))
    read = demo_seeds.read_record(tmp_path / "seed0")
    assert read["training"] == {"CE": {"loss": 5.1233, "in_batch_recall_at_1": 0.6125, "seconds": 41.57}}
    text = demo_seeds.markdown(demo_seeds.summary([read]), [read], "cmd")
    assert "| 0 | 5.12 / 0.61; 41.6 s |" in text and rec["seed"] == 0

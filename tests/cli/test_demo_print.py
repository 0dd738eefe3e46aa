"""What the main job (ce_retrieval/cli/demo.py) prints: the index line (thresholds per precision, not the probability
map's knots; ANN recall@10 from the manifest's ``ann`` block) and the side-by-side table's probability rows."""

from ce_retrieval.cli import demo


def test_index_line_prints_thresholds_per_precision_and_the_measured_ann_recall():
    manifest = {
        "num_items": 500,
        "kind": "scann",
        "ann": {"recall_at_10": 0.9871, "target": 0.95},
        "thresholds": {
            "threshold_at_precision": {"0.9": 0.91234, "0.5": 0.82759, "0.8": 0.8899},
            "probability": {"format": "isotonic/1", "knots_x": [0.1, 0.2], "knots_y": [0.0, 0.5]},
        },
    }
    line = demo.index_line(manifest)
    assert line == (
        "[demo] index: 500 images (scann), ANN recall@10 0.987, thresholds per precision (estimates) "
        "{0.5 -> 0.828, 0.8 -> 0.890, 0.9 -> 0.912}"
    )
    assert "knots" not in line and "None" not in line
    bare = demo.index_line({"num_items": 3, "kind": "brute_force", "ann": {"recall_at_10": 1.0}, "thresholds": {}})
    assert "(estimates) {none reached}" in bare and "ANN recall@10 1.000" in bare


def test_index_line_prints_the_guaranteed_thresholds_and_refusals():
    manifest = {
        "num_items": 500,
        "kind": "scann",
        "ann": {"recall_at_10": 0.99},
        "thresholds": {
            "threshold_at_precision": {"0.5": 0.8, "0.9": 0.9},
            "guaranteed": {
                "confidence": 0.9,
                "levels": {
                    "0.5": {"threshold": 0.85, "precision_lower_bound": 0.61},
                    "0.9": {"threshold": None, "refused": "...", "best_precision_lower_bound": 0.72},
                },
            },
        },
    }
    lines = demo.index_line(manifest).split("\n")
    assert lines[0].endswith("guaranteed with confidence 0.9:")
    assert lines[1] == "  0.5: 0.850 (precision >= 0.61); estimate 0.800"
    assert lines[2] == "  0.9: refused (certified at most 0.72 on this gallery); estimate 0.900"


def test_side_by_side_lists_the_figures_that_separate_the_maps():
    summary = {
        "pr_auc": 0.3,
        "probability_ece": 0.0002,
        "probability_brier_skill": 0.2345,
        "probability_pairs_ge_0.9": 1234,
        "probability_precision_ge_0.9": 0.8,
        "probability_query_error": 0.12,
    }
    reports = {"CrossExampleSoftmax": {"summary": summary}, "SampledSoftmax": {"summary": {"pr_auc": 0.1}}}
    lines = demo.side_by_side_lines(reports)
    assert "CrossExampleSoftmax" in lines[0] and "SampledSoftmax" in lines[0]
    assert not any("ECE" in line for line in lines)  # bounded by ~2 P / N for any map: cannot separate models
    skill = next(line for line in lines if "Brier skill" in line)
    assert skill.split()[-2:] == ["23.4", "-"]
    pairs = next(line for line in lines if "pairs predicted >= 0.9" in line)
    assert pairs.split()[-2:] == ["1,234", "-"]
    assert any("per-query error where p >= 0.1" in line and "12.0" in line for line in lines)
    assert any("recall at guaranteed precision 0.8" in line for line in lines)

"""``benchmarks/scale/autograph_startup.py`` without its training processes (its figure lives in BENCHMARKS.md):
the summary's medians, saving and weight check, and the record's text."""

from benchmarks.scale import autograph_startup as bench


def _runs(hashes=("abc", "abc", "abc", "abc")):
    cpus = {"unconverted": (10.0, 12.0), "converted": (16.0, 15.0)}
    kinds = ["unconverted", "converted", "unconverted", "converted"]
    seen = {"unconverted": 0, "converted": 0}
    runs = []
    for kind, digest in zip(kinds, hashes, strict=True):
        runs.append({"kind": kind, "cpu_s": cpus[kind][seen[kind]], "weights_sha256": digest})
        seen[kind] += 1
    return runs


def test_summary_and_record_text():
    summary = bench.summarise(_runs())
    assert summary["median_cpu_s"] == {"unconverted": 11.0, "converted": 15.5}
    assert summary["saved_cpu_s"] == 4.5 and summary["ratio_converted_over_unconverted"] == round(15.5 / 11, 3)
    assert summary["same_weights"]
    assert not bench.summarise(_runs(("abc", "abc", "abc", "abd")))["same_weights"]
    record = {
        "command": "python -m benchmarks.scale.autograph_startup",
        "date": "2026-11-27T00:00:00+00:00",
        "machine": {"cpu": "CPU X", "cores": 2},
        "load_before": [0.1, 0.2, 0.3],
        "load_after": [0.4, 0.5, 0.6],
        "repeats": 2,
        "runs": _runs(),
        "summary": summary,
    }
    text = bench.markdown(record)
    assert "`python -m benchmarks.scale.autograph_startup`" in text and "CPU X, 2 cores" in text
    assert "| unconverted | 11.00 | 10.00, 12.00 |" in text and "| converted | 15.50 | 16.00, 15.00 |" in text
    assert "Saved per process: 4.50 CPU s" in text and "Same trained weights in every run: True." in text

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


def _record(command, runs, summary, **extra):
    return {
        "command": command,
        "date": "2026-11-27T00:00:00+00:00",
        "machine": {"cpu": "CPU X", "cores": 2},
        "load_before": [0.1, 0.2, 0.3],
        "load_after": [0.4, 0.5, 0.6],
        "repeats": 2,
        "runs": runs,
        "summary": summary,
        **extra,
    }


def test_summary_and_record_text():
    kinds = bench.CHANGES["autograph"][0]
    summary = bench.summarise(_runs(), kinds)
    assert summary["median_cpu_s"] == {"unconverted": 11.0, "converted": 15.5}
    assert summary["saved_cpu_s"] == 4.5 and summary["ratio_converted_over_unconverted"] == round(15.5 / 11, 3)
    assert summary["same_weights"]
    assert not bench.summarise(_runs(("abc", "abc", "abc", "abd")), kinds)["same_weights"]
    text = bench.markdown(_record("python -m benchmarks.scale.autograph_startup", _runs(), summary))
    assert "`python -m benchmarks.scale.autograph_startup`" in text and "CPU X, 2 cores" in text
    assert "| unconverted | 11.00 | 10.00, 12.00 |" in text and "| converted | 15.50 | 16.00, 15.00 |" in text
    assert "Saved per process: 4.50 CPU s" in text and "Same trained weights in every run: True." in text


def test_the_torch_change_names_its_own_kinds_and_record():
    kinds, name, title = bench.CHANGES["torch"]
    runs = [
        {"kind": k, "cpu_s": c, "weights_sha256": "abc"} for k, c in zip(kinds * 2, (8.0, 11.0, 9.0, 12.0), strict=True)
    ]
    summary = bench.summarise(runs, kinds)
    assert name == "torch_startup" and summary["median_cpu_s"] == {"torch_refused": 8.5, "torch_imported": 11.5}
    assert summary["saved_cpu_s"] == 3.0 and summary["ratio_torch_imported_over_torch_refused"] == round(11.5 / 8.5, 3)
    text = bench.markdown(
        _record("python -m benchmarks.scale.autograph_startup --change torch", runs, summary, change="torch")
    )
    assert text.startswith(f"# {title}:") and "| torch_imported | 11.50 | 11.00, 12.00 |" in text
    assert "(torch_imported / torch_refused = 1.353)" in text

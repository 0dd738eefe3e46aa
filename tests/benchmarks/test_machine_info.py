"""benchmarks/common/machine.py is the one place a benchmark reads the machine's load: ``load_average`` (the record's
1/5/15-minute triple), ``LoadSampler`` and ``machine_info`` (samples during a run)."""

import pathlib

from benchmarks.common.machine import load_average, machine_info

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def test_load_average_is_the_rounded_triple():
    load = load_average()
    assert len(load) == 3 and all(x >= 0 and round(x, 2) == x for x in load)
    info = machine_info([0.5])
    assert info["cores"] and info["load_min"] <= 0.5 <= info["load_max"] and len(info["load_samples"]) == 2


def test_no_benchmark_reads_the_load_itself():
    readers = [
        str(path.relative_to(BENCHMARKS))
        for path in BENCHMARKS.rglob("*.py")
        if "getloadavg" in path.read_text(encoding="utf-8") and path.name != "machine.py"
    ]
    assert not readers, f"read the load through benchmarks.common.machine, not os.getloadavg: {readers}"

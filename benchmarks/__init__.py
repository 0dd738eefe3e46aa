"""The benchmarks of ce_retrieval: a package run from the repository root, ``python -m benchmarks.<concern>.<script>``.

``common/`` holds what every benchmark shares (the record writer, machine and load, the generated galleries, the
stand-in exports); the scripts sit in sub-packages by concern: ``losses/`` (cost and behaviour of the losses),
``quality/`` (retrieval quality, calibration, the dataset families), ``serving/`` (indexes, threshold search, the
HTTP service) and ``scale/`` (large batches, memory, the main job's time). ``check_records.py`` checks the figures of
BENCHMARKS.md and README.md against the records under ``results/``.
"""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"  # where the records are committed

"""Time of ``export_model`` for the main job's towers, against the same export with Keras's own serialisation of
every layer's call function (tf_keras's default ``save_traces=True``), in one process.

The export writes each tower as a ``tf.Module`` with its serving signatures; the towers are tracked for their
variables, assets and lookup tables. Keras's default serialisation also traces the ``call`` of every layer for what
``tf_keras.models.load_model`` would revive, which a served tower never uses. The baseline puts that back by
replacing ``export._without_keras_traces`` with a no-op. The two kinds alternate (ABBA), each into a new version of
its own export directory, with ``verify`` on: every export is reloaded and must reproduce the Keras towers on the
probe inputs, so both kinds serve the same embeddings. Reported: wall and process CPU seconds per export, the
SavedModels' size on disk and how many functions each graph library holds.

    python -m benchmarks.serving.export_time                 # writes benchmarks/results/export_time.{json,md}

Measure alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks import ROOT
from benchmarks.common.ab import abba, add_config_arguments, load_config
from benchmarks.common.machine import load_average, machine_info
from benchmarks.common.records import write_record

KINDS = ("signatures only", "with Keras traces")


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def export_once(model, kind: str, export_dir: str) -> dict:
    """One verified export of ``model`` of ``kind``: its wall and CPU seconds, size and function count."""
    from ce_retrieval.build import export

    keep = export._without_keras_traces
    if kind == "with Keras traces":
        export._without_keras_traces = contextlib.nullcontext
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        paths = export.export_model(model, export_dir)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        export._without_keras_traces = keep
    return {
        "kind": kind,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "bytes": _disk_bytes(paths.text_encoder) + _disk_bytes(paths.image_encoder),
        "functions": len(export.graph_functions(paths.text_encoder)) + len(export.graph_functions(paths.image_encoder)),
        "fingerprint": paths.metadata["fingerprint"][:16],
    }


def summarise(runs: list[dict]) -> dict:
    def med(kind, field):
        return float(np.median([r[field] for r in runs if r["kind"] == kind]))

    median = {k: {f: med(k, f) for f in ("wall_s", "cpu_s")} for k in KINDS}
    base, new = median["with Keras traces"], median["signatures only"]
    return {
        "median": median,
        "speedup_wall": round(base["wall_s"] / new["wall_s"], 2),
        "speedup_cpu": round(base["cpu_s"] / new["cpu_s"], 2),
        "same_model": len({r["fingerprint"] for r in runs}) == 1,
    }


def markdown(record: dict) -> str:
    s, m = record["summary"], record["machine"]
    lines = [
        f"# Export of the main job's towers: signatures only against Keras's traces ({record['date']})",
        "",
        f"    {record['command']}",
        "",
        f"{m['cpu']}, {m['cores']} cores; load average (1, 5, 15 min) before {record['load_before']}, after "
        f"{record['load_after']} (the run's own threads, nothing else running). The demo config's towers "
        f"({record['config']}, initial weights of seed 0), {record['repeats']} verified exports of each kind in one "
        "process, alternating ABBA; every export reloaded and checked against the Keras towers on the probe inputs.",
        "",
        "| kind | median wall s | median CPU s | wall s per export | MB on disk | graph functions |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for kind in KINDS:
        runs = [r for r in record["runs"] if r["kind"] == kind]
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in runs)
        lines.append(
            f"| {kind} | {s['median'][kind]['wall_s']:.2f} | {s['median'][kind]['cpu_s']:.2f} | {walls} | "
            f"{runs[0]['bytes'] / 1e6:.2f} | {runs[0]['functions']} |"
        )
    lines += [
        "",
        f"Speed-up of the export (with Keras traces / signatures only): {s['speedup_wall']}× wall, "
        f"{s['speedup_cpu']}× CPU. One model in every export: {s['same_model']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(ap)
    ap.add_argument("--repeats", type=int, default=3, help="exports of each kind (even: ABBA pairs)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    command = "python -m benchmarks.serving.export_time " + " ".join(sys.argv[1:] if argv is None else argv)

    from ce_retrieval import data
    from ce_retrieval.modeling import build_two_tower
    from ce_retrieval.utils.seeding import seed_everything

    cfg, config_label = load_config(args)
    seed_everything(0)
    load_before = load_average()
    order = abba(KINDS, args.repeats)
    with tempfile.TemporaryDirectory() as workdir:
        model = build_two_tower(cfg.model, data.vocab_path_for(cfg.data, workdir))  # the vocabulary training learns
        runs = [export_once(model, kind, os.path.join(workdir, str(KINDS.index(kind)))) for kind in order]
    record = {
        "command": command.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info([]),
        "load_before": load_before,
        "load_after": load_average(),
        "config": config_label,
        "repeats": args.repeats,
        "runs": runs,
        "summary": summarise(runs),
    }
    write_record(args.out, "export_time", record, markdown(record))
    return 0 if record["summary"]["same_model"] else 1


if __name__ == "__main__":
    sys.exit(main())

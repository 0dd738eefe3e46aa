"""CPU of one short training process with a start-up saving against the same process without it, in fresh processes.

``--change autograph`` (default): autograph leaves the towers' libraries unconverted
(``ce_retrieval/utils/autograph_rules.py``); the baseline replaces ``leave_graph_ready_libraries_unconverted`` by a
no-op before any tower module is imported, so that autograph converts keras-cv, tensorflow-text, tf-models-official
and dm-tree as it does by default. ``--change torch``: importing keras-cv does not import torch
(``image_tower._torch_import_refused``); the baseline replaces that block by a null context, so keras-cv's
``__init__`` imports torch as it does by default (torch is installed in the test and benchmark environments).

Each run is ``train`` on the tests' tiny synthetic config (6 steps, no evaluation) in its own interpreter. The two
kinds alternate, and each reports its user + system CPU seconds and a hash of the trained weights. The weights must
be identical: neither change touches an op.

    python -m benchmarks.scale.autograph_startup                 # writes benchmarks/results/autograph_startup.{json,md}
    python -m benchmarks.scale.autograph_startup --change torch  # writes benchmarks/results/torch_startup.{json,md}

Measure alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import ROOT
from benchmarks.common.machine import load_average, machine_info
from benchmarks.common.records import write_record

# The child: optionally switch the change off, train the tiny config, print its weights' hash.
CHILD = """
import contextlib, hashlib, json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import ce_retrieval.utils.autograph_rules as rules
if sys.argv[1] == "converted":
    rules.leave_graph_ready_libraries_unconverted = lambda: None
if sys.argv[1] == "torch_imported":
    import ce_retrieval.modeling.image_tower as image_tower
    image_tower._torch_import_refused = contextlib.nullcontext
sys.path.insert(0, os.path.join(sys.argv[3], "tests", "training"))
from tiny import TINY_OVERRIDE
from ce_retrieval import configs
from ce_retrieval.cli.train import resolve_config
from ce_retrieval.training import load_trained, train
cfg = configs.load_experiment(resolve_config("synthetic_demo"), [TINY_OVERRIDE, "evaluation.every_n_epochs=0"])
train(cfg, sys.argv[2], print_fn=lambda *a: None)
digest = hashlib.sha256(b"".join(w.tobytes() for w in load_trained(sys.argv[2])[1].get_weights())).hexdigest()
print(json.dumps({"weights_sha256": digest[:16]}))
"""
# change -> (the kind with it, the baseline), the record's name, its title
CHANGES = {
    "autograph": (("unconverted", "converted"), "autograph_startup", "Autograph and the towers' libraries"),
    "torch": (("torch_refused", "torch_imported"), "torch_startup", "keras-cv without torch"),
}


def run_once(kind: str, workdir: str) -> dict:
    """One fresh training process of ``kind``: its CPU seconds (user + system) and its weights' hash."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, os.path.join(workdir, kind), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"kind": kind, "cpu_s": round(cpu, 2), **json.loads(done.stdout.strip().splitlines()[-1])}


def summarise(runs: list[dict], kinds: tuple[str, str]) -> dict:
    """Median CPU per kind, the saving, and whether every run trained the same weights."""
    median = {k: float(np.median([r["cpu_s"] for r in runs if r["kind"] == k])) for k in kinds}
    new, base = kinds
    return {
        "median_cpu_s": median,
        "saved_cpu_s": round(median[base] - median[new], 2),
        f"ratio_{base}_over_{new}": round(median[base] / median[new], 3),
        "same_weights": len({r["weights_sha256"] for r in runs}) == 1,
    }


def markdown(record: dict) -> str:
    s, m = record["summary"], record["machine"]
    kinds, _, title = CHANGES[record.get("change", "autograph")]
    new, base = kinds
    lines = [
        f"# {title}: one short training process ({record['date']})",
        "",
        f"`{record['command']}`; {m['cpu']}, {m['cores']} cores; load average (1, 5, 15 min) before "
        f"{record['load_before']}, after {record['load_after']}. {record['repeats']} fresh processes of each kind, "
        "alternating; tiny synthetic config, 6 training steps, no evaluation.",
        "",
        "| kind | median CPU s (user + system) | runs |",
        "|---|---:|---|",
    ]
    for kind in kinds:
        cpus = ", ".join(f"{r['cpu_s']:.2f}" for r in record["runs"] if r["kind"] == kind)
        lines.append(f"| {kind} | {s['median_cpu_s'][kind]:.2f} | {cpus} |")
    lines += [
        "",
        f"Saved per process: {s['saved_cpu_s']:.2f} CPU s ({base} / {new} = "
        f"{s[f'ratio_{base}_over_{new}']}). Same trained weights in every run: {s['same_weights']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--change", choices=sorted(CHANGES), default="autograph")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    command = "python -m benchmarks.scale.autograph_startup " + " ".join(sys.argv[1:] if argv is None else argv)
    kinds, name, _ = CHANGES[args.change]
    load_before = load_average()
    with tempfile.TemporaryDirectory() as workdir:
        runs = [run_once(kind, workdir) for _ in range(args.repeats) for kind in kinds]
    record = {
        "command": command.strip(),
        "change": args.change,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info([]),
        "load_before": load_before,
        "load_after": load_average(),
        "repeats": args.repeats,
        "runs": runs,
        "summary": summarise(runs, kinds),
    }
    write_record(args.out, name, record, markdown(record))
    return 0 if record["summary"]["same_weights"] else 1


if __name__ == "__main__":
    sys.exit(main())

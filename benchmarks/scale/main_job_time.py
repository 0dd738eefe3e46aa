"""The README's run-time figure: ``bash scripts/main.sh`` on a fresh clone, timed end to end.

Clones the repository's committed HEAD into a temporary folder (nothing of this checkout's ``.venv`` or ``runs/``
comes along), runs there first ``scripts/env.sh`` (the environment ``main.sh`` sources) and then the README's
main-job command, which finds the environment ready, and records both wall times, the demo's own seconds from the
``record.json`` it writes, the machine, the load average around the run and the date.

    python -m benchmarks.scale.main_job_time                       # writes benchmarks/results/main_job_time.{json,md}
    python -m benchmarks.scale.main_job_time --keep /tmp/fresh     # keep the clone (its runs/demo) afterwards

Measure alone on the machine: the figure is a wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT
from benchmarks.common.machine import cpu_name, load_average  # noqa: E402  (the CPU model for the record)
from benchmarks.common.records import write_record  # noqa: E402


def run(clone: str, log_path: str) -> dict:
    """Clones HEAD into ``clone``, runs ``bash scripts/main.sh`` there; seconds of the whole and of its parts."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, clone], check=True)
    head = subprocess.run(["git", "-C", clone, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    seconds = {}
    with open(log_path, "w") as log:
        # first what main.sh sources (the environment), then main.sh itself, which finds the environment ready
        for part, cmd in (("env", ["bash", "-c", "source scripts/env.sh"]), ("main", ["bash", "scripts/main.sh"])):
            t0 = time.perf_counter()
            code = subprocess.run(cmd, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            seconds[part] = time.perf_counter() - t0
            if code != 0:
                raise SystemExit(f"{' '.join(cmd)} failed with exit status {code}; see {log_path}")
    with open(os.path.join(clone, "runs", "demo", "record.json")) as f:
        record = json.load(f)
    return {
        "commit": head.stdout.strip(),
        "total_s": seconds["env"] + seconds["main"],
        "until_demo_s": seconds["env"],
        "demo_record": record,
    }


def markdown(doc: dict) -> str:
    r = doc["demo_record"]
    until = doc["until_demo_s"]
    lines = [
        f"# The main job on a fresh clone ({doc['date']})",
        "",
        f"`{doc['command']}` at commit {doc['commit']}; {doc['machine']['cpu']}, {doc['machine']['cores']} cores; "
        f"load average (1, 5, 15 min) before {doc['load_before']}, after {doc['load_after']}.",
        "",
        "| part | seconds | minutes |",
        "|---|---:|---:|",
        f"| the whole `bash scripts/main.sh` | {doc['total_s']:.0f} | {doc['total_s'] / 60:.1f} |",
    ]
    if until is not None:
        lines.append(f"| creating the environment (`scripts/env.sh`) | {until:.0f} | {until / 60:.1f} |")
    lines += [
        f"| the demo itself (its record.json) | {r['seconds']:.0f} | {r['seconds'] / 60:.1f} |",
        "",
        "The demo's own record (figures, machine, seed) is kept in the JSON beside this file.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "main_job_time"))
    ap.add_argument("--keep", default=None, help="clone here and keep it (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    clone = args.keep or tempfile.mkdtemp(prefix="ce_fresh_clone_")
    if args.keep and os.path.exists(clone):
        raise SystemExit(f"--keep {clone}: the folder exists; give a new one")
    load_before = load_average()
    try:
        doc = run(os.path.join(clone, "repo"), args.out + ".log")
    finally:
        if not args.keep:
            shutil.rmtree(clone, ignore_errors=True)
    doc.update(
        command="python -m benchmarks.scale.main_job_time " + " ".join(argv if argv is not None else sys.argv[1:]),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine={"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform()},
        load_before=load_before,
        load_after=load_average(),
    )
    write_record(*os.path.split(args.out), doc, markdown(doc), echo=False)
    os.remove(args.out + ".log")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

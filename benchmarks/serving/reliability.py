"""Reliability suite (issue #15): crash safety of training, export and index, and the HTTP service under load,
hot reload and malformed requests. Prints a markdown record; exits 1 if an invariant is broken.

Parts (``--parts``, default all, in this order):

* ``train``   N SIGKILLs of ``ce-retrieval train`` (tiny config) at chosen moments: right when a weight checkpoint
  starts being written (``checkpoints/**/ckpt-N_temp`` or a new ``ckpt-N.*`` file), right when a
  BackupAndRestore save starts (``backup/**``), and at random times. The same command is re-run after each kill.
  Invariants: the final run exits 0 with the total step count of an uninterrupted run, and leaves 0 temporary /
  partial / orphaned checkpoint files and an empty backup folder. The final weights and metrics are compared with
  an uninterrupted run of the same seed: reported (bit-identical or max |diff|, metric by metric), not enforced,
  since a resume need not be bit-exact (see the record).
* ``export``  SIGKILLs of ``ce-retrieval export`` and ``ce-retrieval index`` (``--quick``: the same library calls
  on stand-in towers) at random moments and right at their publishing steps. Invariants after every kill: every
  version that ``layout.complete_versions`` / ``servable_versions`` lists loads, ``Searcher.load`` gets a
  version at least as new as before the kill, a half-written version is never listed, and the next export
  removes a half-published encoder folder.
* ``service`` ``ce-retrieval serve`` in a subprocess (default host) on a generated gallery (100k, ScaNN):
  requests/s and p50/p99 at concurrency 1, 8, 32 for top-k and threshold queries; the same while a new version is
  published every few seconds (0 failed requests); server RSS before/after 10,000 requests; the listening
  address must be 127.0.0.1.
* ``bad``     the malformed-request corpus of ``benchmarks/serving/bad_requests.py`` against a served export, several
  rounds: every request a 4xx with a reason, the service up afterwards, RSS flat.

    python -m benchmarks.serving.reliability                     # full run (~10 min on 2 cores, nothing else running)
    python -m benchmarks.serving.reliability --quick             # small and fast (the smoke test: train,service,bad)
    python -m benchmarks.serving.reliability --parts service,bad --gallery 100000
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from benchmarks import ROOT  # noqa: E402
from benchmarks.serving import bad_requests  # noqa: E402

TINY_OVERRIDE = (  # tests/training/tiny.py's experiment (seconds on CPU)
    "data.num_train_images=48,data.num_val_images=12,data.num_test_images=12,data.image_size=32,"
    "model.embedding_dim=16,model.text.hidden_size=16,model.text.num_layers=1,model.text.num_attention_heads=2,"
    "model.text.intermediate_size=32,model.image.image_size=32,model.image.stackwise_filters=[4,8,8,8],"
    "train.batch_size=16,train.verbose=0,evaluation.every_n_epochs=1,evaluation.distractors=0"
)
SUBPROCESS_ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"}
TEMP_MARKERS = ("_temp", ".tmp")  # TF's sharded-save folder, atomic_write / TF atomic_write_string_to_file names


@dataclasses.dataclass
class Record:
    """What a part measured: markdown lines for the record, and broken invariants (empty = pass)."""

    lines: list = dataclasses.field(default_factory=list)
    violations: list = dataclasses.field(default_factory=list)
    data: dict = dataclasses.field(default_factory=dict)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.violations.append(what)
        return ok


def _env() -> dict:
    return {**os.environ, **SUBPROCESS_ENV}


def _tree(root: str) -> list[str]:
    """Every path under ``root`` (relative), files and folders; tolerant of concurrent changes."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, n)) for n in dirnames + filenames]
    return out


def _kill_when(proc: subprocess.Popen, root: str, predicate, timeout_s: float, poll_s: float = 0.002):
    """SIGKILLs ``proc`` as soon as ``predicate(paths under root)`` returns a phase name; returns
    (phase, paths seen at the kill), or (None, []) if the process ended (or timed out) first."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        paths = _tree(root)
        phase = predicate(paths)
        if phase:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return phase, paths
        time.sleep(poll_s)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return "timeout", []
    return None, []


def _kill_after(proc: subprocess.Popen, delay_s: float) -> bool:
    """SIGKILLs ``proc`` after ``delay_s``; False if it had already ended."""
    try:
        proc.wait(timeout=delay_s)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def _fmt_s(s: float) -> str:
    return f"{s:.1f} s"


# ============================================================================================== part 1: training
def _train_cmd(model_dir: str, override: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ce_retrieval.cli",
        "train",
        "--config",
        "synthetic_demo",
        "--model_dir",
        model_dir,
        "--params_override",
        TINY_OVERRIDE,
        "--params_override",
        override,
    ]


def _new_ckpt_file(sub: str, before: set):
    """A predicate: a temp entry or a new ``ckpt-*`` entry appeared under ``<model_dir>/<sub>`` (a save began)."""

    def predicate(paths):
        for p in paths:
            if not p.startswith(sub + os.sep) or p in before:
                continue
            name = os.path.basename(p)
            if "_temp" in p or name.startswith("ckpt-"):
                return "during write (temp folder present)" if "_temp" in p else "right after a ckpt file appeared"
        return None

    return predicate


def checkpoint_problems(model_dir: str) -> list[str]:
    """Temporary, partial or orphaned files left in a finished model dir (a clean run has none)."""
    problems = []
    for p in _tree(model_dir):
        name = os.path.basename(p)
        if any(m in name for m in TEMP_MARKERS) or name.startswith(".tmp-"):
            problems.append(f"temporary: {p}")
    for sub in ("checkpoints/latest", "checkpoints/best", "backup"):
        d = os.path.join(model_dir, sub)
        if not os.path.isdir(d):
            continue
        files = [f for f in os.listdir(d) if f.startswith("ckpt-")]
        prefixes = {f.split(".")[0] for f in files if "_temp" not in f}  # temp folders are reported above
        listed = set()
        state = os.path.join(d, "checkpoint")
        if os.path.exists(state):
            listed = set(re.findall(r'all_model_checkpoint_paths: "([^"]+)"', open(state).read()))
            listed = {os.path.basename(x) for x in listed}
        for prefix in sorted(prefixes):
            has_index = f"{prefix}.index" in files
            shards = [f for f in files if f.startswith(prefix + ".data-")]
            total = int(shards[0].rsplit("-of-", 1)[1]) if shards else 0
            if not has_index or not shards or len(shards) != total:
                problems.append(f"partial checkpoint: {sub}/{prefix}")
            elif prefix not in listed:
                problems.append(f"orphaned checkpoint (not in the state file): {sub}/{prefix}")
        if sub == "backup" and prefixes:
            problems.append(f"backup left after a finished run: {sub}")
    backup_chief = os.path.join(model_dir, "backup", "chief")
    if os.path.isdir(backup_chief) and os.listdir(backup_chief):
        problems.append("backup/chief not empty after a finished run")
    return problems


def _checkpoint_arrays(model_dir: str) -> dict:
    import tensorflow as tf

    path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints", "latest"))
    reader = tf.train.load_checkpoint(path)
    keys = [k for k in reader.get_variable_to_shape_map() if k.startswith("model/") and "optimizer" not in k]
    return {k: reader.get_tensor(k) for k in keys}


def part_train(work: str, kills: int, quick: bool, seed: int, train_override: str = "") -> Record:
    """SIGKILL a tiny training run ``kills`` times (checkpoint write, backup write, random), resume, compare.
    ``train_override``: more config overrides for every run (e.g. ``train.strategy=mirrored``). The resumed run
    must start from its backup (``resumed_from_step`` > 0, and say so), not from step 0."""
    rec = Record()
    rng = random.Random(seed)
    epochs, spe = (2, 4) if quick else (3, 8)
    override = f"train.epochs={epochs},train.steps_per_epoch={spe},train.backup_every_steps=2,train.seed={seed}"
    override += f",{train_override}" if train_override else ""
    ref_dir, run_dir = os.path.join(work, "train_reference"), os.path.join(work, "train_killed")
    for d in (ref_dir, run_dir):
        shutil.rmtree(d, ignore_errors=True)

    ref, ref_err, ref_seconds = None, b"", 0.0
    if not quick:  # the uninterrupted reference first: its duration is a clean figure and sets the random delays
        t0 = time.perf_counter()
        ref = subprocess.run(
            _train_cmd(ref_dir, override), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900
        )
        ref_err, ref_seconds = ref.stderr, time.perf_counter() - t0
    targets = ["checkpoint", "backup", "random"]
    plan = [targets[i % len(targets)] for i in range(kills)]
    if quick:
        plan = [t for t in plan if t != "random"] or ["checkpoint"]
    rows = []
    for i, target in enumerate(plan):
        before = set(_tree(run_dir)) if os.path.isdir(run_dir) else set()
        start = time.perf_counter()
        proc = subprocess.Popen(
            _train_cmd(run_dir, override), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if target == "random":
            delay = rng.uniform(0.15 * ref_seconds, 0.6 * ref_seconds)  # resumed runs are shorter
            phase = f"random at {delay:.1f} s" if _kill_after(proc, delay) else None
            seen = _tree(run_dir) if os.path.isdir(run_dir) else []
            if phase and any("_temp" in p for p in seen):
                phase += " (a checkpoint was being written)"
        else:
            sub = "checkpoints" if target == "checkpoint" else "backup"
            phase, seen = _kill_when(proc, run_dir, _new_ckpt_file(sub, before), timeout_s=900)
            phase = f"{sub}: {phase}" if phase else None
        left = [p for p in seen if any(m in os.path.basename(p) for m in TEMP_MARKERS)]
        rows.append(
            f"| {i + 1} | {target} | {phase or 'ended before the kill'} | {_fmt_s(time.perf_counter() - start)} | "
            f"{len(left)} |"
        )
        if os.path.exists(os.path.join(run_dir, "train_summary.json")):
            # it finished: the chain is over. Re-running `train` on a finished model_dir would retrain from
            # scratch (BackupAndRestore deletes its backup at the end), which says nothing about resuming.
            break
    start = time.perf_counter()
    if os.path.exists(os.path.join(run_dir, "train_summary.json")):
        final = subprocess.CompletedProcess([], 0, b"", b"")
    else:
        final = subprocess.run(_train_cmd(run_dir, override), env=_env(), capture_output=True, timeout=900)
    final_seconds = time.perf_counter() - start
    rec.check(ref is None or ref.returncode == 0, f"reference training failed: {ref_err.decode()[-1500:]}")
    rec.check(final.returncode == 0, f"resumed training failed: {final.stderr.decode()[-1500:]}")

    rec.lines += [
        "### Training: SIGKILL and resume",
        "",
        f"Tiny config (`tests/training/tiny.py`), {epochs} epochs x {spe} steps, backup every 2 steps, "
        f"seed {seed}{f' ({train_override})' if train_override else ''}; "
        + ("no reference run (--quick)" if quick else f"uninterrupted reference run {_fmt_s(ref_seconds)}")
        + (
            f"; final resumed run {_fmt_s(final_seconds)}."
            if final.args
            else "; the last killed run ended before its kill, so it is the final (resumed) run."
        ),
        "",
        "| kill | aimed at | moment hit | process lived | temp entries at the kill |",
        "|---:|---|---|---:|---:|",
        *rows,
        "",
    ]
    if final.returncode != 0 or (ref is not None and ref.returncode != 0):
        return rec
    summary = json.load(open(os.path.join(run_dir, "train_summary.json")))
    problems = checkpoint_problems(run_dir)
    rec.check(summary["steps"] == epochs * spe, f"step count {summary['steps']} != {epochs * spe}")
    rec.check(not problems, f"files left after resume: {problems}")
    resumed_from = summary.get("resumed_from_step", 0)
    said = b"resumed from the backup at step" in (final.stdout or b"")
    if final.args:  # the final run followed a kill: it must continue from the backup and say so
        rec.check(resumed_from > 0 and said, f"the run after the kill started at step {resumed_from}, not its backup")
    rec.data.update(
        steps=summary["steps"],
        leftovers=len(problems),
        resumed_from_step=resumed_from,
        said_resumed=said,
        num_replicas=summary.get("num_replicas"),
    )
    resumed = f"resumed from step {resumed_from}" if final.args else "no resume"
    if ref is None:
        rec.lines += [
            f"Final run: exit 0, **{summary['steps']} steps** (expected {epochs * spe}), {resumed}; "
            f"**{len(problems)} temporary / partial / orphaned files** left.",
            "",
        ]
        return rec
    ref_summary = json.load(open(os.path.join(ref_dir, "train_summary.json")))
    rec.check(
        summary["steps"] == ref_summary["steps"] == epochs * spe,
        f"step count {summary['steps']} != uninterrupted {ref_summary['steps']} (expected {epochs * spe})",
    )
    ref_problems = checkpoint_problems(ref_dir)
    rec.check(not ref_problems, f"files left by the uninterrupted run: {ref_problems}")
    a, b = _checkpoint_arrays(run_dir), _checkpoint_arrays(ref_dir)
    rec.check(set(a) == set(b), "the resumed and the reference checkpoints hold different variables")
    diffs = {k: float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) if a[k].size else 0.0 for k in a if k in b}
    worst = max(diffs, key=diffs.get, default="-")
    max_diff = diffs.get(worst, 0.0)
    identical = all(np.array_equal(a[k], b[k]) for k in a if k in b)
    metric_rows = []
    for key in sorted(k for k in summary["history"] if k.startswith("val_") or k == "loss"):
        if key in ref_summary["history"] and summary["history"][key]:
            x, y = summary["history"][key][-1], ref_summary["history"][key][-1]
            metric_rows.append(f"| {key} (last epoch) | {x:.6g} | {y:.6g} | {abs(x - y):.3g} |")
    rec.lines += [
        f"Final run: exit 0, **{summary['steps']} steps** (uninterrupted: {ref_summary['steps']}), {resumed}; "
        f"**{len(problems)} temporary / partial / orphaned files** left (uninterrupted run: {len(ref_problems)}).",
        "",
        f"Final weights vs the uninterrupted run: {'bit-identical' if identical else 'not bit-identical'}, "
        f"max |diff| {max_diff:.3g} ({worst}) over {len(diffs)} model variables (optimizer state excluded).",
        "",
        "| metric | resumed | uninterrupted | abs diff |",
        "|---|---:|---:|---:|",
        *metric_rows,
        "",
    ]
    rec.data.update(identical=identical, max_weight_diff=max_diff, model=ref_dir)
    return rec


# ====================================================================================== part 2: export and index
WORKER_EXPORT, WORKER_INDEX = "export", "index"


def _worker(kind: str, export_dir: str, gallery: int) -> None:
    """``--worker export|index``: the library's export / index calls on stand-in towers (the quick mode's
    substitute for the CLI commands, which need a trained model and take ~40 s each)."""
    from benchmarks.common.exports import stand_in_export
    from ce_retrieval.build.index import build_index

    if kind == WORKER_EXPORT:
        stand_in_export(export_dir, dim=32)
    else:
        x = np.random.default_rng(0).normal(size=(gallery, 32)).astype(np.float32)
        build_index(x / np.linalg.norm(x, axis=1, keepdims=True), np.arange(gallery), export_dir, None)


def _export_cmd(kind: str, export_dir: str, model_dir: str | None, gallery: int) -> list[str]:
    if model_dir is None:
        return [
            sys.executable,
            "-m",
            __spec__.name,
            "--worker",
            kind,
            "--export_dir",
            export_dir,
            "--gallery",
            str(gallery),
        ]
    if kind == WORKER_EXPORT:
        return [
            sys.executable,
            "-m",
            "ce_retrieval.cli",
            "export",
            "--model_dir",
            model_dir,
            "--export_dir",
            export_dir,
        ]
    return [sys.executable, "-m", "ce_retrieval.cli", "index", "--export_dir", export_dir, "--images", "test"]


def export_state(export_dir: str) -> dict:
    """What readers see: complete / servable versions, numeric folders outside them, hidden temporaries."""
    from ce_retrieval.search import layout

    numeric = {
        part: layout.versions(os.path.join(export_dir, part))
        for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER, layout.INDEX)
    }
    complete, servable = layout.complete_versions(export_dir), layout.servable_versions(export_dir)
    stray = [
        f"{part}/{v}"
        for part, vs in numeric.items()
        for v in vs
        if v not in (servable if part == layout.INDEX else complete)
    ]
    temps = [p for p in _tree(export_dir) if os.path.basename(p).startswith(".tmp-") or ".tmp" in os.path.basename(p)]
    temps = [p for p in temps if not any(q.startswith(".tmp-") for q in p.split(os.sep)[:-1])]  # top-level ones
    return {"complete": complete, "servable": servable, "stray": stray, "temps": temps}


def _loads(export_dir: str, version: int | None) -> tuple[bool, int | None, str]:
    from ce_retrieval.serve.searcher import Searcher

    try:
        s = Searcher.load(export_dir, version)
        s.search(["a red circle"], k=3)
        return True, s.version, ""
    except Exception as exc:  # reported as a violation
        return False, None, f"{type(exc).__name__}: {exc}"


def part_export(work: str, kills: int, quick: bool, seed: int, model_dir: str | None) -> Record:
    """SIGKILL export / index at random moments and at their publishing steps; check what readers see."""
    rec = Record()
    rng = random.Random(seed + 1)
    export_dir = os.path.join(work, "export_killed")
    shutil.rmtree(export_dir, ignore_errors=True)
    gallery = 500
    timings = {}
    for kind in (WORKER_EXPORT, WORKER_INDEX):  # a first servable version, and how long each step takes
        start = time.perf_counter()
        done = subprocess.run(
            _export_cmd(kind, export_dir, model_dir, gallery), env=_env(), capture_output=True, timeout=900
        )
        timings[kind] = time.perf_counter() - start
        if not rec.check(done.returncode == 0, f"first {kind} failed: {done.stderr.decode()[-1500:]}"):
            return rec
    # moments to hit: random, while the SavedModel / index is written (temp folder), between the two encoder
    # renames (text_encoder/<v> published, image_encoder/<v> not yet), and right after the index appears
    plan = ["export:random", "export:saving", "export:between renames", "index:random", "index:writing"]
    plan = [plan[i % len(plan)] for i in range(kills)]
    rows = []
    for i, aim in enumerate(plan):
        kind, moment = aim.split(":")
        if kind == WORKER_INDEX:  # index needs a complete version without an index: export one first
            st = export_state(export_dir)
            if not [v for v in st["complete"] if v not in st["servable"]]:
                subprocess.run(
                    _export_cmd(WORKER_EXPORT, export_dir, model_dir, gallery),
                    env=_env(),
                    capture_output=True,
                    timeout=900,
                )
        before = export_state(export_dir)
        ok_before, served_before, _ = _loads(export_dir, None)
        start = time.perf_counter()
        proc = subprocess.Popen(
            _export_cmd(kind, export_dir, model_dir, gallery),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if moment == "random":
            delay = rng.uniform(0.2, timings[kind])
            hit = f"random at {delay:.1f} s" if _kill_after(proc, delay) else None
        else:
            known = set(_tree(export_dir))

            def predicate(paths, moment=moment, known=known, kind=kind):
                new = [p for p in paths if p not in known]
                if moment in ("saving", "writing"):
                    return "temp folder being written" if any(".tmp-" in p for p in new) else None
                published = [p for p in new if re.fullmatch(r"text_encoder/\d+", p)]
                return "text_encoder/<v> just published" if published else None

            hit, _ = _kill_when(proc, export_dir, predicate, timeout_s=900, poll_s=0.0005)
        after = export_state(export_dir)
        ok, served, err = _loads(export_dir, None)
        rec.check(ok, f"kill {i + 1} ({aim}): newest servable version does not load: {err}")
        rec.check(
            not ok_before or (served or 0) >= (served_before or 0),
            f"kill {i + 1}: served version went back from {served_before} to {served}",
        )
        for v in after["complete"]:  # every listed version must load and be consistent
            good, _, err = _loads(export_dir, v) if v in after["servable"] else (True, v, "")
            rec.check(good, f"kill {i + 1}: listed version {v} does not load: {err}")
        new_stray = sorted(set(after["stray"]) - set(before["stray"]))
        rows.append(
            f"| {i + 1} | {kind} | {moment} | {hit or 'ended before the kill'} | "
            f"{_fmt_s(time.perf_counter() - start)} | {served_before} -> {served} | "
            f"{', '.join(new_stray) or '-'} | {len(after['temps'])} |"
        )
    # after the kills a normal export + index still publishes a new, servable version
    for kind in (WORKER_EXPORT, WORKER_INDEX):
        done = subprocess.run(
            _export_cmd(kind, export_dir, model_dir, gallery), env=_env(), capture_output=True, timeout=900
        )
        rec.check(done.returncode == 0, f"{kind} after the kills failed: {done.stderr.decode()[-1500:]}")
    final = export_state(export_dir)
    ok, served, err = _loads(export_dir, None)
    encoders_stray = [p for p in final["stray"] if not p.startswith("index/")]
    rec.check(not encoders_stray, f"half-published encoder versions left after a new export: {encoders_stray}")
    rec.check(ok and served == max(final["servable"], default=None), f"final export does not serve: {err}")
    rec.check(
        not final["temps"], f"temporary folders of killed writers left after a new export and index: {final['temps']}"
    )
    what = (
        "the CLI commands `ce-retrieval export` / `index --images test`"
        if model_dir
        else ("the library calls `export_encoders` / `build_index` on stand-in towers (--quick)")
    )
    rec.lines += [
        "### Export and index: SIGKILL",
        "",
        f"Killed: {what}; one uninterrupted export took {_fmt_s(timings[WORKER_EXPORT])}, one index "
        f"{_fmt_s(timings[WORKER_INDEX])}. After every kill: every listed version loads and answers, and the served "
        "version never goes back.",
        "",
        "| kill | command | aimed at | moment hit | lived | served version before -> after | new numeric folders "
        "outside any complete version | hidden temp folders now |",
        "|---:|---|---|---|---:|---|---|---:|",
        *rows,
        "",
        f"Afterwards a normal export + index published version {served} and it serves "
        f"(complete versions {final['complete']}, servable {final['servable']}). Numeric folders outside a complete "
        f"version: {final['stray'] or 'none'}; a half-published one (a kill between the two renames) is never "
        "listed by `complete_versions` / `servable_versions`, so never loaded by the Searcher or the service, "
        "and the next export removes it "
        "(TF Serving would serve it) without reusing its number. Hidden "
        f"`.tmp-*` folders left after that export and index: {len(final['temps'])} (a SIGKILL cannot clean up, so "
        "a killed writer's temporary folder stays, ignored by every reader and by TF Serving, until the next writer "
        "of the same place removes it; the table above counts them right after each kill).",
        "",
    ]
    rec.data.update(final)
    return rec


# ============================================================================================= part 3: service
@contextlib.contextmanager
def server_process(export_dir: str, *extra: str, startup_timeout_s: float = 300.0):
    """``ce-retrieval serve`` (default host) in a subprocess on a free port; yields (pid, host, port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "ce_retrieval.cli", "serve", "--export_dir", export_dir, "--port", str(port), *extra]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"the service did not start: {log.read().decode()[-2000:]}")
            with contextlib.suppress(OSError):
                status, _ = _request("127.0.0.1", port, "GET", "/healthz", None, timeout=5)
                if status == 200:
                    break
            time.sleep(0.2)
        yield proc, "127.0.0.1", port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _request(host, port, method, path, body, timeout=30.0, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        if own:
            conn.close()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def listen_addresses(pid: int) -> list[str]:
    import psutil

    return sorted(
        {f"{c.laddr.ip}" for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    )


WORDS = "a the dog cat man woman child red blue green runs sits stands on under near big small tree car beach".split()


def load(
    host: str,
    port: int,
    bodies: list[bytes],
    concurrency: int,
    duration_s: float | None = None,
    total: int | None = None,
) -> dict:
    """``concurrency`` threads, one keep-alive connection each, posting ``bodies`` round robin for ``duration_s``
    (or until ``total`` requests); latencies of 200s, and every other outcome counted as a failure."""
    lat, failures, versions, lock = [], [], set(), threading.Lock()
    stop = threading.Event()
    counter = iter(range(10**12))

    def client(i):
        conn = http.client.HTTPConnection(host, port, timeout=60)
        while not stop.is_set():
            with lock:
                n = next(counter)
            if total is not None and n >= total:
                break
            body = bodies[n % len(bodies)]
            t = time.perf_counter()
            try:
                status, payload = _request(host, port, "POST", "/search", body, conn=conn)
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=60)
                continue
            dt = time.perf_counter() - t
            with lock:
                if status == 200:
                    lat.append(dt)
                    versions.add(json.loads(payload)["version"])
                else:
                    failures.append(f"{status}: {payload[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    if duration_s is not None:
        time.sleep(duration_s)
        stop.set()
    for th in threads:
        th.join(timeout=120)
    elapsed = time.perf_counter() - t0
    ms = 1e3 * np.array(lat) if lat else np.array([np.nan])
    return {
        "ok": len(lat),
        "failed": len(failures),
        "failures": failures[:5],
        "seconds": elapsed,
        "rps": len(lat) / elapsed,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "versions": sorted(versions),
    }


def _threshold_for_hits(host: str, port: int, bodies: list[bytes], hits: int) -> float:
    """A threshold that gives about ``hits`` hits per query: the median score of the ``hits``-th result."""
    scores = []
    for b in bodies:
        body = json.dumps({**json.loads(b), "k": hits}).encode()
        result = json.loads(_request(host, port, "POST", "/search", body)[1])["results"][0]["hits"]
        scores.append(result[-1]["score"])
    return round(float(np.median(scores)), 4)


def make_gallery_export(root: str, gallery: int) -> dict:
    """The service benchmark's throw-away export: hashed bag-of-words text tower (d = 128), generated gallery."""
    from benchmarks.serving import service as service_bench

    os.makedirs(root, exist_ok=True)
    start = time.perf_counter()
    service_bench.make_export(root, gallery)
    return {"seconds": time.perf_counter() - start}


def publish_copy(export_dir: str, source_version: int, version: int) -> None:
    """Publishes ``version`` as a copy of ``source_version`` through the atomic publishing path (encoders first,
    index last, as ``export`` + ``index`` do): a cheap stand-in for a new model every few seconds."""
    from ce_retrieval.search import layout
    from ce_retrieval.utils.atomic import atomic_directory

    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER, layout.INDEX):
        src = layout.version_dir(export_dir, part, source_version)
        with atomic_directory(layout.version_dir(export_dir, part, version)) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True)


def part_service(
    work: str,
    quick: bool,
    gallery: int,
    duration_s: float,
    publish_every_s: float,
    rss_requests: int,
    bad_rounds: int | None = None,
) -> Record:
    """Load, hot reload and RSS figures of ``ce-retrieval serve``; with ``bad_rounds`` the malformed corpus is
    then sent to the same server (its record is in ``data["bad"]``), which saves a server start."""
    rec = Record()
    root = os.path.join(work, f"export_gallery_{gallery}")
    if not os.path.isdir(os.path.join(root, "index", "1")):
        shutil.rmtree(root, ignore_errors=True)
        built = make_gallery_export(root, gallery)
        build_line = f"export + index of the {gallery:,}-item gallery built in {_fmt_s(built['seconds'])}"
    else:
        build_line = f"existing {gallery:,}-item gallery export reused ({root})"
    for part in ("text_encoder", "image_encoder", "index"):  # versions left by an earlier publishing run
        for name in os.listdir(os.path.join(root, part)):
            if name != "1":
                shutil.rmtree(os.path.join(root, part, name), ignore_errors=True)
    rng = np.random.default_rng(1)
    captions = [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) for _ in range(2000)]
    topk = [json.dumps({"texts": [c], "k": 10}).encode() for c in captions]
    rows = []
    totals = {"ok": 0, "failed": 0}  # summed over every row of the table (the summary quotes it)
    with server_process(root, "--reload_interval", str(max(0.5, publish_every_s / 3)), "--max_concurrency", "8") as (
        proc,
        host,
        port,
    ):
        addrs = listen_addresses(proc.pid)
        rec.check(addrs == ["127.0.0.1"], f"the service listens on {addrs}, expected only 127.0.0.1")
        load(host, port, topk[:100], 2, total=100)  # warm up
        threshold = _threshold_for_hits(host, port, topk[:20], 50)
        thresh = [json.dumps({"texts": [c], "threshold": threshold, "limit": 100}).encode() for c in captions]
        hits = [
            len(json.loads(_request(host, port, "POST", "/search", b)[1])["results"][0]["hits"]) for b in thresh[:20]
        ]
        for name, bodies in (("top-k (k = 10)", topk), ("threshold, limit 100", thresh)):
            for conc in (1, 8, 32):
                r = load(host, port, bodies, conc, duration_s=duration_s)
                rec.check(r["failed"] == 0, f"{name} at concurrency {conc}: {r['failed']} failed: {r['failures']}")
                totals["ok"], totals["failed"] = totals["ok"] + r["ok"], totals["failed"] + r["failed"]
                rows.append(
                    f"| {name} | {conc} | steady | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
                    f"{r['ok']} | {r['failed']} | {r['versions']} |"
                )
        # a new version every publish_every_s seconds, under load
        stop, published, pub_errors = threading.Event(), [], []

        def publisher():
            while not stop.wait(publish_every_s):
                v = (published[-1] if published else 1) + 1
                try:
                    publish_copy(root, 1, v)
                    published.append(v)
                    for part in ("text_encoder", "image_encoder", "index"):  # keep the disk bounded
                        old = os.path.join(root, part, str(v - 3))
                        if v - 3 > 1 and os.path.isdir(old):
                            shutil.rmtree(old, ignore_errors=True)
                except Exception as exc:
                    pub_errors.append(repr(exc))

        # --quick: one row, long enough for a reload under load on a busy machine (loading takes ~1-2 s)
        pub_rows = [("top-k (k = 10)", topk, 8)] + ([] if quick else [("threshold, limit 100", thresh, 32)])
        for name, bodies, conc in pub_rows:
            th = threading.Thread(target=publisher, daemon=True)
            stop.clear()
            th.start()
            r = load(host, port, bodies, conc, duration_s=max(duration_s, 3 * publish_every_s, 5.0))
            stop.set()
            th.join()
            rec.check(r["failed"] == 0, f"{name} while publishing: {r['failed']} failed: {r['failures']}")
            rec.check(len(r["versions"]) >= 2, f"{name} while publishing: only versions {r['versions']} answered")
            totals["ok"], totals["failed"] = totals["ok"] + r["ok"], totals["failed"] + r["failed"]
            rows.append(
                f"| {name} | {conc} | new version every {publish_every_s:g} s | {r['rps']:.0f} | "
                f"{r['p50']:.1f} | {r['p99']:.1f} | {r['ok']} | {r['failed']} | "
                f"{r['versions'][0]}..{r['versions'][-1]} ({len(r['versions'])}) |"
            )
        rec.check(not pub_errors, f"publishing failed: {pub_errors[:3]}")
        rss0 = rss_mb(proc.pid)
        r = load(host, port, topk, 8, total=rss_requests)  # top-k: threshold queries are ~10x slower
        rss1 = rss_mb(proc.pid)
        rec.check(r["failed"] == 0, f"RSS run: {r['failed']} failed")
        alive = _request(host, port, "GET", "/healthz", None)[0] == 200
        rec.check(alive, "the service is down after the load")
        if bad_rounds is not None:
            rec.data["bad"] = bad_on_server(proc, host, port, bad_rounds)
    rec.lines += [
        "### Service: throughput, latency, hot reload",
        "",
        f"`ce-retrieval serve` in its own process (default host; listens on {', '.join(addrs)}), "
        f"--max_concurrency 8; clients: threads with one keep-alive connection each, in the benchmark process "
        f"(sharing the {os.cpu_count()} CPUs with the server). {build_line}. {duration_s:g} s per steady row. "
        f"Threshold queries (threshold {threshold:.3f}: the median 50th score) return {np.mean(hits):.0f} hits "
        "on average (capped at 100).",
        "",
        "| query | concurrency | versions | requests/s | p50 ms | p99 ms | answered | failed | versions answering |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"Answered in all (the sum of the column): {totals['ok']:,} requests, {totals['failed']} failed.",
        "",
        f"Server RSS before / after {rss_requests:,} more requests (top-k, concurrency 8): "
        f"**{rss0:.0f} MB -> {rss1:.0f} MB** ({rss1 - rss0:+.0f} MB); versions published in this process's "
        f"lifetime: {len(published) + 1}.",
        "",
    ]
    rec.data.update(rss_before=rss0, rss_after=rss1)
    return rec


# ======================================================================================== part 4: bad requests
def part_bad(work: str, rounds: int, gallery: int) -> Record:
    """The malformed-request corpus, ``rounds`` + 1 times, against ``ce-retrieval serve`` on the gallery export."""
    root = os.path.join(work, f"export_gallery_{gallery}")
    if not os.path.isdir(os.path.join(root, "index", "1")):
        shutil.rmtree(root, ignore_errors=True)
        make_gallery_export(root, gallery)
    with server_process(root, "--reload_interval", "0") as (proc, host, port):
        return bad_on_server(proc, host, port, rounds)


def bad_on_server(proc: subprocess.Popen, host: str, port: int, rounds: int) -> Record:
    """Sends the corpus ``rounds`` + 1 times to a running ``ce-retrieval serve``; checks 4xx + reason, up, RSS."""
    rec = Record()
    cases = bad_requests.corpus()
    rec.check(listen_addresses(proc.pid) == ["127.0.0.1"], "the service does not listen on 127.0.0.1 only")
    url = f"http://{host}:{port}"
    first = bad_requests.send_all(url, cases)  # warm-up round: allocations that happen once
    rss0 = rss_mb(proc.pid)
    start = time.perf_counter()
    outcomes = list(first)
    for _ in range(rounds):
        outcomes += bad_requests.send_all(url, cases)
    seconds = time.perf_counter() - start
    rss1 = rss_mb(proc.pid)
    health = _request(host, port, "GET", "/healthz", None)[0]
    search = _request(host, port, "POST", "/search", b'{"texts": ["a dog"], "k": 3}')[0]
    bad = [o for o in outcomes if not o.ok]
    rec.check(not bad, f"not a 4xx with a reason: {[(o.case.name, o.status, o.reason[:80]) for o in bad[:10]]}")
    rec.check(health == 200 and search == 200, f"service not up after the corpus (healthz {health}, search {search})")
    rec.check(rss1 - rss0 < 50, f"server RSS grew {rss1 - rss0:.0f} MB over {rounds} rounds of the corpus")
    by_status: dict[int | None, int] = {}
    for o in first:
        by_status[o.status] = by_status.get(o.status, 0) + 1
    worst = max(first, key=lambda o: o.seconds)
    rec.lines += [
        "### Malformed requests",
        "",
        f"{len(cases)} malformed requests (`benchmarks/serving/bad_requests.py`), {rounds + 1} rounds against "
        f"`ce-retrieval serve` (default host, listening on 127.0.0.1 only): **{len(bad)} answered other than 4xx "
        f"with a reason**; statuses {', '.join(f'{k}: {v}' for k, v in sorted(by_status.items(), key=str))} "
        f"(one round); slowest answer {1e3 * worst.seconds:.0f} ms ({worst.case.name}); "
        f"{rounds} rounds in {_fmt_s(seconds)}. Afterwards /healthz {health}, a valid search {search}. "
        f"Server RSS {rss0:.0f} MB -> {rss1:.0f} MB ({rss1 - rss0:+.1f} MB).",
        "",
        "| request | status | reason |",
        "|---|---:|---|",
        *[f"| {o.case.name} | {o.status} | {o.reason[:70].replace('|', '/')} |" for o in first],
        "",
    ]
    rec.data.update(outcomes=len(outcomes), not_ok=len(bad), rss_growth=rss1 - rss0)
    return rec


# ================================================================================================= main
def run(
    parts: list[str],
    quick: bool,
    work: str,
    *,
    kills: int,
    seed: int,
    gallery: int,
    export_kills: int | None = None,
    duration_s: float,
    publish_every_s: float,
    rss_requests: int,
    bad_rounds: int,
    train_override: str = "",
    print_fn=print,
) -> list[Record]:
    """Runs the chosen parts in order; returns their records (the markdown is printed part by part)."""
    os.makedirs(work, exist_ok=True)
    started = time.perf_counter()
    print_fn(f"## Reliability record ({'quick' if quick else 'full'}; {os.cpu_count()} CPUs)\n")
    done: dict[str, Record] = {}

    def one(part: str) -> None:
        t = time.perf_counter()
        if part == "train":
            rec = part_train(work, kills, quick, seed, train_override)
        elif part == "export":
            model_dir = None
            if not quick:  # the CLI needs a trained model: the training part's reference, or a tiny run
                model_dir = done["train"].data.get("model") if "train" in done else None
                if model_dir is None:
                    model_dir = os.path.join(work, "train_for_export")
                    if not os.path.exists(os.path.join(model_dir, "train_summary.json")):
                        subprocess.run(
                            _train_cmd(model_dir, "train.epochs=1,train.steps_per_epoch=4"),
                            env=_env(),
                            check=True,
                            capture_output=True,
                            timeout=900,
                        )
            rec = part_export(work, export_kills or kills, quick, seed, model_dir)
        elif part == "service":
            shared = quick and "bad" in parts  # --quick: the corpus goes to the service part's server
            rec = part_service(
                work, quick, gallery, duration_s, publish_every_s, rss_requests, bad_rounds if shared else None
            )
            if shared:
                done["bad"] = rec.data.pop("bad")
                done["bad"].lines.append(
                    f"(bad: on the service part's server; invariants "
                    f"{'all hold' if not done['bad'].violations else 'BROKEN'})\n"
                )
        elif part == "bad":
            if part in done:  # already sent by the service part
                return
            rec = part_bad(work, bad_rounds, gallery)
        else:
            raise ValueError(f"unknown part {part!r}")
        rec.lines.append(
            f"({part}: {_fmt_s(time.perf_counter() - t)}; invariants "
            f"{'all hold' if not rec.violations else 'BROKEN: ' + '; '.join(rec.violations)})\n"
        )
        done[part] = rec

    def guarded(part: str) -> None:
        try:
            one(part)
        except Exception as exc:  # a part that crashes is a broken invariant, not a lost record
            done[part] = Record(lines=[f"### {part}: crashed: {type(exc).__name__}: {exc}\n"], violations=[repr(exc)])

    # --quick: the crash parts (subprocess-bound) run alongside the service parts, to stay short
    background = [p for p in parts if quick and p in ("train", "export")]
    threads = [threading.Thread(target=guarded, args=(p,), daemon=True) for p in background]
    for th in threads:
        th.start()
    for part in parts:
        if part not in background:
            if part not in done:
                guarded(part)
            print_fn("\n".join(done[part].lines))
    for th in threads:
        th.join()
    for part in background:
        print_fn("\n".join(done[part].lines))
    records = [done[p] for p in parts]
    broken = [v for r in records for v in r.violations]
    print_fn(
        f"**{'All invariants hold' if not broken else f'{len(broken)} invariant(s) broken'}** "
        f"({_fmt_s(time.perf_counter() - started)} in all)."
    )
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="train,export,service,bad", help="comma-separated: train,export,service,bad")
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (the smoke test)")
    ap.add_argument("--workdir", default=None, help="kept between runs (the 100k gallery export is reused)")
    ap.add_argument("--kills", type=int, default=None, help="SIGKILLs of training (default 5, quick 1)")
    ap.add_argument("--export_kills", type=int, default=None, help="SIGKILLs of export/index (default 4, quick 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train_override", default="", help="more overrides for the training runs (e.g. a strategy)")
    ap.add_argument("--gallery", type=int, default=None, help="service gallery size (default 100000, quick 2000)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per load row (default 6, quick 0.5)")
    ap.add_argument("--publish_every", type=float, default=None, help="seconds between versions (default 3)")
    ap.add_argument("--rss_requests", type=int, default=None, help="requests between RSS readings (default 10000)")
    ap.add_argument("--bad_rounds", type=int, default=None, help="rounds of the malformed corpus (default 5)")
    ap.add_argument("--worker", choices=[WORKER_EXPORT, WORKER_INDEX], help=argparse.SUPPRESS)
    ap.add_argument("--export_dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.export_dir, args.gallery or 500)
        return 0
    q = args.quick
    work = args.workdir or tempfile.mkdtemp(prefix="ce_reliability_")
    records = run(
        [p.strip() for p in args.parts.split(",") if p.strip()],
        q,
        os.path.abspath(work),
        kills=args.kills if args.kills is not None else (1 if q else 5),
        seed=args.seed,
        export_kills=args.export_kills if args.export_kills is not None else (1 if q else 4),
        gallery=args.gallery or (2000 if q else 100_000),
        duration_s=args.duration or (0.5 if q else 6.0),
        publish_every_s=args.publish_every or (0.5 if q else 3.0),
        rss_requests=args.rss_requests or (300 if q else 10_000),
        bad_rounds=args.bad_rounds if args.bad_rounds is not None else (1 if q else 5),
        train_override=args.train_override,
    )
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.violations for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())

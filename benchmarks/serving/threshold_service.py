"""Threshold vs top-k queries through the HTTP service (issue #23), on the demo model's real gallery and on a
generated 100k gallery.

1. **The main job.** ``python -m ce_retrieval.cli demo --workdir W`` (what ``bash scripts/main.sh`` runs), timed:
   the wall time of the command and the seconds its own ``W/record.json`` states. With ``--workdir W`` holding a
   finished demo run (``record.json`` and a servable index) that run is reused and not timed again.
2. **The demo's gallery.** ``ce-retrieval serve`` on ``W/export`` in its own process (as
   ``benchmarks/serving/reliability.py``: default host, ``--max_concurrency 8``, no reload), driven by client threads
   with one keep-alive connection each (``reliability.load``), one caption per request (the test split's
   captions), for ``--duration`` seconds per row at concurrency 1 and 8:

   * top-k, ``{"k": 10}``;
   * threshold, ``{"precision": p}``: the calibrated threshold for precision 0.9 from the manifest (0.5 when the
     validation split reached no 0.9), searched the index's default way (approximate where its build measured the
     set recall, ``threshold_search`` in the manifest; exact for a brute-force index, i.e. below 20,000 items);
   * the same with ``"exact": true``;
   * ``{"min_probability": 0.9}`` (0.8 or 0.5 when the map reaches no 0.9).

   Per mode, before the load, one request per caption for the first ``--hit_queries`` captions: mean, median and
   largest number of hits, answers cut at ``--max_results``, the share of threshold responses flagged exact (each
   result's ``answer``, issue #32) and the set recall the approximate ones promise, and the set recall of the
   default threshold answers against the exact ones (over the answers not cut). Every request that is not a 200
   counts as failed.
3. **A generated gallery** (``--gallery``, default 100,000; 0 skips it): the hard clustered gallery of
   ``benchmarks/serving/threshold_search.py`` behind the stand-in export (``benchmarks/common/exports.py``: a hashed
   bag-of-words text tower, d = 128), with stand-in calibration from generated captions (not the load's): the
   "precision 0.9" threshold where the median caption has 100 hits, a probability map reaching 0.9 where it has 30.
   Same rows as 2. A ScaNN index at this size, so the default threshold search is the approximate one when its build
   met the set-recall target.

    python -m benchmarks.serving.threshold_service                          # demo (~6.5 min) + both galleries (~3 min)
    python -m benchmarks.serving.threshold_service --workdir runs/demo      # reuse a finished demo run

Writes ``<out>/threshold_service.json`` and ``.md`` (command, machine, load average during the run, date); exits
1 when a request failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from benchmarks import RESULTS  # noqa: E402
from benchmarks.common.machine import LoadSampler, host, load_average  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from benchmarks.serving import reliability  # noqa: E402  (server_process, load)
from ce_retrieval.search import layout  # noqa: E402

CONCURRENCY = (1, 8)
PRECISION_LEVELS = ("0.9", "0.5")  # the first one calibrated is used
PROBABILITY_LEVELS = (0.9, 0.8, 0.5)  # the first one the map reaches is used
CAPTIONS = 2000  # load captions, sent round robin
CALIBRATION_CAPTIONS = 200  # the generated gallery's stand-in calibration (another seed than the load's)
SERVER_FLAGS = ("--reload_interval", "0", "--max_concurrency", "8")


# ============================================================================================ the main job
def demo_finished(workdir: str) -> bool:
    """A finished demo run: its record and a servable index."""
    export = os.path.join(workdir, "export")
    return os.path.exists(os.path.join(workdir, "record.json")) and bool(
        os.path.isdir(export) and layout.servable_versions(export)
    )


def run_demo(workdir: str, overrides: list[str]) -> dict:
    """Runs (or, when finished, reuses) the main job in ``workdir``; its wall time and the seconds it records."""
    cmd = [sys.executable, "-m", "ce_retrieval.cli", "demo", "--workdir", workdir]
    for o in overrides:
        cmd += ["--params_override", o]
    out = {"workdir": workdir}
    if demo_finished(workdir):
        out.update(ran=False, wall_seconds=None)
    else:
        resumed = os.path.isdir(os.path.join(workdir, "model"))  # the demo reuses / resumes trained models
        start = time.perf_counter()
        with tempfile.TemporaryFile() as log:
            done = subprocess.run(
                cmd, env={**os.environ, **reliability.SUBPROCESS_ENV}, stdout=log, stderr=subprocess.STDOUT
            )
            if done.returncode != 0:
                log.seek(0)
                raise RuntimeError(f"the demo failed ({done.returncode}): {log.read().decode()[-3000:]}")
        out.update(
            ran=True,
            resumed=resumed,
            wall_seconds=round(time.perf_counter() - start, 1),
            command=" ".join(["python", *cmd[1:]]),
        )
    with open(os.path.join(workdir, "record.json"), encoding="utf-8") as f:
        record = json.load(f)
    out.update(record_seconds=record.get("seconds"), record_date=record.get("date"), seed=record.get("seed"))
    return out


def demo_captions(workdir: str, n: int) -> tuple[list[str], str]:
    """The demo's test captions (its config in ``model/config.yaml``), shuffled; generated word lists without one."""
    config = os.path.join(workdir, "model", "config.yaml")
    if not os.path.exists(config):
        return word_captions(n, seed=1), "generated word lists (the run has no model/config.yaml)"
    from ce_retrieval import configs, data

    captions = list(data.load_retrieval_split(configs.load_experiment(config).data, "test").captions)
    order = np.random.default_rng(0).permutation(len(captions))[:n]
    return [captions[i] for i in order], f"the test split's captions ({len(captions):,}), shuffled"


def word_captions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(reliability.WORDS, size=rng.integers(3, 9))) for _ in range(n)]


# ====================================================================================== the generated gallery
def generated_export(root: str, n: int, brute_force_below: int | None) -> dict:
    """The stand-in towers (d = 128) exported to ``root``, indexed over ``n`` items of the hard clustered gallery,
    with stand-in calibration from ``CALIBRATION_CAPTIONS`` generated captions."""
    import tensorflow as tf

    from benchmarks.common.exports import stand_in_export
    from benchmarks.serving import threshold_search as ts_bench
    from ce_retrieval.build.index import BRUTE_FORCE_BELOW, BuildConfig, build_index
    from ce_retrieval.evaluation.probability import ProbabilityMap
    from ce_retrieval.search.threshold import tau_for_median_hits

    start = time.perf_counter()
    text, _ = stand_in_export(root, dim=ts_bench.DIM)
    x = ts_bench.hard_gallery(n)
    q = text(tf.constant(word_captions(CALIBRATION_CAPTIONS, seed=2))).numpy()
    tau = tau_for_median_hits(q, x, min(100, n))  # the stand-in threshold for precision 0.9
    tau_p = tau_for_median_hits(q, x, min(30, n))  # where the stand-in map reaches probability 0.9
    pmap = ProbabilityMap(np.array([tau, tau_p, 1.0]), np.array([0.5, 0.9, 1.0]))
    manifest = build_index(
        x,
        np.arange(n),
        root,
        1,
        thresholds={"0.9": tau},
        queries=q,
        config=BuildConfig(brute_force_below=BRUTE_FORCE_BELOW if brute_force_below is None else brute_force_below),
        gallery_info={"generated": f"benchmarks.serving.threshold_search hard gallery, {n} items"},
        probability=pmap.to_json(),
    )
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "build_seconds": manifest["build_seconds"],
        "calibration": f"{CALIBRATION_CAPTIONS} generated captions (seed 2; the load uses seed 1): precision 0.9 "
        "-> the median caption's 100th score, probability 0.9 -> its 30th (a stand-in map)",
    }


# ========================================================================================= the measurements
def newest_manifest(export_dir: str) -> dict:
    version = layout.servable_versions(export_dir)[-1]
    return layout.read_json(os.path.join(layout.version_dir(export_dir, layout.INDEX, version), layout.INDEX_MANIFEST))


def query_modes(manifest: dict) -> tuple[list[tuple[str, dict]], dict, list[str]]:
    """``(mode name, request fields)`` per row, what was chosen (levels and thresholds), and rows left out and why."""
    from ce_retrieval.evaluation.probability import ProbabilityMap

    calibrated = manifest.get("thresholds") or {}
    # a level the split could not estimate is stored as None (the demo's 0.9 on 500 validation images)
    thresholds = {p: t for p, t in (calibrated.get("threshold_at_precision") or {}).items() if t is not None}
    modes, chosen, skipped = [("top-k", {"k": 10})], {}, []
    level = next((p for p in PRECISION_LEVELS if p in thresholds), None)
    if level is None and thresholds:
        level = max(thresholds, key=float)
    if level is None:
        skipped.append("threshold rows: the index has no calibrated threshold")
    else:
        chosen.update(precision=float(level), threshold=thresholds[level])
        modes += [
            ("threshold", {"precision": float(level), "guarantee": False}),
            ("threshold, exact", {"precision": float(level), "exact": True, "guarantee": False}),
        ]
    pmap = calibrated.get("probability")
    if pmap is None:
        skipped.append("min_probability: the index has no probability map")
    else:
        pm = ProbabilityMap.from_json(pmap)
        m = next((m for m in PROBABILITY_LEVELS if pm.min_score(m) is not None), None)
        if m is None:
            skipped.append(f"min_probability: the map reaches no level of {PROBABILITY_LEVELS}")
        else:
            chosen.update(min_probability=m, min_probability_threshold=pm.min_score(m))
            modes.append(("min_probability", {"min_probability": m}))
    return modes, chosen, skipped


def _hits(host: str, port: int, captions: list[str], fields: dict) -> tuple[dict, list]:
    """One request per caption at concurrency 1: hit counts, the answers' id sets (None where cut) and, for
    threshold modes, how the answers say they were made (each result's ``answer``: the share answered exactly and
    the set recall the approximate ones promise)."""
    counts, cut, sets, answers = [], 0, [], []
    for c in captions:
        status, payload = reliability._request(host, port, "POST", "/search", _body(c, fields))
        if status != 200:
            raise RuntimeError(f"{fields}: {status} {payload[:300]!r}")
        result = json.loads(payload)["results"][0]
        counts.append(result.get("num_hits", len(result["hits"])))
        cut += bool(result.get("truncated"))
        sets.append(None if result.get("truncated") else {h["id"] for h in result["hits"]})
        if "answer" in result:
            answers.append(result["answer"])
    c = np.array(counts)
    promised = [a["set_recall"] for a in answers if not a["exact"]]
    return {
        "queries": len(c),
        "mean": round(float(c.mean()), 2),
        "median": float(np.median(c)),
        "max": int(c.max()),
        "cut_at_max_results": cut,
        "answered_exactly": round(float(np.mean([a["exact"] for a in answers])), 4) if answers else None,
        "approximate_promised_set_recall": min(promised) if promised else None,
    }, sets


def _body(caption: str, fields: dict) -> bytes:
    return json.dumps({"texts": [caption], **fields}).encode()


def served_set_recall(found: list, exact: list) -> float | None:
    """``sum |found & exact| / sum |exact|`` over the captions neither answer was cut for."""
    pairs = [(f, e) for f, e in zip(found, exact, strict=True) if f is not None and e is not None]
    total = sum(len(e) for _, e in pairs)
    return None if total == 0 else round(sum(len(f & e) for f, e in pairs) / total, 5)


def measure_gallery(name: str, export_dir: str, captions: list[str], source: str, args) -> dict:
    """The four modes at concurrency 1 and 8 against ``ce-retrieval serve`` on ``export_dir``."""
    manifest = newest_manifest(export_dir)
    modes, chosen, skipped = query_modes(manifest)
    ts = manifest.get("threshold_search") or {}
    approx = ts.get("approximate") or {}
    out = {
        "name": name,
        "gallery_size": manifest["num_items"],
        "index_kind": manifest["kind"],
        "threshold_default": ts.get("default"),
        "manifest_set_recall": approx.get("set_recall"),
        "recall_at_10": (manifest.get("ann") or {}).get("recall_at_10"),
        "queries": {"source": source, "count": len(captions)},
        **chosen,
        "skipped": skipped,
        "hits": {},
        "rows": [],
    }
    hit_captions = captions[: args.hit_queries]
    extra = ("--max_results", str(args.max_results))
    with reliability.server_process(export_dir, *SERVER_FLAGS, *extra) as (_, host, port):
        reliability.load(host, port, [_body(c, {"k": 10}) for c in captions[:50]], 2, total=50)  # warm up
        sets = {}
        for mode, fields in modes:
            out["hits"][mode], sets[mode] = _hits(host, port, hit_captions, fields)
        if "threshold" in sets:
            out["served_set_recall_vs_exact"] = served_set_recall(sets["threshold"], sets["threshold, exact"])
        for mode, fields in modes:
            bodies = [_body(c, fields) for c in captions]
            for conc in CONCURRENCY:
                r = reliability.load(host, port, bodies, conc, duration_s=args.duration)
                out["rows"].append(
                    {
                        "mode": mode,
                        "request": fields,
                        "concurrency": conc,
                        "requests_per_second": round(r["rps"], 1),
                        "p50_ms": round(r["p50"], 2),
                        "p99_ms": round(r["p99"], 2),
                        "answered": r["ok"],
                        "failed": r["failed"],
                        "failures": r["failures"],
                        "seconds": round(r["seconds"], 2),
                    }
                )
    out["failed"] = sum(row["failed"] for row in out["rows"])
    return out


# ================================================================================================= record
def run(args, command: str) -> dict:
    samples = []
    sampler = LoadSampler(samples, every=15.0)  # the 1-minute load average, so the record says what ran beside it
    sampler.start()
    started = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="ce_threshold_service_")
    try:
        workdir = os.path.abspath(args.workdir or os.path.join(scratch, "demo"))
        demo = run_demo(workdir, args.params_override)
        captions, source = demo_captions(workdir, CAPTIONS)
        galleries = [measure_gallery("demo", os.path.join(workdir, "export"), captions, source, args)]
        generated = None
        if args.gallery:
            root = os.path.join(scratch, "generated")
            generated = generated_export(root, args.gallery, args.brute_force_below)
            load_captions = word_captions(CAPTIONS, seed=1)
            galleries.append(measure_gallery("generated", root, load_captions, "generated word lists (seed 1)", args))
            galleries[-1]["export"] = generated
    finally:
        sampler.stop.set()
        shutil.rmtree(scratch, ignore_errors=True)
    samples.append(load_average()[0])
    failed = sum(g["failed"] for g in galleries)
    return {
        "benchmark": "threshold_service",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": host(),
        "load_average_1min": {
            "samples": [round(x, 2) for x in samples],
            "min": round(min(samples), 2),
            "max": round(max(samples), 2),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "duration_per_row_s": args.duration,
        "max_results": args.max_results,
        "demo": demo,
        "galleries": galleries,
        "generated_gallery": "skipped (--gallery 0)" if not args.gallery else args.gallery,
        "failed_requests": failed,
        "all_requests_succeeded": failed == 0,
    }


def markdown(r: dict) -> str:
    m, d = r["machine"], r["demo"]
    lines = [
        f"# Threshold vs top-k through the HTTP service ({r['date']})",
        "",
        f"`{r['command']}`",
        "",
        f"Machine: {m.get('cpu')}, {m.get('cpu_count')} cores. Load average (1 min) during the run "
        f"{r['load_average_1min']['min']}–{r['load_average_1min']['max']} (every 15 s). {r['seconds']:.0f} s in all.",
        "",
    ]
    if d["ran"]:
        lines.append(
            f"Main job (`{d['command']}`{', resumed from trained models' if d.get('resumed') else ''}): "
            f"**{d['wall_seconds']:.0f} s** wall ({d['wall_seconds'] / 60:.1f} min); its record.json states "
            f"{d['record_seconds']} s."
        )
    else:
        lines.append(
            f"Main job: the finished run in `{d['workdir']}` reused ({d['record_date']}, its record.json "
            f"states {d['record_seconds']} s)."
        )
    lines += [
        "",
        f"`ce-retrieval serve` in its own process ({' '.join(SERVER_FLAGS)}, --max_results {r['max_results']}); "
        f"clients: threads with one keep-alive connection each, in the benchmark process (sharing the cores with the "
        f"server); one caption per request; {r['duration_per_row_s']:g} s per row.",
        "",
    ]
    for g in r["galleries"]:
        lines += _gallery_lines(g)
    if not isinstance(r["generated_gallery"], int):
        lines += [f"Generated gallery: {r['generated_gallery']}.", ""]
    lines.append(
        f"**{r['failed_requests']} failed requests** "
        f"({'all answered 200' if r['all_requests_succeeded'] else 'SOME FAILED'})."
    )
    return "\n".join(lines) + "\n"


def _gallery_lines(g: dict) -> list[str]:
    default = g["threshold_default"]
    lines = [
        f"## {g['name']} gallery: {g['gallery_size']:,} items, index {g['index_kind']}, threshold search by default "
        f"{default}",
        "",
        f"Queries: {g['queries']['source']}. ",
    ]
    if "precision" in g:
        lines[-1] += f"Threshold: precision {g['precision']:g} -> score {g['threshold']:.4f}. "
    if "min_probability" in g:
        lines[-1] += f"min_probability {g['min_probability']:g} -> score {g['min_probability_threshold']:.4f}. "
    if g.get("manifest_set_recall"):
        lines[-1] += f"Set recall measured at build (manifest): {g['manifest_set_recall']}. "
    if g.get("served_set_recall_vs_exact") is not None:
        lines[-1] += f"Served answers, default vs exact: set recall {g['served_set_recall_vs_exact']}. "
    for s in g["skipped"]:
        lines[-1] += f"Left out: {s}. "
    if "export" in g:
        e = g["export"]
        lines[-1] += f"Export + index built in {e['seconds']} s (index {e['build_seconds']} s); {e['calibration']}."
    lines += [
        "",
        "| query | concurrency | requests/s | p50 ms | p99 ms | hits per query (mean / max) | answered exactly "
        "(responses' flags) | answered | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in g["rows"]:
        h = g["hits"][row["mode"]]
        exactly = "-" if h.get("answered_exactly") is None else f"{h['answered_exactly']:.3f}"
        lines.append(
            f"| {row['mode']} `{json.dumps(row['request'])}` | {row['concurrency']} | "
            f"{row['requests_per_second']:,.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
            f"{h['mean']:.1f} / {h['max']} | {exactly} | {row['answered']:,} | {row['failed']} |"
        )
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=None, help="demo run: reused when finished, else the demo runs here")
    ap.add_argument("--params_override", action="append", default=[], help="passed to the demo (tests: tiny)")
    ap.add_argument("--gallery", type=int, default=100_000, help="generated gallery size (0: skip it)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of load per row")
    ap.add_argument("--hit_queries", type=int, default=100, help="captions whose hits are counted per mode")
    ap.add_argument("--max_results", type=int, default=1000, help="the service's cap on threshold hits")
    ap.add_argument("--brute_force_below", type=int, default=None, help=argparse.SUPPRESS)  # tests: ScaNN on small
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    command = "python -m benchmarks.serving.threshold_service " + " ".join(sys.argv[1:] if argv is None else argv)
    r = run(args, command.strip())
    write_record(args.out, "threshold_service", r, markdown(r))
    return 0 if r["all_requests_succeeded"] else 1


if __name__ == "__main__":
    sys.exit(main())

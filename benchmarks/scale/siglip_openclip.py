"""SigLIP's sigmoid loss at a large global batch: ours against OpenCLIP's ``SigLipLoss`` (issue #22), time and peak
memory of one forward+backward on CPU, side by side.

One step: unit embeddings ``img, txt [N, d]`` (``txt`` near ``img``; fixed seed, the same arrays for every
method), temperature ``t = 10`` and bias ``b = -10`` (SigLIP's initial values), the loss

    L = 1/N · Σ_ij softplus(-z_ij (t·img_i·txt_j + b)),   z = +1 on the diagonal, -1 elsewhere

and its gradients with respect to ``img``, ``txt``, ``t`` and ``b``. Methods:

* ``ours``: ``SigmoidLoss(scale=1, bias=0).tiled_loss`` on ``[t·img, b]`` against ``[txt, 1]``, which is what
  ``RetrievalObjective`` does with a learned t and b on the tiled path (``tiled_sigmoid.py``: column tiles, the
  gradient recomputed tile by tile in the backward, nothing ``[N, N]`` kept); tile width
  ``default_tile_size(N)`` (what ``loss_tile_size: auto`` picks) or ``--tile``; in ``tf.function``, with XLA
  unless ``--mode function``.
* ``openclip`` with W blocks: OpenCLIP's ``SigLipLoss`` on one process as W ranks (the "W GPUs" view): the global
  batch in W blocks of n = N/W rows; rank r computes its own ``[n, n]`` block, then the W - 1 blocks its
  bidirectional neighbour exchange brings (``dist_impl`` bidir, the default), each
  ``-logsigmoid(labels · (t·img_r txt_kᵀ + b)).sum() / n``, autograd keeping every block for the backward. The
  ranks' losses are averaged (what DDP's gradient averaging makes of them; it equals L). W = 1 is the plain,
  non-distributed ``SigLipLoss``. With the ``open_clip`` package importable (``pip install --no-deps -r
  requirements-bench.txt``; only its ``loss.py`` is loaded) its own class runs, its two neighbour-exchange
  functions replaced by an in-process hand-over of the other ranks' blocks (:func:`hand_over_blocks`); otherwise
  :func:`chunked_siglip`, a re-implementation of the same loop, runs, and the record says which.
* ``clip``: OpenCLIP's ``ClipLoss`` (softmax, non-distributed), for reference; where ``open_clip`` is missing, the
  same two cross-entropies written out (:func:`clip_softmax`).

On one process the W ranks' blocks are all alive at once, so the chunked loss keeps the whole ``[N, N]`` worth of
blocks whatever W is (a real rank keeps ``[n, N]``, 1/W of it); W changes only the transient ``[n, n]`` work.

Each case runs in a fresh subprocess that imports only its own framework: time is the median of ``--repeats``
steps after one warm-up step (which also compiles); peak memory is the process's peak RSS (``ru_maxrss``) above
its RSS once the inputs are built, so it includes XLA's compiled program. A case whose estimated peak
(:func:`estimate_gib`: the float32 ``[N, N]`` worth of tensors autograd keeps, plus one block's transients)
exceeds ``--budget-gib`` is not run and its row says what it needs. Before the cases, a small check in its own
subprocess compares ours with the torch methods at ``--check-size`` on the same inputs (loss and the four
gradients; and OpenCLIP's class with the re-implementation when both are there). Measure with nothing else
running.

    python -m benchmarks.scale.siglip_openclip                           # N = 16384, 32768, 65536 (the issue's table)
    python -m benchmarks.scale.siglip_openclip --sizes 1024 --out /tmp   # smoke test (1 min)

Writes ``<out>/siglip_openclip.json`` and ``.md``: the command, the machine (CPU model, cores), the load average
before and after each case, the date, the implementation of OpenCLIP that ran, and one row per case.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import time
from importlib import metadata

import numpy as np

from benchmarks import ROOT
from benchmarks.common.machine import load_average, machine_info, run_module  # noqa: E402  (CPU model for the record; no TensorFlow)
from benchmarks.common.records import write_record  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SCALE, BIAS = 10.0, -10.0  # SigLIP's initial t and b
#: float32 values per pair that the chunked loss's autograd keeps until the backward (the labels, labels·logits,
#: logsigmoid's buffer), and those one block adds while it is computed (its logits and logsigmoid's output, then
#: the two gradients in the backward); checked against the measured peaks of the runs in the record.
SIGLIP_KEPT, SIGLIP_BLOCK = 3, 2
#: ClipLoss: both directions' logits and both log-softmax outputs, float32 values per pair.
CLIP_KEPT = 4
#: The version of OpenCLIP's loss.py that :func:`chunked_siglip` and :func:`clip_softmax` follow.
FOLLOWS = "open_clip_torch 3.3.0, src/open_clip/loss.py (SigLipLoss, dist_impl bidir; ClipLoss)"


# ---- inputs ----------------------------------------------------------------------------------------------------


def make_inputs(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows ``img`` and ``txt`` (each text near its image), float32 ``[n, dim]``."""
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n, dim), dtype=np.float32)
    txt = img + 0.5 * rng.standard_normal((n, dim), dtype=np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    txt /= np.linalg.norm(txt, axis=1, keepdims=True)
    return img, txt


# ---- ours (TensorFlow) -----------------------------------------------------------------------------------------
# The frameworks are imported inside the functions that use them: a torch case's process never loads TensorFlow
# (and the other way round), so its peak RSS and its threads are its own.


def ours_step(n: int, tile: int | None, mode: str):
    """``step(img, txt, t, b) -> (L, [dimg, dtxt, dt, db])`` by our tiled path, in ``tf.function`` (XLA)."""
    # isort: off
    import ce_retrieval  # noqa: F401  (legacy Keras before TensorFlow)
    import tensorflow as tf
    from ce_retrieval.losses import SigmoidLoss

    # isort: on

    loss = SigmoidLoss()  # t and b learned: given at call, folded into the embeddings ([t·q, b]·[d, 1])
    ids = tf.range(n)

    def step(img, txt, t, b):
        with tf.GradientTape() as tape:
            tape.watch([img, txt, t, b])
            value = loss.tiled_loss(img, txt, ids, ids, tile, logit_scale=t, logit_bias=b)
        return value, tape.gradient(value, [img, txt, t, b])

    return tf.function(step, jit_compile=(mode == "xla"))


def ours_runner(img: np.ndarray, txt: np.ndarray, tile: int | None, mode: str):
    """A no-argument step on fixed inputs returning ``(L, grads as NumPy)``."""
    import tensorflow as tf

    step = ours_step(img.shape[0], tile, mode)
    inputs = [tf.constant(img), tf.constant(txt), tf.constant(SCALE), tf.constant(BIAS)]

    def run():
        value, grads = step(*inputs)
        return float(value), [g.numpy() for g in grads]

    return run


# ---- OpenCLIP (torch) --------------------------------------------------------------------------------------------


def load_openclip_loss():
    """OpenCLIP's ``loss.py`` as a module and its package version, without importing the ``open_clip`` package
    (whose ``__init__`` needs torchvision, timm and tokenizers; the loss needs only torch); ``(None, None)`` when
    ``open_clip`` is not installed."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    path = os.path.join(list(spec.submodule_search_locations)[0], "loss.py")
    loss_spec = importlib.util.spec_from_file_location("open_clip_loss", path)
    module = importlib.util.module_from_spec(loss_spec)
    loss_spec.loader.exec_module(module)
    return module, metadata.version("open_clip_torch")


def ring_order(rank: int, blocks: int) -> list[int]:
    """The text blocks rank ``rank`` meets, in OpenCLIP's bidirectional order: its own, then for each of the
    ``(W-1)//2`` bidirectional exchanges the block from the right and the one from the left, then (W even) the
    last one from the left."""
    pairs, remainder = divmod(blocks - 1, 2)
    order = [rank]
    for i in range(1, pairs + 1):
        order += [(rank + i) % blocks, (rank - i) % blocks]
    if remainder:
        order.append((rank - pairs - 1) % blocks)
    return order


def chunked_siglip(img, txt, t, b, blocks: int):
    """A re-implementation of OpenCLIP's ``SigLipLoss`` over W = ``blocks`` ranks on one process (module
    docstring; follows :data:`FOLLOWS`): per rank and block ``-logsigmoid(labels · logits).sum() / n`` with the
    labels a ``[n, n]`` tensor (``2·eye - 1`` for its own block, ``-1`` for the others) that autograd keeps, as
    there; the ranks' losses averaged."""
    import torch
    import torch.nn.functional as F

    n = img.shape[0] // blocks
    images, texts = img.split(n), txt.split(n)
    total = 0.0
    for rank in range(blocks):
        rank_loss = 0.0
        for k in ring_order(rank, blocks):
            logits = t * images[rank] @ texts[k].T
            logits += b
            labels = -torch.ones((n, n), dtype=img.dtype)
            if k == rank:
                labels = 2 * torch.eye(n, dtype=img.dtype) + labels
            rank_loss = rank_loss - F.logsigmoid(labels * logits).sum() / n
        total = total + rank_loss
    return total / blocks


def hand_over_blocks(module, texts) -> None:
    """Replaces the two neighbour-exchange functions of OpenCLIP's loss module by an in-process hand-over: a rank
    that sends block k to its left receives block k + 1 from its right, and one that sends block k to its right
    receives block k - 1 from its left (ring of ``len(texts)`` ranks; the blocks are found by identity, so the
    gradient flows back to the block's owner as the exchange's backward sends it there)."""
    where = {id(x): k for k, x in enumerate(texts)}
    count = len(texts)

    def bidir(left_rank, right_rank, tensor_to_left, tensor_to_right, group=None):
        return texts[(where[id(tensor_to_left)] + 1) % count], texts[(where[id(tensor_to_right)] - 1) % count]

    def single(from_rank, to_rank, tensor, group=None):
        return texts[(where[id(tensor)] - 1) % count]

    module.neighbour_exchange_bidir_with_grad = bidir
    module.neighbour_exchange_with_grad = single


def openclip_siglip(module, blocks: int):
    """OpenCLIP's own ``SigLipLoss`` class run as W ranks on one process: ``loss(img, txt, t, b)``."""
    ranks = [module.SigLipLoss(rank=r, world_size=blocks) for r in range(blocks)]

    def loss(img, txt, t, b):
        n = img.shape[0] // blocks
        images, texts = img.split(n), txt.split(n)
        hand_over_blocks(module, texts)
        return sum(ranks[r](images[r], texts[r], t, b) for r in range(blocks)) / blocks

    return loss


def clip_softmax(img, txt, t):
    """OpenCLIP's non-distributed ``ClipLoss`` written out: both directions' cross-entropy, averaged."""
    import torch
    import torch.nn.functional as F

    labels = torch.arange(img.shape[0])
    per_image, per_text = t * img @ txt.T, t * txt @ img.T
    return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2


def torch_loss(method: str, blocks: int, module):
    """``loss(img, txt, t, b)`` of a torch method (``openclip`` with W blocks, or ``clip``); OpenCLIP's own
    classes where ``module`` is its loss module, else the re-implementations."""
    if method == "clip":
        if module is not None:
            clip = module.ClipLoss()
            return lambda img, txt, t, b: clip(img, txt, t)
        return lambda img, txt, t, b: clip_softmax(img, txt, t)
    if module is not None:
        return openclip_siglip(module, blocks)
    return lambda img, txt, t, b: chunked_siglip(img, txt, t, b, blocks)


def torch_runner(img: np.ndarray, txt: np.ndarray, loss_fn):
    """A no-argument step on fixed inputs returning ``(L, grads as NumPy)``; the gradients w.r.t. all four."""
    import torch

    leaves = [
        torch.from_numpy(img).requires_grad_(),
        torch.from_numpy(txt).requires_grad_(),
        torch.tensor(SCALE, requires_grad=True),
        torch.tensor(BIAS, requires_grad=True),
    ]

    def run():
        for x in leaves:
            x.grad = None
        value = loss_fn(*leaves)
        value.backward()
        return float(value.detach()), [
            x.grad.numpy() if x.grad is not None else np.zeros_like(x.detach().numpy()) for x in leaves
        ]

    return run


# ---- one case in its own process ---------------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def run_case(case: dict) -> dict:
    """In this (fresh) process: the step's median time over ``repeats`` after a warm-up, and the peak RSS above
    the RSS once the inputs are built."""
    img, txt = make_inputs(case["n"], case["dim"], case["seed"])
    extra = {}
    if case["method"] == "ours":
        # isort: off
        import ce_retrieval  # noqa: F401  (legacy Keras before TensorFlow)
        import tensorflow as tf
        from ce_retrieval.losses.kernels.tiled import default_tile_size

        # isort: on

        extra["tile"] = case["tile"] or default_tile_size(case["n"])  # what loss_tile_size auto picks at this N
        run = ours_runner(img, txt, extra["tile"], case["mode"])
        library = f"tensorflow {tf.__version__}"
    else:
        import torch

        torch.set_num_threads(os.cpu_count())  # as many as TensorFlow's pool: every core, like ours
        module, _ = load_openclip_loss()
        run = torch_runner(img, txt, torch_loss(case["method"], case["blocks"], module))
        library = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    before = _rss_bytes()
    start = time.perf_counter()
    value, _ = run()
    warmup = time.perf_counter() - start
    times = []
    for _ in range(case["repeats"]):
        start = time.perf_counter()
        value, _ = run()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "seconds": statistics.median(times),
        "times": [round(x, 4) for x in times],
        "warmup_seconds": round(warmup, 3),
        "peak_mib": max(peak - before, 0) / 2**20,
        "loss": value,
        "library": library,
    } | extra


def relative_differences(got, want) -> dict:
    """``(L, grads)`` against ``(L, grads)``: the relative difference of the loss, and of each gradient the largest
    absolute difference over the reference's largest entry."""
    (value, grads), (ref_value, ref_grads) = got, want
    diffs = [abs(value - ref_value) / abs(ref_value)]
    for g, r in zip(grads, ref_grads, strict=True):
        diffs.append(float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30)))
    return dict(zip(["loss", "img", "txt", "t", "b"], diffs, strict=True))


def agreement(n: int, dim: int, blocks: list[int], seed: int, mode: str) -> dict:
    """Ours against each torch SigLIP method (and OpenCLIP's class against the re-implementation) on the same
    inputs (:func:`relative_differences`)."""
    img, txt = make_inputs(n, dim, seed)
    module, _ = load_openclip_loss()
    ours = ours_runner(img, txt, max(1, n // 4), mode)()  # four tiles
    out = {}
    for w in blocks:
        mine = torch_runner(img, txt, torch_loss("openclip", w, None))()
        out[f"ours vs re-implementation, W = {w}"] = relative_differences(ours, mine)
        if module is not None:
            theirs = torch_runner(img, txt, torch_loss("openclip", w, module))()
            out[f"ours vs open_clip, W = {w}"] = relative_differences(ours, theirs)
            out[f"re-implementation vs open_clip, W = {w}"] = relative_differences(mine, theirs)
    return out


def in_subprocess(payload: dict) -> dict:
    """Runs ``payload`` (a case, or the check) in a fresh Python and returns its JSON answer (or the error)."""
    done = run_module(__spec__.name, "--child", json.dumps(payload))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        if done.returncode == -9:  # SIGKILL: on Linux normally the out-of-memory killer
            return {"error": "killed (SIGKILL; out of memory?)"}
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1][len("RESULT ") :])


# ---- the plan, the estimate, the record --------------------------------------------------------------------------


def estimate_gib(method: str, n: int, blocks: int, dim: int) -> float:
    """Estimated peak memory of a torch case (GiB): the float32 values per pair autograd keeps over all blocks,
    plus one block's transients, plus the embeddings and their gradients. Ours: 0 (its tiles are ``[N, T]``).

    Counted with ``saved_tensors_hooks`` at N = 4096: 3.09 (W = 1) and 3.31 (W = 8) float32 per pair saved. Blocks
    under glibc's mmap threshold (up to 32 MiB) come from the heap, whose free lists keep what the blocks freed: at
    N = 4096, W = 8 (1 MiB blocks) the peak RSS is 413 MiB against 210 estimated, and 221 MiB with the threshold
    fixed (``MALLOC_MMAP_THRESHOLD_=131072``). The cases the budget decides on (N ≥ 32768) have blocks of 64 MiB
    and more, which are mapped and unmapped whole."""
    features = 8 * 4 * n * dim
    if method == "ours":
        return 0.0
    if method == "clip":
        return (4 * CLIP_KEPT * n * n + features) / 2**30
    block = n // blocks
    return (4 * (SIGLIP_KEPT * n * n + SIGLIP_BLOCK * block * block) + features) / 2**30


#: Seconds per pair (N²) of one forward+backward on 2 idle cores, and seconds to start a case's process (imports,
#: inputs, XLA compilation): only for the run-time estimate printed before the run. Rough: ours from the tiled
#: softmax loss at N = 32768 (11 s, benchmarks/results/tiled.md), the torch ones from N = 4096 on a loaded machine
#: (load 5-6 on 2 cores) divided by 3.
SECONDS_PER_PAIR = {"ours": 1.0e-8, "openclip": 3.0e-8, "clip": 4.0e-8}
STARTUP_SECONDS = {"ours": 15.0, "openclip": 5.0, "clip": 5.0}


def estimate_minutes(cases: list[dict], budget_gib: float) -> float:
    """The run's expected wall time on 2 idle cores (warm-up + repeats steps per case that fits the budget)."""
    seconds = 30.0  # the agreement check
    for c in cases:
        if estimate_gib(c["method"], c["n"], c["blocks"], c["dim"]) <= budget_gib:
            steps = 1 + c["repeats"]
            seconds += STARTUP_SECONDS[c["method"]] + steps * SECONDS_PER_PAIR[c["method"]] * c["n"] ** 2
    return seconds / 60


def plan(args) -> list[dict]:
    """The cases, per N: ours, OpenCLIP's SigLipLoss with each W (largest first, W = 1 last), ClipLoss."""
    cases = []
    for n in args.sizes:
        common = {"n": n, "dim": args.dim, "seed": args.seed, "repeats": args.repeats}
        cases.append(common | {"method": "ours", "blocks": 1, "tile": args.tile, "mode": args.mode})
        for w in sorted(set(args.blocks) | {1}, reverse=True):
            if n % w:
                raise SystemExit(f"N = {n} does not split into {w} blocks")
            cases.append(common | {"method": "openclip", "blocks": w})
        if not args.no_clip:
            cases.append(common | {"method": "clip", "blocks": 1})
    return cases


def label(case: dict) -> str:
    if case["method"] == "ours":
        return f"ours (tiled, T = {case['tile'] or 'auto'}, {case['mode']})"
    if case["method"] == "clip":
        return "OpenCLIP ClipLoss (softmax, W = 1)"
    return f"OpenCLIP SigLipLoss, W = {case['blocks']}"


def add_ratios(rows: list[dict]) -> None:
    """ours / this, time and memory, for the rows of the same N that ran."""
    ours = {r["n"]: r for r in rows if r["method"] == "ours" and "seconds" in r}
    for r in rows:
        base = ours.get(r["n"])
        if r["method"] != "ours" and base and "seconds" in r:
            r["time_ratio_ours"] = base["seconds"] / r["seconds"]
            r["memory_ratio_ours"] = base["peak_mib"] / r["peak_mib"] if r["peak_mib"] > 0 else None


def markdown(record: dict) -> str:
    m = record["machine"]
    lines = [
        f"# SigLIP sigmoid loss: ours (tiled) vs OpenCLIP SigLipLoss, forward+backward on CPU ({record['date']})",
        "",
        f"`{record['command']}`",
        "",
        f"{m['cpu']}, {m['cores']} cores; load average (1 min) {m['load_min']:.2f} - {m['load_max']:.2f} during "
        f"the run; {record['minutes']:.1f} min. d = {record['dim']}, t = {SCALE:g}, b = {BIAS:g}, median of "
        f"{record['repeats']} steps after one warm-up, each case in its own process; peak = peak RSS above the RSS "
        f"once the inputs are built. OpenCLIP: {record['openclip']}. Budget {record['budget_gib']:g} GiB: a case "
        "estimated above it is not run.",
        "",
        "| method | N | seconds | peak MiB | estimate GiB | ours / this, time | ours / this, memory |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        est = f"{r['estimate_gib']:.1f}" if r["method"] != "ours" else "-"
        if "seconds" in r:
            tr = f"{r['time_ratio_ours']:.2f}" if "time_ratio_ours" in r else "-"
            mr = f"{r['memory_ratio_ours']:.3f}" if r.get("memory_ratio_ours") is not None else "-"
            cells = [f"{r['seconds']:.3f}", f"{r['peak_mib']:.0f}", est, tr, mr]
        else:
            cells = [r["status"], "", est, "", ""]
        lines.append(f"| {r['label']} | {r['n']} | " + " | ".join(cells) + " |")
    widest = max(r["blocks"] for r in record["rows"])
    if widest > 1:
        per_rank = ", ".join(
            f"{n}: {4 * SIGLIP_KEPT * n * n / widest / 2**30:.2g} GiB" for n in sorted({r["n"] for r in record["rows"]})
        )
        lines += [
            "",
            f"On one process the W ranks' blocks are all alive at once; a real rank of W = {widest} keeps 1/W of "
            f"them, {SIGLIP_KEPT} float32 per pair of its [N/W, N] rows (estimate, before the towers' "
            f"activations): {per_rank}.",
        ]
    lines += [
        "",
        f"Agreement at N = {record['check_size']} (largest relative difference; loss, then the gradients):",
        "",
    ]
    check = record["check"]
    if "error" in check:
        lines.append(f"- check failed: {check['error']}")
    for name, d in check.items():
        if name != "error":
            lines.append(f"- {name}: " + ", ".join(f"{k} {v:.1e}" for k, v in d.items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768, 65536], help="global batch N")
    parser.add_argument("--dim", type=int, default=128, help="embedding width d")
    parser.add_argument("--blocks", type=int, nargs="+", default=[8], help="OpenCLIP ranks W (W = 1 always runs)")
    parser.add_argument("--tile", type=int, default=None, help="our tile width (default: default_tile_size(N))")
    parser.add_argument("--mode", choices=["xla", "function"], default="xla", help="ours: tf.function with XLA or not")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case after one warm-up (median)")
    parser.add_argument("--budget-gib", type=float, default=16.0, help="cases estimated above this are not run")
    parser.add_argument("--no-clip", action="store_true", help="skip the ClipLoss (softmax) reference rows")
    parser.add_argument("--check-size", type=int, default=256, help="N of the agreement check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        payload = json.loads(args.child)
        if payload.get("check"):
            answer = agreement(payload["n"], payload["dim"], payload["blocks"], payload["seed"], payload["mode"])
        else:
            answer = run_case(payload)
        print("RESULT " + json.dumps(answer), flush=True)
        return 0

    command = "python -m benchmarks.scale.siglip_openclip " + " ".join(sys.argv[1:] if argv is None else argv)
    cases = plan(args)
    print(f"# estimated {estimate_minutes(cases, args.budget_gib):.1f} min on 2 idle cores", flush=True)
    started, loads = time.perf_counter(), [load_average()[0]]
    module, version = load_openclip_loss()
    openclip = f"open_clip_torch {version} (its own classes)" if module else f"re-implementation of {FOLLOWS}"
    blocks = sorted(set(args.blocks) | {1}, reverse=True)
    check = in_subprocess(
        {"check": True, "n": args.check_size, "dim": args.dim, "blocks": blocks, "seed": args.seed, "mode": args.mode}
    )
    print(f"# agreement at N = {args.check_size}: {json.dumps(check)}", flush=True)
    rows = []
    for case in cases:
        row = case | {"estimate_gib": estimate_gib(case["method"], case["n"], case["blocks"], args.dim)}
        if row["estimate_gib"] > args.budget_gib:
            row["status"] = f"not run: needs ~{row['estimate_gib']:.3g} GiB"
        else:
            loads.append(load_average()[0])
            result = in_subprocess(case)
            loads.append(load_average()[0])
            row |= result if "error" not in result else {"status": result["error"]}
        row["label"] = label(row)
        rows.append(row)
        shown = f"{row['seconds']:.3f} s, {row['peak_mib']:.0f} MiB" if "seconds" in row else row["status"]
        print(f"{row['label']} | N = {row['n']} | {shown}", flush=True)
    add_ratios(rows)
    record = {
        "benchmark": "siglip_openclip",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(loads) | {"platform": platform.platform()},
        "minutes": (time.perf_counter() - started) / 60,
        "dim": args.dim,
        "repeats": args.repeats,
        "budget_gib": args.budget_gib,
        "openclip": openclip,
        "check_size": args.check_size,
        "check": check,
        "rows": rows,
    }
    write_record(args.out, "siglip_openclip", record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

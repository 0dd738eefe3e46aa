"""Generated clustered galleries: unit vectors around random cluster centres, the one generator of the benchmarks'
galleries and queries (ANN, threshold search, sharded index, service) and of the serving tests.

``x = normalise(c_k + U_k (s * z) + spread * g [+ noise * g'])``: ``c_k`` a random centre, ``U_k`` a random
``[dim, rank]`` basis with scales ``s`` decaying from 1.5 to 0.1 (elongated clusters; ``rank = 0``: round ones), ``g``
isotropic noise. Two ways to draw, each kept because recorded figures were measured on it (same seed, same vectors,
bit for bit):

* ``keyed`` (default): the centres (and bases) come from ``default_rng(seed)``; the rows of each ``chunk`` from their
  own ``default_rng([seed, start + row] (+ [stream]))``, so any slice of a huge gallery can be drawn alone and
  ``stream`` > 0 draws other samples of the same clusters (held-out queries); float32 draws
  (``standard_normal(dtype=float32)``).
* ``shared``: centres and rows from one ``default_rng(seed)``, in chunks of ``chunk`` rows, float64 draws cast to
  float32; ``scaled`` divides centres and noise by ``sqrt(dim)`` (the ANN benchmark's and the serving tests' layout).

``float64``: the arithmetic in float64, cast to float32 at the end (the serving tests' galleries).
"""

from __future__ import annotations

import numpy as np


def clustered(
    n: int,
    dim: int,
    clusters: int,
    seed: int = 0,
    *,
    spread: float = 1.0,
    rank: int = 0,
    noise: float = 0.0,
    draws: str = "keyed",
    chunk: int | None = None,
    start: int = 0,
    stream: int = 0,
    scaled: bool = False,
    float64: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``n`` float32 unit vectors of ``clusters`` clusters in ``dim`` dimensions (see the module docstring), written
    into ``out`` when given (e.g. a memory-mapped ``.npy``: the gallery then never sits in anonymous memory).

    ``spread``: the items' noise scale; ``noise``: further isotropic noise in units of it (queries further from their
    cluster than its items are; ``keyed`` only); ``rank``: elongated clusters (``keyed`` only); ``chunk``: rows drawn
    at a time (``None``: all at once); ``start``/``stream``: which rows or which other sample of a ``keyed`` gallery.
    """
    out = np.empty((n, dim), np.float32) if out is None else out
    chunk = chunk or max(n, 1)
    if draws == "shared":
        return _shared(n, dim, clusters, seed, spread, chunk, scaled, float64, out)
    if draws != "keyed":
        raise ValueError(f"draws must be 'keyed' or 'shared', not {draws!r}")
    g = np.random.default_rng(seed)
    centres = g.normal(size=(clusters, dim))
    if not float64:
        centres = centres.astype(np.float32)
    if rank:
        bases = g.normal(size=(clusters, dim, rank)).astype(np.float32) / np.sqrt(dim)
        scales = np.geomspace(1.5, 0.1, rank).astype(np.float32)
    for s in range(0, n, chunk):
        rows = min(chunk, n - s)
        rng = np.random.default_rng([seed, start + s] + ([stream] if stream else []))
        k = rng.integers(0, clusters, rows)
        if rank:
            z = rng.standard_normal((rows, rank), dtype=np.float32) * scales
            x = centres[k] + np.einsum("ndr,nr->nd", bases[k], z) * np.sqrt(dim)
        else:
            x = centres[k]
        x += spread * _normal(rng, rows, dim, float64) if spread != 1.0 else _normal(rng, rows, dim, float64)
        if noise:
            x += noise * _normal(rng, rows, dim, float64)
        out[s : s + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _normal(rng: np.random.Generator, rows: int, dim: int, float64: bool) -> np.ndarray:
    """Isotropic noise of the ``keyed`` draws: float64 ``normal`` or float32 ``standard_normal``."""
    return rng.normal(size=(rows, dim)) if float64 else rng.standard_normal((rows, dim), np.float32)


def _shared(n, dim, clusters, seed, spread, chunk, scaled, float64, out) -> np.ndarray:
    """The ``shared`` draws: one generator for the centres and then, chunk by chunk, each row's cluster and noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    if not float64:
        centres = centres.astype(np.float32)
    if scaled:
        centres = centres / np.sqrt(dim)
    for s in range(0, n, chunk):
        rows = min(chunk, n - s)
        k = rng.integers(0, clusters, rows)
        g = rng.normal(size=(rows, dim))
        if not float64:
            g = g.astype(np.float32)
        x = centres[k] + (spread * g / np.sqrt(dim) if scaled else spread * g)
        out[s : s + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def cluster_labels(n: int, clusters: int, seed: int = 0, *, chunk: int | None = None, stream: int = 0) -> np.ndarray:
    """The cluster of each row of ``clustered(n, ..., seed, chunk=chunk, stream=stream)`` (``keyed`` draws: the
    first draw of each chunk's generator)."""
    chunk = chunk or max(n, 1)
    out = np.empty(n, np.int64)
    for s in range(0, n, chunk):
        rows = min(chunk, n - s)
        out[s : s + rows] = np.random.default_rng([seed, s] + ([stream] if stream else [])).integers(0, clusters, rows)
    return out


__all__ = ["cluster_labels", "clustered"]

"""The wire format between a router and its shard servers, and the error of a request no shard answered.

    POST SEARCH_PATH  {"version": v, "queries": [[float, ...], ...] | "queries_b64": "...", "k": k}
                      {"version": v, "queries" | "queries_b64": ..., "threshold": t, "limit": L, "exact": true}
                      -> {"version": v, "shard": i, "results": [{"ids": [...], "scores": [...], "truncated": b}]}
                      (threshold results also carry "answer": {"exact": b, "set_recall": r, "reason": "..."},
                      how the shard made it: ``threshold.ThresholdAnswer``; absent from older servers)

Queries travel either as JSON lists of floats or, faster and about 4x smaller, as ``queries_b64``: base64 of
the row-major little-endian float32 bytes of the [B, d] query matrix (:func:`encode_queries`, what the router
sends). Both are exact: a float32 widened to a float64 is the same number, Python writes a float64 with the
shortest repr that reads back to the same float64, and narrowing that to float32 gives the original bits
(checked in tests/serve/test_router.py); list values that are not float32 numbers are rounded to float32.

:class:`~ce_retrieval.search.interface.ShardCoverage` says which shards answered and why the others did not
(every :class:`~ce_retrieval.search.interface.SearchIndex` reports it); the searcher puts it in every result of a
sharded index, the service in every sharded response (``to_json``). :class:`ShardsUnavailableError` carries it when
no shard answered.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from ce_retrieval.search.interface import ShardCoverage
from ce_retrieval.serve.http_app import RequestError

SEARCH_PATH = "/shard/search"
SEARCH_FIELDS = {"version", "queries", "queries_b64", "k", "threshold", "limit", "exact"}


def encode_queries(queries: np.ndarray) -> str:
    """``queries_b64``: base64 of the row-major little-endian float32 bytes of a [B, d] matrix."""
    return base64.b64encode(np.ascontiguousarray(queries, dtype="<f4").tobytes()).decode("ascii")


def decode_queries_b64(raw, dim: int) -> np.ndarray:
    """The float32 [B, dim] matrix of a ``queries_b64`` string; ``RequestError`` 422 when it is not one."""
    if not isinstance(raw, str):
        raise RequestError(422, "'queries_b64' must be a base64 string of float32 bytes")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(422, "'queries_b64' is not valid base64") from None
    row = 4 * dim
    if not data or len(data) % row:
        raise RequestError(
            422, f"'queries_b64' holds {len(data)} bytes, not a positive multiple of {row} (float32 x dimension {dim})"
        )
    return np.frombuffer(data, dtype="<f4").reshape(-1, dim).astype(np.float32)


def decode_query_lists(rows, dim: int) -> np.ndarray:
    """The float32 [B, dim] matrix of ``queries`` given as JSON lists of numbers; ``RequestError`` 422 otherwise."""
    if not isinstance(rows, list) or not rows:
        raise RequestError(422, "'queries' must be a non-empty list of lists of numbers")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != dim:
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise RequestError(422, f"queries[{i}] must be a list of {dim} numbers (embedding dimension), got {got}")
        if not all(type(x) is float or type(x) is int for x in row):  # bool and str are not numbers here
            raise RequestError(422, f"queries[{i}] holds a value that is not a number")
    try:
        wide = np.asarray(rows, dtype=np.float64)
    except OverflowError:
        raise RequestError(422, "'queries' holds an integer too large for a float") from None
    with np.errstate(over="ignore"):
        return wide.astype(np.float32)


class ShardsUnavailableError(RuntimeError):
    """No shard answered (or, from the strict ``topk`` / ``threshold``, not every shard); ``coverage`` says why."""

    def __init__(self, coverage: ShardCoverage, what: str = "no shard answered"):
        reasons = "; ".join(f"shard {i}: {r}" for i, r in sorted(coverage.missing.items()))
        super().__init__(f"{what} ({len(coverage.answered)} of {coverage.total} answered; {reasons})")
        self.coverage = coverage

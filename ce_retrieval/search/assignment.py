"""Which shard a gallery id belongs to: ``shard = splitmix64(uint64(id)) mod S``, the one rule of every sharded piece.

The Beam embedding pipeline (its output shards), the sharded index (its shard folders) and a shard server (its
load check) all place an id with :func:`shard_of`. The rule depends on the id only, so an id always lands in the
same shard whatever the runner, worker count, input order or machine (no Python ``hash`` randomisation, no
lookup table), and splitmix64 spreads consecutive ids evenly. The id is read as its two's-complement uint64
(so -1 is 2^64 - 1).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SHARD_ASSIGNMENT", "shard_name", "shard_of", "splitmix64"]

SHARD_ASSIGNMENT = (
    "shard = splitmix64(uint64(id)) mod num_shards; splitmix64(x): z = x + 0x9E3779B97F4A7C15; "
    "z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^ (z >> 31) "
    "(all mod 2^64; a negative id is read as its two's complement)"
)


def splitmix64(ids) -> np.ndarray:
    """The splitmix64 finaliser of each id (uint64, the shape of ``ids``); ``splitmix64(0) == 0xE220A8397B1DCDAF``."""
    z = np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):  # arithmetic mod 2^64 is the point
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shard_of(ids, num_shards: int) -> np.ndarray:
    """Shard index (int64 [n]) of each gallery id: ``splitmix64(uint64(id)) mod num_shards``."""
    if int(num_shards) < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    return (splitmix64(np.atleast_1d(ids)) % np.uint64(num_shards)).astype(np.int64)


def shard_name(i: int, num_shards: int) -> str:
    """The folder of shard ``i`` of a sharded index: ``shard-0000i-of-0000S``."""
    return f"shard-{int(i):05d}-of-{int(num_shards):05d}"

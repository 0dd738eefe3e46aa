"""Embedding checks of the search kernels: float32 ``[n, d]`` arrays of one width, scored in row blocks.

Embeddings arrive as NumPy arrays or tensors (any float dtype, e.g. float16 from a mixed-precision tower) and are
scored as float32 dot products ``S = Q D^T``. The evaluation's pair checks (``evaluation._arrays``) build on these.
"""

from __future__ import annotations

import numpy as np


def as_embeddings(x, name: str) -> np.ndarray:
    """A C-contiguous float32 ``[n, d]`` array with finite values, or a ValueError naming ``name``."""
    if hasattr(x, "numpy"):
        x = x.numpy()
    arr = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a rank-2 [num, dim] embedding matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def check_same_dim(q: np.ndarray, d: np.ndarray) -> None:
    """A ValueError unless the query and document embeddings have the same width."""
    if q.shape[1] != d.shape[1]:
        raise ValueError(f"query_emb has dimension {q.shape[1]} but doc_emb has dimension {d.shape[1]}")


def rows_per_block(num_cols: int, block_elements: int) -> int:
    """How many query rows make a score block of about ``block_elements`` entries (at least one)."""
    return max(1, int(block_elements) // max(1, int(num_cols)))

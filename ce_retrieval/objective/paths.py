"""Which path computes the loss, chosen from the config, and the combinations that cannot be.

Two independent choices, each a declared capability of the loss (``RetrievalLoss.supports_sharded``,
``supports_tiled``):

=====================  ==============================  ===================================================
                       dense (tile size 0)              tiled (tile size T, or ``auto`` above 2^26 logits)
=====================  ==============================  ===================================================
``replicated``         every replica: ``[B, B]`` S      every replica: the loss over ``[B, T]`` column tiles
``sharded``            replica r: its ``[B/R, B]`` rows  replica r: its rows over ``[B/R, T]`` tiles
=====================  ==============================  ===================================================

``train.loss_partition`` picks the row, ``train.loss_tile_size`` the column: ``0`` (dense, the default), a
positive T, or ``"auto"`` (tiled with ``tiled.default_tile_size`` when the global ``B·B`` exceeds
``kernels.tiled.TILED_THRESHOLD``, dense below it or for a loss without a tiled path). Every path gives the same
value and gradients (to float32 rounding); an impossible combination is refused with the alternatives named.
"""

from __future__ import annotations

from typing import NamedTuple

from ce_retrieval import losses
from ce_retrieval.losses.kernels.tiled import TILED_THRESHOLD, default_tile_size

LOSS_PARTITIONS = ("replicated", "sharded")
#: ``loss_tile_size`` value that tiles only above :data:`TILED_THRESHOLD` logits.
AUTO = "auto"


class LossPath(NamedTuple):
    """The path one call takes: the partition, the tile width (0: dense) and the global rows it was chosen for."""

    partition: str
    tile: int
    rows: int | None

    @property
    def name(self) -> str:
        """``dense``, ``tiled``, ``sharded`` or ``sharded + tiled`` (the objective's names for the four paths)."""
        if self.partition == "sharded":
            return "sharded + tiled" if self.tile else "sharded"
        return "tiled" if self.tile else "dense"

    def __str__(self) -> str:
        return f"{self.partition}, " + (f"tiled (T = {self.tile})" if self.tile else "dense")


def check_partition(partition: str) -> str:
    """``partition`` if it is one of :data:`LOSS_PARTITIONS`."""
    if partition not in LOSS_PARTITIONS:
        raise ValueError(f"loss_partition must be one of {LOSS_PARTITIONS}, got {partition!r}")
    return partition


def check_tile_size(tile_size) -> int | str:
    """``0`` (dense; also for ``None``), a positive int T, or ``"auto"``."""
    if tile_size is None:
        return 0
    if tile_size == AUTO:
        return AUTO
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 0:
        raise ValueError(f"loss_tile_size must be 0 (dense), a positive tile width or 'auto', got {tile_size!r}")
    return int(tile_size)


def resolve_tile_size(tile_size, loss, num_rows: int | None) -> int:
    """The tile width T to use for a global batch of ``num_rows`` (0: dense); ``"auto"`` decides here."""
    tile_size = check_tile_size(tile_size)
    if tile_size != AUTO:
        return tile_size
    if not capability(loss, "supports_tiled") or num_rows is None or num_rows * num_rows <= TILED_THRESHOLD:
        return 0
    return default_tile_size(num_rows)


def capability(loss, name: str) -> bool:
    """A declared capability of a loss or loss class (False for a plain Keras loss, which declares none)."""
    return bool(getattr(loss if isinstance(loss, type) else type(loss), name, False))


def with_capability(name: str) -> str:
    """The registered losses that declare ``name``, for error messages."""
    return ", ".join(n for n in losses.available() if capability(losses.lookup(n), name)) or "none"


def check_combination(loss, partition: str, tile_size, regularizers=()) -> None:
    """Refuses a path the loss (or a regulariser, ``(weight, loss)`` pairs) does not have, naming the
    alternatives."""
    name = type(loss).__name__
    if partition == "sharded" and not capability(loss, "supports_sharded"):
        raise ValueError(
            f"loss_partition='sharded' needs a loss that can be sharded over replicas; {name} cannot (losses that "
            f"can: {with_capability('supports_sharded')}). Use loss_partition='replicated' with {name}"
        )
    if tile_size not in (0, AUTO) and not capability(loss, "supports_tiled"):
        raise ValueError(
            f"loss_tile_size={tile_size} needs a loss with a tiled path; {name} has none (losses with one: "
            f"{with_capability('supports_tiled')}). Use loss_tile_size=0 (dense) or 'auto' (dense for {name})"
        )
    for _, term in regularizers:
        term_name = type(term).__name__
        if partition == "sharded" and not capability(term, "supports_sharded"):
            raise ValueError(
                f"loss.regularizers: {term_name} is added on the whole [B, B] cosine matrix, but "
                "loss_partition='sharded' computes each replica's share of the loss only and no sharded path of "
                f"{term_name} exists; use loss_partition='replicated' (with loss_tile_size=0), or drop the regulariser"
            )
        if tile_size not in (0, AUTO) and not capability(term, "supports_tiled"):
            raise ValueError(
                f"loss.regularizers: {term_name} is added on the whole [B, B] cosine matrix and has no tiled path; "
                f"use loss_tile_size=0 (dense) or 'auto' (dense with {term_name}), or drop the regulariser"
            )


__all__ = [
    "AUTO",
    "LOSS_PARTITIONS",
    "LossPath",
    "check_combination",
    "check_partition",
    "check_tile_size",
    "resolve_tile_size",
]

"""The density rule of block-adaptive SpMM, in one place.

The adjacency is cut into ``T x T`` tiles (rows = destinations, columns = sources). A tile is
*dense* when it holds strictly more than ``threshold * T * T`` non-zeros; its entries are then
multiplied as a small dense product on tensor cores, and every other entry stays in the CSR
remainder. The kernel plan (fgplugin.kernel_plan), the threshold probe (fgplugin.autotune), the
adjacency's statistics (``TiledAdjacency.dense_share``) and the orderings' quality measure
(``fgplugin.reorder.tile_density``) all classify tiles with :func:`dense_tiles`.
"""
from __future__ import annotations

import torch

#: The fixed threshold used where no other is given and ``"auto"`` cannot probe (off CUDA).
DEFAULT_THRESHOLD = 0.05


def dense_tiles(counts: torch.Tensor, threshold: float, tile_size: int) -> torch.Tensor:
    """Bool mask of the tiles with ``counts`` non-zeros that are dense at ``threshold``."""
    return counts > float(threshold) * tile_size * tile_size


def tile_keys(rows: torch.Tensor, cols: torch.Tensor, n_cols: int, tile_size: int) -> torch.Tensor:
    """The tile id of each entry ``(rows[i], cols[i])``: row panel * column panels + column panel
    (int64, ascending in row-major tile order)."""
    n_col_panels = max(1, -(-int(n_cols) // tile_size))
    return (rows.long() // tile_size) * n_col_panels + cols.long() // tile_size


def check_threshold(threshold, *, allow_auto: bool = True) -> None:
    """Raises ValueError unless ``threshold`` is a density in [0, 1] (or ``"auto"``)."""
    if allow_auto and threshold == "auto":
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        choices = ' or "auto" (chosen per graph on the GPU by a short timed probe)' if allow_auto else ""
        raise ValueError(f"threshold must be a density in [0, 1] (0.05 = a tile is dense above 5% non-zeros)"
                         f"{choices}, got {threshold!r}")

"""How much an ordering helps block-adaptive SpMM: dense-tile share and bandwidth."""
from __future__ import annotations

import torch

from .._csr import inverse_permutation
from ..tile_density import DEFAULT_THRESHOLD, dense_tiles, tile_keys
from ..validation import check_perm
from ._graph import as_edges, sorted_unique


def tile_density(
    edge_index,
    num_nodes: int | None = None,
    perm: torch.Tensor | None = None,
    tile_size: int = 32,
    threshold: float = DEFAULT_THRESHOLD,
) -> dict:
    r"""Share of non-zeros that fall in dense ``T x T`` tiles, and the bandwidth, after ``perm``.

    A tile is dense by the rule of the block-adaptive SpMM (fgplugin.tile_density). The matrix is taken as given: not
    symmetrized, self loops counted, duplicate entries counted once.

    Args:
        edge_index: ``[2, E]`` ids (or any graph :func:`fgplugin.reorder.reorder` accepts).
        num_nodes: node count, required with an ``edge_index``.
        perm: new -> old ordering (``x_new = x_old[perm]``); ``None`` = the given order.
        tile_size: ``T``.
        threshold: density above which a tile counts as dense.

    Returns:
        ``{"dense_share": float in [0, 1], "bandwidth": int (max |row - col|),
        "avg_bandwidth": float (mean |row - col| over non-zeros)}``; all zero without edges.
    """
    row, col, n = as_edges(edge_index, num_nodes)
    if perm is not None:
        inv = inverse_permutation(check_perm(perm, n, row.device))
        row, col = inv[row], inv[col]
    entries = sorted_unique(row * n + col)
    if entries.numel() == 0:
        return {"dense_share": 0.0, "bandwidth": 0, "avg_bandwidth": 0.0}
    row, col = entries // n, entries % n
    _, counts = sorted_unique(tile_keys(row, col, n, tile_size), return_counts=True)
    dense_nnz = counts[dense_tiles(counts, threshold, tile_size)].sum()
    gap = (row - col).abs()
    return {
        "dense_share": dense_nnz.item() / entries.numel(),
        "bandwidth": int(gap.max()),
        "avg_bandwidth": gap.double().mean().item(),
    }

"""Reorder a graph and build its tiled adjacency in one step, cached on disk when asked.

This is the framework-neutral half of the PyG and DGL ``BlockReorder`` transforms.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ._csr import inverse_permutation
from .cache import cached, default_cache_dir, tensor_digest
from .tiling import TiledAdjacency
from .validation import check_edge_index

CACHE_FORMAT = 2  # bump when the cached object's layout changes: old entries then read as stale


def reorder_graph(edge_index: torch.Tensor, num_nodes: int, edge_weight: torch.Tensor | None = None, *,
                  method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
                  threshold: float | str = "auto", cache: bool | str | os.PathLike = False) -> TiledAdjacency:
    """Reorders the nodes with ``fgplugin.reorder`` and returns the adjacency in the new order.

    The result's ``perm`` (new -> old) tells how to move node data: ``x_new = x[adj.perm]``; its
    ``edge_perm`` maps CSR positions to the input edge order, so per-edge data keeps its edges.

    Args:
        method (str): ordering, one of ``fgplugin.reorder.METHODS`` (default ``"community"``).
        parts (int): Algorithm 2's block-wise reordering over ``parts`` equal node ranges.
        seed (int): seed of the ordering.
        tile_size, threshold: tiling options; ``threshold="auto"`` (the default) lets the CUDA
            kernel time the candidate thresholds on the graph once, before its first kernel plan
            is built (``fgplugin.autotune``; 0.5-1.5 s on a 75-200M-edge graph on an H100, for
            1.9-5.3% faster training steps than at 0.05: docs/results.md); a graph under 3M
            non-zeros gets no dense tiles, untimed; pass a number to skip it.
        cache: ``False`` (no disk cache), ``True`` (the default cache folder,
            ``$FGPLUGIN_CACHE_DIR/preprocess``) or a folder. Entries are keyed by a hash of the
            graph and every option, written atomically with a checksum, and rebuilt (with a
            warning) when corrupt or stale.
    """
    from .reorder import reorder

    edge_index = check_edge_index(edge_index)

    def build() -> TiledAdjacency:
        perm = reorder(edge_index, method, num_nodes=num_nodes, parts=parts, seed=seed)
        return TiledAdjacency.from_edge_index(inverse_permutation(perm)[edge_index], num_nodes, edge_weight,
                                              tile_size=tile_size, threshold=threshold, perm=perm)

    if cache is False:
        return build()
    folder = default_cache_dir() if cache is True else Path(cache)
    key = cache_key(edge_index, num_nodes, edge_weight, method=method, parts=parts, seed=seed, tile_size=tile_size,
                    threshold=threshold)
    adj = cached(folder / f"{key}.pt", key, lambda: build().cpu())
    return adj.to(edge_index.device)


def cache_key(edge_index: torch.Tensor, num_nodes: int, edge_weight: torch.Tensor | None = None, *,
              method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
              threshold: float | str = "auto") -> str:
    """The disk-cache key of :func:`reorder_graph` for these arguments (entry: ``<key>.pt``)."""
    return tensor_digest(CACHE_FORMAT, edge_index, num_nodes, edge_weight, method, parts, seed, tile_size, threshold)

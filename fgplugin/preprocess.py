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
                  threshold: float | str = "auto", cache: bool | str | os.PathLike = False,
                  method_options: dict | None = None, keep_edge_order: bool = False) -> TiledAdjacency:
    """Reorders the nodes with ``fgplugin.reorder`` and returns the adjacency in the new order.

    The result's ``perm`` (new -> old) tells how to move node data: ``x_new = x[adj.perm]``. With
    ``keep_edge_order`` (or, with a cache, edge weights that need a gradient) its ``edge_perm`` maps CSR
    positions to the input edge order, so that per-edge values given later in that order
    (``adj.with_values``) find their edges; it costs an index per edge, so by default it is left out.

    Args:
        method (str): ordering, one of ``fgplugin.reorder.METHODS`` (default ``"community"``).
        parts (int): Algorithm 2's block-wise reordering over ``parts`` equal node ranges.
        seed (int): seed of the ordering.
        tile_size, threshold: tiling options; ``threshold="auto"`` (the default) lets the CUDA
            kernel time the candidate thresholds on the graph once, before its first kernel plan
            is built (``fgplugin.autotune``; 0.5-1.5 s on a 75-200M-edge graph on an H100, for
            1.9-5.3% faster training steps than at 0.05: docs/results.md); a graph under 3M
            non-zeros gets no dense tiles, untimed; pass a number to skip it.
        cache: ``False`` or ``None`` (no disk cache), ``True`` (the default cache folder,
            ``$FGPLUGIN_CACHE_DIR/preprocess``) or a folder (``~`` expanded). Entries are keyed by
            a hash of the graph and every option, written atomically with a checksum, and rebuilt
            (with a warning) when corrupt or stale. Edge weights that need a gradient are not
            cached: the entry holds the structure, and the weights are applied to it (with their
            gradient) after loading.
        method_options (dict): the method's own options, passed to ``fgplugin.reorder.reorder``
            (``cluster_size``, ``coarse_parts`` and ``workers`` for metis, ``k`` for slashburn,
            ...; see its docstring) and part of the cache key.
    """
    from .reorder import reorder

    cache = check_cache_option(cache)
    method_options = check_method_options(method_options)
    edge_index = check_edge_index(edge_index)
    # Weights that need a gradient are applied after the cache (with_values, through the edge
    # order kept): a loaded copy of them would carry no gradient back to the user's tensor, and
    # learnable weights change every step, so an entry keyed on their values would never be read.
    learnable = isinstance(edge_weight, torch.Tensor) and edge_weight.requires_grad and cache is not False
    built_with = None if learnable else edge_weight

    def build() -> TiledAdjacency:
        perm = reorder(edge_index, method, num_nodes=num_nodes, parts=parts, seed=seed, **method_options)
        return TiledAdjacency.from_edge_index(inverse_permutation(perm)[edge_index], num_nodes, built_with,
                                              tile_size=tile_size, threshold=threshold, perm=perm,
                                              keep_edge_order=learnable or keep_edge_order)

    if cache is False:
        return build()
    folder = default_cache_dir() if cache is True else Path(cache).expanduser()
    key = cache_key(edge_index, num_nodes, built_with, method=method, parts=parts, seed=seed, tile_size=tile_size,
                    threshold=threshold, learnable_weights=learnable, method_options=method_options,
                    keep_edge_order=keep_edge_order)
    adj = cached(folder / f"{key}.pt", key, lambda: build().cpu()).to(edge_index.device)
    return adj.with_values(edge_weight) if learnable else adj


def check_cache_option(cache):
    """``cache`` as :func:`reorder_graph` takes it (``None`` reads as ``False``), or a TypeError
    naming what it accepts."""
    if cache is None:
        return False
    if isinstance(cache, (bool, str, os.PathLike)):
        return cache
    raise TypeError(f"cache= takes False (no disk cache), True (the default folder, $FGPLUGIN_CACHE_DIR) or a "
                    f"folder path, got {cache!r}")


def cache_key(edge_index: torch.Tensor, num_nodes: int, edge_weight: torch.Tensor | None = None, *,
              method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
              threshold: float | str = "auto", learnable_weights: bool = False,
              method_options: dict | None = None, keep_edge_order: bool = False) -> str:
    """The disk-cache key of :func:`reorder_graph` for these arguments (entry: ``<key>.pt``);
    ``learnable_weights``: an entry of the structure alone, the weights applied after loading.
    Without method options or the edge order the key is what it was before they existed
    (entries stay valid)."""
    options = sorted((method_options or {}).items())
    return tensor_digest(CACHE_FORMAT, edge_index, num_nodes, edge_weight, method, parts, seed, tile_size, threshold,
                         *(("learnable weights",) if learnable_weights else ()),
                         *((("method options", options),) if options else ()),
                         *(("edge order",) if keep_edge_order else ()))


def check_method_options(method_options) -> dict:
    """``method_options`` as a dict of option names (``None``: none), or a TypeError naming the fix."""
    if method_options is None:
        return {}
    if not isinstance(method_options, dict) or not all(isinstance(k, str) for k in method_options):
        raise TypeError(f"method_options must be a dict of option names to values, e.g. dict(cluster_size=100), "
                        f"got {method_options!r}")
    return dict(method_options)

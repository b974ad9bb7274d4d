r"""Node orderings that give neighbours nearby ids (docs/design.md, "Reordering").

Every ordering returns ``perm`` (new -> old: row ``i`` of the reordered graph is node ``perm[i]``;
``x_new = x_old[perm]``), sees the structure only (the pattern of ``A + A^T``, without weights and
self loops), and can run block-wise (Algorithm 2) with ``parts > 1``.
"""
from __future__ import annotations

import numbers

import torch

from .._csr import inverse_permutation
from ._graph import SymGraph, as_edges, symmetrize
from .blockwise import blockwise
from .community import community
from .degsort import degsort
from .metis import metis
from .quality import tile_density
from .rcm import rcm
from .slashburn import slashburn

__all__ = ["METHODS", "inverse_permutation", "reorder", "tile_density"]


def _none(graph: SymGraph, *, seed: int = 0) -> torch.Tensor:
    """The given order (the baseline every ordering is measured against)."""
    return torch.arange(graph.num_nodes, device=graph.device)


_ORDERINGS = {
    "none": _none,
    "degsort": degsort,
    "slashburn": slashburn,
    "rcm": rcm,
    "metis": metis,
    "community": community,
}
METHODS = tuple(_ORDERINGS)


def reorder(
    graph,
    method: str = "community",
    *,
    num_nodes: int | None = None,
    parts: int = 1,
    seed: int = 0,
    progress: bool | None = None,
    **method_options,
) -> torch.Tensor:
    r"""Compute a node ordering that puts neighbours at nearby ids.

    Args:
        graph: an ``edge_index`` ``[2, E]`` integer tensor (row 0 source, row 1 target, any
            device) with ``num_nodes``; a square ``scipy.sparse`` matrix; or any CSR object with
            ``rowptr``, ``col`` and ``shape`` (rows = destination nodes), e.g. ``TiledAdjacency``.
        method: one of :data:`METHODS`: ``"none"``, ``"degsort"``, ``"slashburn"``, ``"rcm"``,
            ``"metis"``, or ``"community"`` (default; label propagation in torch, runs on the GPU).
        num_nodes: node count; required with an ``edge_index``.
        parts: ``> 1`` reorders each of ``parts`` equal id ranges on its own (Algorithm 2), so
            node ids never leave their range.
        seed: seed of the randomized orderings (``community``, ``metis``); same input, seed and
            device type give the same ``perm``.
        progress: show a progress bar over the blocks; ``None`` shows one for long runs only
            (needs tqdm).
        **method_options: passed to the method, e.g. ``cluster_size``, ``coarse_parts``, ``workers`` (metis), ``k``
            (slashburn), ``rounds``, ``max_size`` and ``group_size`` (community).

    Returns:
        ``perm``: ``int64 [n]`` permutation on the graph's device, new -> old.

    Example:
        >>> perm = reorder(edge_index, num_nodes=n)            # community order
        >>> x_new = x[perm]
        >>> edge_index_new = inverse_permutation(perm)[edge_index]
    """
    if method not in _ORDERINGS:
        raise ValueError(f"unknown reorder method {method!r}; expected one of {', '.join(METHODS)}")
    row, col, n = as_edges(graph, num_nodes)
    if not isinstance(parts, numbers.Integral) or not 1 <= parts <= max(n, 1):
        raise ValueError(f"parts must be an int in [1, num_nodes={n}], got {parts!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r} of type {type(seed).__name__}")
    pattern = symmetrize(row, col, n)
    ordering = _ORDERINGS[method]

    def order(block: SymGraph) -> torch.Tensor:
        return ordering(block, seed=seed, **method_options)

    suffix = f"-blockwise{parts}" if parts > 1 else ""
    return blockwise(pattern, order, int(parts), progress, desc=f"reorder[{method}{suffix}]")

"""Block-wise reordering (Algorithm 2 of Miao et al. 2023): reorder each diagonal block alone."""
from __future__ import annotations

from typing import Callable

import torch

from ._graph import SymGraph
from ._progress import LONG_RUN_EDGES, maybe_tqdm

_MANY_PARTS = 64  # so many blocks that a bar helps even on a small graph


def blockwise(
    graph: SymGraph,
    order: Callable[[SymGraph], torch.Tensor],
    parts: int,
    progress: bool | None = None,
    desc: str = "reorder",
) -> torch.Tensor:
    """``perm[s:e] = order(A[s:e, s:e]) + s`` over the ranges ``[i*n//parts, (i+1)*n//parts)``.

    Ids never leave their range, so the edge count of every block of the ``parts x parts`` grid,
    and with it the per-rank load of row-wise sharding, stays as it was. Edges between ranges are
    ignored by the orderings. ``parts=1`` orders the whole graph.
    """
    n = graph.num_nodes
    if n == 0:  # some host orderings (scipy's RCM) reject an empty matrix
        return torch.zeros(0, dtype=torch.long, device=graph.device)
    if progress is None:
        progress = graph.num_edges > LONG_RUN_EDGES or parts >= _MANY_PARTS
    bounds = [i * n // parts for i in range(parts + 1)]
    pieces = []
    for start, end in maybe_tqdm(list(zip(bounds[:-1], bounds[1:])), progress, desc):
        block = graph if parts == 1 else graph.diagonal_block(start, end)
        pieces.append(order(block) + start)
    return torch.cat(pieces)


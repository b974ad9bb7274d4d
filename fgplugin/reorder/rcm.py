"""Reverse Cuthill-McKee: BFS-based bandwidth reduction, on the host."""
from __future__ import annotations

import torch

from ._graph import SymGraph


def rcm(graph: SymGraph, *, seed: int = 0) -> torch.Tensor:
    """scipy's reverse Cuthill-McKee on the symmetric pattern. Deterministic; ``seed`` is unused."""
    import scipy.sparse.csgraph  # here, not at import: fgplugin.reorder's other orderings need no scipy

    order = scipy.sparse.csgraph.reverse_cuthill_mckee(graph.to_scipy(), symmetric_mode=True)
    return torch.from_numpy(order.astype("int64")).to(graph.device)

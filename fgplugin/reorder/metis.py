"""METIS clustering order (PAPER.md section 2): clusters of ~200 nodes, each one id range."""
from __future__ import annotations

import math

import numpy as np
import torch

from ._graph import SymGraph


def metis(graph: SymGraph, *, seed: int = 0, cluster_size: int = 200) -> torch.Tensor:
    """Partition into ``ceil(n / cluster_size)`` parts with pymetis; number parts contiguously.

    Nodes keep their original relative order inside a cluster. Isolated nodes go wherever METIS
    puts them (it balances part sizes).
    """
    if cluster_size < 1:
        raise ValueError(f"cluster_size must be >= 1, got {cluster_size}")
    try:
        import pymetis
    except ImportError as err:
        raise ImportError("reorder method 'metis' needs pymetis: pip install pymetis") from err
    n = graph.num_nodes
    nparts = math.ceil(n / cluster_size)
    if nparts <= 1 or graph.num_edges == 0:
        # One cluster, or nothing to cluster: METIS would only shuffle ids.
        return torch.arange(n, device=graph.device)
    xadj = graph.rowptr().cpu().numpy()
    adjncy = graph.col.cpu().numpy()
    options = pymetis.Options(seed=int(seed) % 2**31)  # METIS takes a C int
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2 deprecates the xadj/adjncy keywords
        result = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj, adjncy), options=options)
    else:
        result = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy, options=options)
    membership = torch.from_numpy(np.asarray(result[1], dtype=np.int64))
    return torch.argsort(membership, stable=True).to(graph.device)

"""SlashBurn (Kang & Faloutsos 2011; PAPER.md section 2): hubs first, small components last."""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse.csgraph
import torch

from ._graph import SymGraph


def slashburn(graph: SymGraph, *, seed: int = 0, k: int | None = None) -> torch.Tensor:
    """SlashBurn ordering, computed on the host with scipy. Deterministic; ``seed`` is unused.

    Each iteration removes the ``k`` highest-degree nodes of the current giant component (they take
    the lowest free ids), splits the rest into connected components, gives the nodes outside the
    giant component the highest free ids (larger components nearer the middle) and continues on
    the giant component until at most ``k`` nodes remain. Ties go to the smaller id.

    Args:
        k: hubs per iteration; default ``ceil(0.005 * n)``.
    """
    n = graph.num_nodes
    k = max(1, math.ceil(0.005 * n)) if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    adj = graph.to_scipy()
    nodes = np.arange(n)  # original id of each row of the shrinking `adj`
    front, back = [], []
    while nodes.size > k:
        hubs = np.argsort(-np.diff(adj.indptr), kind="stable")[:k]
        front.append(nodes[hubs])
        rest = np.ones(nodes.size, dtype=bool)
        rest[hubs] = False
        adj, nodes = _induced(adj, rest), nodes[rest]
        _, comp = scipy.sparse.csgraph.connected_components(adj, directed=False)
        sizes = np.bincount(comp)
        in_giant = comp == np.argmax(sizes)
        spokes = np.flatnonzero(~in_giant)
        # Spoke order: larger components first, then component, then id (lexsort: last key first).
        order = np.lexsort((spokes, comp[spokes], -sizes[comp[spokes]]))
        back.append(nodes[spokes[order]])
        adj, nodes = _induced(adj, in_giant), nodes[in_giant]
    front.append(nodes[np.argsort(-np.diff(adj.indptr), kind="stable")])
    # Spokes found first sit at the very end.
    perm = np.concatenate(front + back[::-1]).astype(np.int64)
    return torch.from_numpy(perm).to(graph.device)


def _induced(adj, keep: np.ndarray):
    return adj[keep][:, keep]

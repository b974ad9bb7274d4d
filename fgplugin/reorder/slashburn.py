"""SlashBurn (Kang & Faloutsos 2011): hubs first, small components last."""
from __future__ import annotations

import math

import torch

from ._graph import SymGraph, connected_components, lexsort
from ._progress import LONG_RUN_EDGES, maybe_tqdm


def slashburn(graph: SymGraph, *, seed: int = 0, k: int | None = None) -> torch.Tensor:
    """SlashBurn ordering in torch ops, on the graph's device. Deterministic; ``seed`` is unused.

    Each iteration removes the ``k`` highest-degree nodes of the current giant component (they take
    the lowest free ids), splits the rest into connected components, gives the nodes outside the
    giant component the highest free ids (larger components nearer the middle; then by component,
    then by id) and continues on the giant component until at most ``k`` nodes remain. Degrees are
    those inside the current giant component; ties go to the smaller id, and between equally
    large components the giant is the one holding the smallest id.

    Community graphs barely fragment, so this takes up to ``n / k`` (200) iterations, each a few
    passes over the remaining edges: it runs on the GPU (products-like, 120M edges, on an H100:
    see benchmarks/results/h100/reorder.json), where the former scipy version (an induced
    submatrix and a host connected-components pass per iteration) ran for minutes.

    Args:
        k: hubs per iteration; default ``ceil(0.005 * n)``.
    """
    n, device = graph.num_nodes, graph.device
    k = max(1, math.ceil(0.005 * n)) if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    row, col = graph.row, graph.col
    alive = torch.ones(n, dtype=torch.bool, device=device)  # in the current giant component
    nodes = torch.arange(n, device=device)  # the alive ids, ascending
    front, back = [], []
    # At most n / k iterations (each removes >= k nodes); a bar for the big graphs.
    bar = maybe_tqdm(None, graph.num_edges > LONG_RUN_EDGES, "slashburn", total=-(-n // k), unit="round")
    while nodes.numel() > k:
        if bar is not None:
            bar.update()
        degree = torch.bincount(row, minlength=n)
        hubs = nodes[torch.argsort(-degree[nodes], stable=True)[:k]]
        front.append(hubs)
        alive[hubs] = False
        keep = alive[row] & alive[col]
        row, col = row[keep], col[keep]
        nodes = nodes[alive[nodes]]
        component = connected_components(row, col, n)[nodes]
        sizes = torch.bincount(component, minlength=n)
        in_giant = component == torch.argmax(sizes)  # argmax: first maximum = smallest id
        spokes, spoke_comp = nodes[~in_giant], component[~in_giant]
        back.append(spokes[lexsort([-sizes[spoke_comp], spoke_comp])])
        alive[spokes] = False
        keep = alive[row]  # an edge lies inside one component: one end decides
        row, col = row[keep], col[keep]
        nodes = nodes[in_giant]
    if bar is not None:
        bar.close()
    degree = torch.bincount(row, minlength=n)
    front.append(nodes[torch.argsort(-degree[nodes], stable=True)])
    # Spokes found first sit at the very end.
    return torch.cat(front + back[::-1])

"""METIS clustering order: clusters of ~200 nodes, each one id range."""
from __future__ import annotations

import math
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import torch

from ._graph import SymGraph
from ._progress import LONG_RUN_EDGES, maybe_tqdm

# Above this many clusters, partition in two levels (see `metis`).
_SINGLE_LEVEL_MAX_PARTS = 512


def metis(graph: SymGraph, *, seed: int = 0, cluster_size: int = 200, coarse_parts: int | None = None,
          workers: int | None = None) -> torch.Tensor:
    """Partition into ``ceil(n / cluster_size)`` clusters with pymetis; number clusters contiguously.

    Nodes keep their original relative order inside a cluster. Isolated nodes go wherever METIS
    puts them (it balances part sizes).

    Large graphs are partitioned in two levels: METIS first splits the graph into
    ``coarse_parts`` parts, then each part's induced subgraph into clusters of ``cluster_size``,
    in ``workers`` processes. Why: one k-way call with n/200 parts (12,245 on products-like) does
    its initial partitioning on a coarsest graph of a size proportional to k, single-threaded (and
    pymetis holds the GIL and copies its input element by element), which ran past five minutes on
    products-like; splitting first keeps every call small and uses every core. Both levels
    minimize the edge cut; an edge cut by the first level would be cut by a flat k-way split too.

    Args:
        cluster_size: target nodes per cluster.
        coarse_parts: first-level parts; default 1 (one level) up to 512 clusters, else
            ``clamp(clusters // 128, 16, 64)``.
        workers: processes for the second level; default the usable CPU count (at most
            ``coarse_parts``). The result does not depend on it. They are spawned, so each runs
            the calling script again: call this from under ``if __name__ == "__main__":`` (else
            the clusters are made in this process, with a warning), or pass ``workers=1``.
    """
    if cluster_size < 1:
        raise ValueError(f"cluster_size must be >= 1, got {cluster_size}")
    try:
        import pymetis  # noqa: F401
    except ImportError as err:
        raise ImportError("reorder method 'metis' needs pymetis: pip install pymetis") from err
    n = graph.num_nodes
    nparts = math.ceil(n / cluster_size)
    if nparts <= 1 or graph.num_edges == 0:
        # One cluster, or nothing to cluster: METIS would only shuffle ids.
        return torch.arange(n, device=graph.device)
    if coarse_parts is None:
        coarse_parts = 1 if nparts <= _SINGLE_LEVEL_MAX_PARTS else min(max(nparts // 128, 16), 64)
    if coarse_parts < 1:
        raise ValueError(f"coarse_parts must be >= 1, got {coarse_parts}")
    rowptr, col = graph.rowptr(), graph.col
    if coarse_parts == 1 or coarse_parts >= nparts:
        membership = torch.from_numpy(_part_graph(rowptr.cpu().numpy(), col.cpu().numpy(), nparts, seed))
        return torch.argsort(membership, stable=True).to(graph.device)

    coarse = torch.from_numpy(_part_graph(rowptr.cpu().numpy(), col.cpu().numpy(), coarse_parts, seed))
    coarse = coarse.to(graph.device)
    jobs, members = _coarse_blocks(graph, coarse, coarse_parts, cluster_size, seed)
    workers = min(len(jobs), workers or len(os.sched_getaffinity(0)))
    show = graph.num_edges > LONG_RUN_EDGES  # the second level of a big graph runs for a minute or more
    clusters = None
    if workers > 1:
        # spawn, not fork: the parent may hold CUDA and OpenMP state that a forked child must not touch.
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                results = pool.map(_part_graph_star, jobs)
                clusters = list(maybe_tqdm(results, show, "metis: clusters per part", total=len(jobs), unit="part"))
        except BrokenProcessPool:
            warnings.warn("reorder 'metis': its worker processes could not start, so the clusters are made in this "
                          "process. A spawned worker runs the calling script again: a script that reorders at its "
                          "top level needs an `if __name__ == \"__main__\":` guard, or pass workers=1.",
                          RuntimeWarning, stacklevel=2)
    if clusters is None:
        clusters = [_part_graph(*job) for job in maybe_tqdm(jobs, show, "metis: clusters per part", unit="part")]
    order = [nodes[torch.argsort(torch.from_numpy(c).to(nodes.device), stable=True)]
             for nodes, c in zip(members, clusters)]
    return torch.cat(order)


def _coarse_blocks(graph: SymGraph, coarse: torch.Tensor, coarse_parts: int, cluster_size: int, seed: int):
    """Per first-level part: the pymetis job ``(xadj, adjncy, clusters, seed)`` of its induced
    subgraph (local ids in ascending original id), and its nodes (original ids, ascending)."""
    n = graph.num_nodes
    members_order = torch.argsort(coarse, stable=True)  # parts in turn, ascending ids inside
    sizes = torch.bincount(coarse, minlength=coarse_parts)
    starts = torch.cumsum(sizes, 0) - sizes
    local = torch.empty(n, dtype=torch.long, device=graph.device)
    local[members_order] = torch.arange(n, device=graph.device) - starts[coarse[members_order]]
    inside = coarse[graph.row] == coarse[graph.col]
    row, col = graph.row[inside], graph.col[inside]
    part_of_edge = coarse[row]
    # Edges are sorted by (row, col) and local ids keep the id order, so a stable sort by part
    # leaves every part's edges sorted by (local row, local col): CSR order.
    by_part = torch.argsort(part_of_edge, stable=True)
    row, col = local[row[by_part]], local[col[by_part]]
    edge_counts = torch.bincount(part_of_edge, minlength=coarse_parts)
    jobs, members = [], []
    for p, (nodes, rows, cols) in enumerate(zip(members_order.split(sizes.tolist()), row.split(edge_counts.tolist()),
                                                col.split(edge_counts.tolist()))):
        m = nodes.numel()
        xadj = torch.zeros(m + 1, dtype=torch.long, device=rows.device)
        xadj[1:] = torch.cumsum(torch.bincount(rows, minlength=m), 0)
        jobs.append((xadj.cpu().numpy(), cols.cpu().numpy(), max(1, math.ceil(m / cluster_size)), seed + p))
        members.append(nodes)
    return jobs, members


def _part_graph(xadj: np.ndarray, adjncy: np.ndarray, nparts: int, seed: int) -> np.ndarray:
    """pymetis k-way membership (int64 per node); one part needs no call."""
    import pymetis

    if nparts <= 1 or adjncy.size == 0:
        return np.zeros(xadj.size - 1, dtype=np.int64)
    options = pymetis.Options(seed=int(seed) % 2**31)  # METIS takes a C int
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2 deprecates the xadj/adjncy keywords
        result = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj, adjncy), options=options)
    else:
        result = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy, options=options)
    return np.asarray(result[1], dtype=np.int64)


def _part_graph_star(job):
    return _part_graph(*job)

"""Input normalisation for the orderings: any supported graph -> one symmetric, loop-free pattern.

Orderings look at structure only, so every input (an ``edge_index``, a ``scipy.sparse`` matrix, or a
CSR object with ``rowptr``/``col``/``shape`` such as ``TiledAdjacency``) becomes the same
:class:`SymGraph`: the pattern of ``A + A^T`` without self loops or duplicates, sorted by
(row, col), on the graph's own device.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..validation import check_csr, check_node_count

if TYPE_CHECKING:
    import scipy.sparse


@dataclass(frozen=True)
class SymGraph:
    """A symmetric adjacency pattern as sorted COO: ``(row[k], col[k])`` for each stored entry."""

    row: torch.Tensor  # int64 [E], sorted; equal rows ordered by col
    col: torch.Tensor  # int64 [E]
    num_nodes: int

    @property
    def device(self) -> torch.device:
        return self.row.device

    @property
    def num_edges(self) -> int:
        return self.row.numel()

    def degree(self) -> torch.Tensor:
        return torch.bincount(self.row, minlength=self.num_nodes)

    def rowptr(self) -> torch.Tensor:
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        return torch.cat([zero, self.degree().cumsum(0)])

    def diagonal_block(self, start: int, end: int) -> SymGraph:
        """``A[start:end, start:end]`` with ids shifted to ``0 .. end-start-1``."""
        bounds = torch.tensor([start, end], dtype=torch.long, device=self.device)
        lo, hi = torch.searchsorted(self.row, bounds).tolist()
        row, col = self.row[lo:hi], self.col[lo:hi]
        inside = (col >= start) & (col < end)
        return SymGraph(row[inside] - start, col[inside] - start, end - start)

    def to_scipy(self) -> scipy.sparse.csr_matrix:
        """Host CSR with unit values, for the scipy / METIS based orderings."""
        import scipy.sparse  # here: see as_edges

        n = self.num_nodes
        data = np.ones(self.num_edges, dtype=np.int8)
        indptr = self.rowptr().cpu().numpy()
        return scipy.sparse.csr_matrix((data, self.col.cpu().numpy(), indptr), shape=(n, n))


def as_edges(graph, num_nodes: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(row, col, n)`` of a square graph; ``row`` = destination, ``col`` = source (as in CSR)."""
    if isinstance(graph, torch.Tensor):
        return _from_edge_index(graph, num_nodes)
    # scipy.sparse is imported where a scipy ordering runs: its import is most of a small graph's
    # first reordering in a fresh process (0.16 s of 0.2 s on a 2-core CPU), and a scipy matrix
    # exists only where scipy.sparse was imported
    scipy_sparse = sys.modules.get("scipy.sparse")
    if scipy_sparse is not None and scipy_sparse.issparse(graph):
        n = _square_size(graph.shape, num_nodes, "scipy.sparse matrix")
        coo = graph.tocoo()
        row, col = (torch.from_numpy(ids.astype(np.int64)) for ids in (coo.row, coo.col))
        return row, col, n
    if all(hasattr(graph, a) for a in ("rowptr", "col", "shape")):
        n = _square_size(tuple(graph.shape), num_nodes, type(graph).__name__)
        rowptr, col, _ = check_csr(graph.rowptr, graph.col, (n, n))  # any object with these three: checked here
        row = torch.repeat_interleave(torch.arange(n, device=rowptr.device), rowptr.diff())
        return row, col, n
    raise TypeError(
        f"cannot reorder a {type(graph).__name__}; expected an edge_index LongTensor [2, E] with "
        "num_nodes, a square scipy.sparse matrix, or a CSR object with rowptr, col and shape"
    )


def symmetrize(row: torch.Tensor, col: torch.Tensor, n: int) -> SymGraph:
    """Pattern of ``A + A^T`` without self loops and duplicates, sorted by (row, col)."""
    off_diagonal = row != col
    row, col = row[off_diagonal], col[off_diagonal]
    # One int64 key per entry, sorted and deduplicated: order by (row, col). n < 3e9 fits.
    key = sorted_unique(torch.cat([row * n + col, col * n + row]))
    return SymGraph(key // n, key % n, n)


def sorted_unique(keys: torch.Tensor, return_counts: bool = False):
    """``torch.unique(keys, return_counts=...)`` for int64 keys, twice as fast on the CPU.

    A plain (unstable) sort of the values followed by a run-length pass: equal keys are
    indistinguishable, so the order among them cannot matter, and ``torch.unique`` pays for more.
    """
    return torch.unique_consecutive(torch.sort(keys).values, return_counts=return_counts)


def lexsort(keys: list[torch.Tensor]) -> torch.Tensor:
    """Permutation sorting by ``keys[0]``, then ``keys[1]``, ..., then index (stable sorts)."""
    perm = torch.arange(keys[0].numel(), device=keys[0].device)
    for key in reversed(keys):
        perm = perm[torch.argsort(key[perm], stable=True)]
    return perm


def connected_components(row: torch.Tensor, col: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Component label per node = the smallest node id of its component (symmetric edge list).

    Hook-and-shortcut in torch ops (so it runs on the GPU): every root hooks to the smallest root
    among its neighbours' roots (``scatter_reduce`` amin), then pointer jumping flattens the
    trees. Parents only decrease, so no cycles form, and the root of a tree is its smallest id:
    the same labels, in the same order, as ``scipy.sparse.csgraph.connected_components``'.
    """
    parent = torch.arange(num_nodes, device=row.device)
    while True:
        root_row, root_col = parent[row], parent[col]
        if torch.equal(root_row, root_col):
            return parent
        parent.scatter_reduce_(0, root_row, root_col, "amin")
        while True:
            grand = parent[parent]
            if torch.equal(grand, parent):
                break
            parent = grand


def _from_edge_index(edge_index: torch.Tensor, num_nodes: int | None):
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must be int64 (or int32), got {edge_index.dtype}")
    if num_nodes is None:
        raise ValueError(
            "num_nodes is required with an edge_index "
            "(isolated nodes make edge_index.max() + 1 wrong)"
        )
    n = check_node_count(num_nodes, "num_nodes")
    edge_index = edge_index.long()
    if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= n):
        lo, hi = edge_index.min().item(), edge_index.max().item()
        raise ValueError(f"edge_index holds ids in [{lo}, {hi}], outside [0, num_nodes={n})")
    return edge_index[1], edge_index[0], n


def _square_size(shape: tuple, num_nodes: int | None, what: str) -> int:
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"reordering needs a square adjacency, got a {what} of shape {shape}")
    if num_nodes is not None and int(num_nodes) != shape[0]:
        raise ValueError(f"num_nodes={num_nodes} does not match the {what}'s shape {tuple(shape)}")
    return int(shape[0])

"""``TiledAdjacency``: one graph's adjacency prepared for block-adaptive SpMM (DESIGN.md).

Rows are destination nodes and columns source nodes, so ``spmm(adj, x)`` aggregates messages
from sources into destinations the way PyG's ``source_to_target`` flow and DGL's ``update_all``
do. A holds the graph's edges without added self loops; normalization is kept apart as row and
column scales plus a per-node diagonal term, so one plan serves every layer
(see fgplugin/normalization.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._csr import index_dtype_for, inverse_permutation, rows_of_edges, rowptr_from_sorted_rows
from .autotune import DEFAULT_THRESHOLD
from .validation import check_csr, check_edge_index, check_edge_values, check_perm, check_tile_options


@dataclass
class TilePlan:
    """Classification of the T x T tiles of A into dense tiles and the sparse remainder.

    A tile is dense when its non-zero count exceeds ``threshold * T * T`` (strictly); with
    ``threshold="auto"`` the CUDA kernel's plan picks its threshold per graph (fgplugin.autotune)
    and these host-side statistics use the default 0.05. Dense tiles
    are listed per row panel (rows ``[p*T, (p+1)*T)``) in CSR form: ``panel_ptr`` [n_panels + 1]
    indexes ``tile_col`` (column-panel index of each dense tile, ascending within a panel) and
    ``tile_nnz`` (its non-zero count). Everything outside dense tiles is the sparse remainder.
    """

    tile_size: int
    threshold: float | str
    panel_ptr: torch.Tensor
    tile_col: torch.Tensor
    tile_nnz: torch.Tensor
    nnz_dense: int

    @property
    def num_dense_tiles(self) -> int:
        return self.tile_col.numel()


def tile_counts(rowptr: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], tile_size: int):
    """``(tiles, counts)``: the ids of the non-empty ``tile_size`` tiles (row panel *
    column panels + column panel, ascending) and their non-zero counts."""
    n_col_panels = max(1, -(-shape[1] // tile_size))
    rows = rows_of_edges(rowptr, col.numel())
    keys = (rows // tile_size) * n_col_panels + col.long() // tile_size
    return torch.unique(keys, return_counts=True)


def build_tile_plan(rowptr: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], tile_size: int,
                    threshold: float) -> TilePlan:
    n_rows, n_cols = shape
    n_panels = -(-n_rows // tile_size)
    n_col_panels = max(1, -(-n_cols // tile_size))
    tiles, counts = tile_counts(rowptr, col, shape, tile_size)
    density = DEFAULT_THRESHOLD if threshold == "auto" else threshold
    dense = counts > density * tile_size * tile_size
    dense_tiles = tiles[dense]
    panel_of_tile = dense_tiles // n_col_panels
    return TilePlan(
        tile_size=tile_size,
        threshold=threshold,
        panel_ptr=rowptr_from_sorted_rows(panel_of_tile, n_panels, rowptr.dtype),
        tile_col=(dense_tiles % n_col_panels).to(rowptr.dtype),
        tile_nnz=counts[dense].to(torch.int32),
        nnz_dense=int(counts[dense].sum()),
    )


class TiledAdjacency:
    r"""Adjacency of one graph in CSR with a T x T tile plan, for :func:`fgplugin.spmm`.

    Build it with :meth:`from_edge_index`, :meth:`from_csr` or :meth:`from_scipy`; layers and
    transforms do this for you. The object computes

    .. math::
        \mathrm{out} = \mathrm{diag}(r) \, (A + \mathrm{diag}(d)) \, \mathrm{diag}(c) \, X

    through ``fgplugin.spmm(adj, x, r, c, d)``; ``adj.norm("gcn")`` (and DGL's norms, ``"mean"``)
    gives ``(r, c, d)``.

    Attributes:
        shape: ``(num_dst_nodes, num_src_nodes)``; square for full-graph training.
        rowptr, col: CSR (int32 while every index fits, int64 beyond), columns sorted per row
            when built from an edge list.
        values: edge weights in CSR order, or ``None`` for unit weights (costs no bytes).
        edge_perm: CSR position -> position in the edge list it was built from, or ``None``.
        tiles: the :class:`TilePlan`.
        perm, inv_perm: node permutation of a reordered graph (``perm``: new -> old, so
            ``x_new = x_old[perm]``; ``inv_perm``: old -> new), or ``None``.
    """

    def __init__(self, rowptr, col, values, shape, *, tile_size=32, threshold=0.05, edge_perm=None, perm=None,
                 tiles=None, _shared=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.rowptr = rowptr
        self.col = col
        self.values = values
        self.edge_perm = edge_perm
        self.perm = perm
        self.inv_perm = None if perm is None else inverse_permutation(perm)
        self.tiles = tiles if tiles is not None else build_tile_plan(rowptr, col, self.shape, tile_size, threshold)
        # Caches that depend on the structure only (transpose, degrees, self loops), shared with
        # the copies made by with_values(); and caches that depend on the values (normalizations).
        self._shared = {} if _shared is None else _shared
        self._cache = {}

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_edge_index(cls, edge_index, num_nodes=None, edge_weight=None, *, size=None, tile_size=32,
                        threshold=0.05, index_dtype=None, keep_edge_order=True, perm=None) -> "TiledAdjacency":
        """From a PyG-style ``edge_index`` [2, E] (row 0 = source, row 1 = target).

        Args:
            num_nodes (int, optional): number of nodes of a square graph; inferred as
                ``edge_index.max() + 1`` when omitted (pass it when the last nodes are isolated).
            edge_weight (Tensor, optional): [E] finite edge weights; duplicate edges are summed.
            size ((int, int), optional): ``(num_src_nodes, num_dst_nodes)`` of a bipartite graph,
                PyG's ``size`` convention; excludes ``num_nodes``.
            tile_size, threshold: tile plan options (T, dense when nnz > threshold * T * T).
            index_dtype: force ``torch.int32`` or ``torch.int64`` indices (default: int32 while
                everything fits).
            keep_edge_order: keep ``edge_perm`` so that later per-edge tensors given in edge-list
                order can be mapped onto the CSR (:meth:`with_values`).
            perm: node permutation to record (new -> old); the graph itself is taken as given.
        """
        check_tile_options(tile_size, threshold)
        edge_index = check_edge_index(edge_index)
        n_src, n_dst = _resolve_size(edge_index, num_nodes, size)
        num_edges = edge_index.shape[1]
        if edge_weight is not None:
            edge_weight = check_edge_values(edge_weight, num_edges, "edge_weight", edge_index.device)
        dtype = index_dtype or index_dtype_for(num_edges, n_dst, n_src)
        src, dst = edge_index[0], edge_index[1]
        order = _sort_by_row_then_col(dst, src, n_src)
        rows = dst[order]
        rowptr = rowptr_from_sorted_rows(rows, n_dst, dtype)
        col = src[order].to(dtype)
        values = None if edge_weight is None else edge_weight[order]
        edge_perm = order.to(dtype) if keep_edge_order else None
        if perm is not None:
            perm = check_perm(perm, n_dst, edge_index.device) if n_src == n_dst else _refuse_perm_rectangular()
        return cls(rowptr, col, values, (n_dst, n_src), tile_size=tile_size, threshold=threshold,
                   edge_perm=edge_perm, perm=perm)

    @classmethod
    def from_csr(cls, rowptr, col, values=None, *, shape=None, tile_size=32, threshold=0.05, index_dtype=None,
                 perm=None) -> "TiledAdjacency":
        """From CSR arrays with rows = destination nodes; ``shape`` defaults to square."""
        check_tile_options(tile_size, threshold)
        rowptr, col, shape = check_csr(rowptr, col, shape)
        if values is not None:
            values = check_edge_values(values, col.numel(), "values", col.device)
        dtype = index_dtype or index_dtype_for(col.numel(), shape[0], shape[1])
        if perm is not None:
            perm = check_perm(perm, shape[0], col.device) if shape[0] == shape[1] else _refuse_perm_rectangular()
        return cls(rowptr.to(dtype), col.to(dtype), values, shape, tile_size=tile_size, threshold=threshold,
                   perm=perm)

    @classmethod
    def from_scipy(cls, matrix, **options) -> "TiledAdjacency":
        """From a ``scipy.sparse`` matrix (rows = destination nodes); its data become edge weights
        unless every entry is 1."""
        csr = matrix.tocsr()
        data = torch.from_numpy(csr.data.astype("float32"))
        values = None if bool((data == 1).all()) else data
        return cls.from_csr(torch.from_numpy(csr.indptr.astype("int64")), torch.from_numpy(csr.indices.astype("int64")),
                            values, shape=csr.shape, **options)

    def with_values(self, edge_values) -> "TiledAdjacency":
        """The same structure (and plan) with new edge weights, or ``None`` for unit weights.
        Differentiable. The weights come in the order of the edge list this adjacency was built
        from (``from_edge_index``), or in CSR order when it was built from CSR or scipy. The
        finite-value check is skipped under torch.compile, where it would need a host sync."""
        if edge_values is not None:
            edge_values = check_edge_values(edge_values, self.nnz, "edge values", self.device,
                                            check_finite=not torch.compiler.is_compiling())
            if self.edge_perm is not None:
                edge_values = edge_values[self.edge_perm.long()]
        clone = TiledAdjacency(self.rowptr, self.col, edge_values, self.shape, edge_perm=self.edge_perm,
                               tiles=self.tiles, _shared=self._shared)
        clone.perm, clone.inv_perm = self.perm, self.inv_perm
        return clone

    def with_tiles(self, tile_size=None, threshold=None) -> "TiledAdjacency":
        """The same graph with a tile plan of another tile size or density threshold."""
        tile_size = self.tiles.tile_size if tile_size is None else tile_size
        threshold = self.tiles.threshold if threshold is None else threshold
        check_tile_options(tile_size, threshold)
        clone = TiledAdjacency(self.rowptr, self.col, self.values, self.shape, tile_size=tile_size,
                               threshold=threshold, edge_perm=self.edge_perm, _shared=self._shared)
        clone.perm, clone.inv_perm = self.perm, self.inv_perm
        return clone

    # ------------------------------------------------------------------ structure
    @property
    def nnz(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.col.device

    @property
    def is_square(self) -> bool:
        return self.shape[0] == self.shape[1]

    @property
    def num_nodes(self) -> int:
        if not self.is_square:
            raise ValueError(f"num_nodes is defined for square adjacencies; this one is {self.shape} "
                             "(num_dst_nodes, num_src_nodes)")
        return self.shape[0]

    @property
    def dense_share(self) -> float:
        """Share of the non-zeros that sit in dense tiles."""
        return self.tiles.nnz_dense / self.nnz if self.nnz else 0.0

    def transpose(self):
        """CSR of A^T as ``(t_rowptr, t_col, t_perm)``, built on first use and cached.

        ``t_perm`` maps each non-zero of A^T to its position in A's CSR (so ``t_values =
        values[t_perm]``). When A is structurally symmetric the arrays of A are reused.
        """
        cached = self._shared.get("transpose")
        if cached is not None:
            return cached
        n_rows, n_cols = self.shape
        rows = rows_of_edges(self.rowptr, self.nnz)
        t_perm = torch.argsort(self.col, stable=True)  # A's CSR is row-sorted: rows stay sorted per column
        t_col = rows[t_perm].to(self.col.dtype)
        t_rowptr = rowptr_from_sorted_rows(self.col[t_perm], n_cols, self.rowptr.dtype)
        if self.is_square and not torch.compiler.is_compiling() and torch.equal(t_rowptr, self.rowptr) \
                and torch.equal(t_col, self.col):
            t_rowptr, t_col = self.rowptr, self.col  # symmetric: no second copy of the structure
        cached = (t_rowptr, t_col, t_perm.to(self.col.dtype))
        self._shared["transpose"] = cached
        return cached

    def in_degree(self, weighted: bool = False) -> torch.Tensor:
        """Number (or summed weight) of in-edges per destination node, as float."""
        if weighted and self.values is not None:
            rows = self._rows()
            return torch.zeros(self.shape[0], dtype=self.values.dtype, device=self.device).index_add_(0, rows, self.values)
        return (self.rowptr[1:] - self.rowptr[:-1]).to(torch.float32)

    def out_degree(self, weighted: bool = False) -> torch.Tensor:
        """Number (or summed weight) of out-edges per source node, as float."""
        weights = self.values if weighted and self.values is not None else torch.ones(
            self.nnz, dtype=torch.float32, device=self.device)
        return torch.zeros(self.shape[1], dtype=weights.dtype, device=self.device).index_add_(0, self.col.long(), weights)

    def self_loop_mask(self) -> torch.Tensor:
        """Bool [min(n_rows, n_cols)]: which nodes already have a self loop in A."""
        cached = self._shared.get("self_loops")
        if cached is None:
            rows = self._rows()
            loops = (rows == self.col.long()).to(torch.int32)
            # Counted with index_add (static shapes), not rows[loops] (nonzero): the mask is then
            # traceable by torch.compile on a graph it sees first.
            counts = torch.zeros(self.shape[0], dtype=torch.int32, device=self.device).index_add_(0, rows, loops)
            cached = counts[:min(self.shape)] > 0
            self._shared["self_loops"] = cached
        return cached

    def constant_diag(self, value: float, dtype: torch.dtype) -> torch.Tensor:
        """A cached [min(n_rows, n_cols)] vector filled with ``value`` (so a float ``diag`` costs
        no allocation per training step)."""
        key = ("diag", value, dtype)
        cached = self._shared.get(key)
        if cached is None:
            cached = torch.full((min(self.shape),), value, dtype=dtype, device=self.device)
            self._shared[key] = cached
        return cached

    def transposed_values(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (in CSR order, already cast) reordered for A^T; cached unless they need grad."""
        key = ("t_values", values.dtype)
        cached = self._cache.get(key)
        if cached is None:
            cached = values[self.transpose()[2].long()]
            if not values.requires_grad:
                self._cache[key] = cached
        return cached

    def norm(self, kind: str = "gcn", **options):
        """Row/column scales and diagonal of a normalization, cached: see fgplugin.normalization."""
        from .normalization import normalization

        key = (kind, tuple(sorted(options.items())))
        cached = self._cache.get(key)
        if cached is None:
            cached = normalization(self, kind, **options)
            if self.values is None or not self.values.requires_grad:
                self._cache[key] = cached
        return cached

    def _rows(self) -> torch.Tensor:
        return rows_of_edges(self.rowptr, self.nnz)

    # ------------------------------------------------------------------ devices, memory, pickling
    def to(self, device=None, non_blocking: bool = False, **_ignored) -> "TiledAdjacency":
        """A copy on ``device`` (plan, transpose and permutation included). Extra keyword
        arguments that ``torch.Tensor.to`` takes are accepted, so ``data.to(device)`` of a PyG
        ``Data`` that holds this object works."""
        if device is None or torch.device(device) == self.device:
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        tiles = TilePlan(self.tiles.tile_size, self.tiles.threshold, move(self.tiles.panel_ptr),
                         move(self.tiles.tile_col), move(self.tiles.tile_nnz), self.tiles.nnz_dense)
        shared = {}
        if "transpose" in self._shared:
            shared["transpose"] = tuple(move(t) for t in self._shared["transpose"])
        out = TiledAdjacency(move(self.rowptr), move(self.col), move(self.values), self.shape,
                             edge_perm=move(self.edge_perm), tiles=tiles, _shared=shared)
        out.perm, out.inv_perm = move(self.perm), move(self.inv_perm)
        return out

    def cpu(self) -> "TiledAdjacency":
        return self.to("cpu")

    def cuda(self, device=None) -> "TiledAdjacency":
        return self.to(torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"))

    def _tensors(self):
        yield from (self.rowptr, self.col, self.values, self.edge_perm, self.perm, self.inv_perm,
                    self.tiles.panel_ptr, self.tiles.tile_col, self.tiles.tile_nnz)
        transpose = self._shared.get("transpose")
        if transpose is not None:
            seen = {id(self.rowptr), id(self.col)}
            yield from (t for t in transpose if id(t) not in seen)

    @property
    def nbytes(self) -> int:
        """Bytes held by the structure, plan, transpose (if built) and permutations."""
        return sum(t.numel() * t.element_size() for t in self._tensors() if t is not None)

    def __getstate__(self):
        # Plain tensors, numbers and tuples only, so torch.load(weights_only=True) can read it back
        # (fgplugin registers this class with torch.serialization.add_safe_globals).
        tiles = self.tiles
        return {
            "shape": self.shape, "rowptr": self.rowptr, "col": self.col, "values": self.values,
            "edge_perm": self.edge_perm, "perm": self.perm,
            "tiles": (tiles.tile_size, tiles.threshold, tiles.panel_ptr, tiles.tile_col, tiles.tile_nnz, tiles.nnz_dense),
            "transpose": self._shared.get("transpose"),
        }

    def __setstate__(self, state):
        tile_size, threshold, panel_ptr, tile_col, tile_nnz, nnz_dense = state["tiles"]
        shared = {} if state["transpose"] is None else {"transpose": tuple(state["transpose"])}
        self.__init__(state["rowptr"], state["col"], state["values"], state["shape"], edge_perm=state["edge_perm"],
                      perm=state["perm"], tiles=TilePlan(tile_size, threshold, panel_ptr, tile_col, tile_nnz, nnz_dense),
                      _shared=shared)

    def __repr__(self) -> str:
        tiles = self.tiles
        return (f"TiledAdjacency(shape={self.shape}, nnz={self.nnz}, index={str(self.col.dtype).replace('torch.', '')}, "
                f"weighted={self.values is not None}, tiles={tiles.tile_size}x{tiles.tile_size} dense above "
                f"{_threshold_text(tiles.threshold)}: {tiles.num_dense_tiles} tiles holding {100 * self.dense_share:.1f}% of nnz, "
                f"reordered={self.perm is not None}, device={self.device}, nbytes={self.nbytes})")


def _threshold_text(threshold) -> str:
    return "auto (5% here)" if threshold == "auto" else f"{100 * threshold:.3g}%"


def _resolve_size(edge_index, num_nodes, size) -> tuple[int, int]:
    if size is not None:
        if num_nodes is not None:
            raise ValueError("pass either num_nodes (square graph) or size=(num_src_nodes, num_dst_nodes), not both")
        if len(size) != 2 or any(int(s) < 0 for s in size):
            raise ValueError(f"size must be (num_src_nodes, num_dst_nodes) with non-negative entries, got {size}")
        n_src, n_dst = int(size[0]), int(size[1])
    else:
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
        if int(num_nodes) < 0:
            raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
        n_src = n_dst = int(num_nodes)
    if edge_index.numel():
        for row, bound, what in ((0, n_src, "source"), (1, n_dst, "target")):
            largest = int(edge_index[row].max())
            if largest >= bound:
                hint = "num_nodes" if size is None else f"size[{row}]"
                raise ValueError(f"edge_index refers to {what} node {largest}, but the graph has only {bound} "
                                 f"{what} nodes; pass {hint} >= {largest + 1}")
    return n_src, n_dst


def _sort_by_row_then_col(rows: torch.Tensor, cols: torch.Tensor, n_cols: int) -> torch.Tensor:
    """Stable permutation that sorts edges by (row, col): columns ascending inside each row."""
    if rows.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=rows.device)
    if (int(rows.max()) + 1) * max(n_cols, 1) < 2**62:
        return torch.argsort(rows * max(n_cols, 1) + cols, stable=True)
    by_col = torch.argsort(cols, stable=True)  # keys would overflow int64: two stable passes
    return by_col[torch.argsort(rows[by_col], stable=True)]


def _refuse_perm_rectangular():
    raise ValueError("perm applies to square graphs (one node set); this adjacency is rectangular")

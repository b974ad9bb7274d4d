"""``TiledAdjacency``: one graph's adjacency prepared for block-adaptive SpMM (docs/design.md).

Rows are destination nodes and columns source nodes, so ``spmm(adj, x)`` aggregates messages
from sources into destinations the way PyG's ``source_to_target`` flow and DGL's ``update_all``
do. A holds the graph's edges without added self loops; normalization is kept apart as row and
column scales plus a per-node diagonal term, so one adjacency serves every layer
(see fgplugin/normalization.py). Everything the kernels need per graph (the transpose, the
threshold choice, the CUDA kernel plans) is built once and kept on the adjacency.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from . import autotune
from .capture_holds import capturing, hold
from .inference_mode import outside_inference_mode
from ._csr import index_dtype_for, inverse_permutation, rows_of_edges, rowptr_from_sorted_rows
from .kernel_plan import KernelPlan, block_adaptive_available, build_kernel_plan
from .normalization import normalization
from .stamps import pin, stamp, stampable
from .tile_density import DEFAULT_THRESHOLD, dense_tiles, tile_keys
from .validation import (check_csr, check_edge_index, check_edge_values, check_node_count, check_perm,
                         check_tile_options, refuse_spent_weights)

MAX_CONSTANT_DIAGS = 4  # float diagonals kept per dtype (constant_diag)
MAX_WEIGHTED_COPIES = 4  # copies with_values keeps per adjacency (one per set of weights in use)


def _forget_in(memo: dict, key: int):
    """A weak reference callback that drops ``memo[key]`` when its object dies (unless the entry
    was replaced since): a copy made for temporary weights must not outlive them."""
    def forget(ref):
        entry = memo.get(key)
        if entry is not None and entry[0] is ref:
            del memo[key]
    return forget


@dataclass
class TileStats:
    """Which ``T x T`` tiles of A are dense at ``threshold`` (fgplugin.tile_density): listed per row
    panel (rows ``[p*T, (p+1)*T)``) in CSR form, ``panel_ptr`` [n_panels + 1] indexing
    ``tile_col`` (column-panel index of each dense tile, ascending within a panel) and
    ``tile_nnz`` (its non-zero count). Host-side statistics; the CUDA kernel's own plan is
    :class:`fgplugin.kernel_plan.KernelPlan`."""

    tile_size: int
    threshold: float
    panel_ptr: torch.Tensor
    tile_col: torch.Tensor
    tile_nnz: torch.Tensor
    nnz_dense: int

    @property
    def num_dense_tiles(self) -> int:
        return self.tile_col.numel()


def tile_stats(rowptr: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], tile_size: int,
               threshold: float) -> TileStats:
    n_rows, n_cols = shape
    n_panels = -(-n_rows // tile_size)
    n_col_panels = max(1, -(-n_cols // tile_size))
    tiles, counts = torch.unique(tile_keys(rows_of_edges(rowptr, col.numel()), col, n_cols, tile_size),
                                 return_counts=True)
    dense = dense_tiles(counts, threshold, tile_size)
    dense_ids = tiles[dense]
    return TileStats(
        tile_size=tile_size,
        threshold=float(threshold),
        panel_ptr=rowptr_from_sorted_rows(dense_ids // n_col_panels, n_panels, rowptr.dtype),
        tile_col=(dense_ids % n_col_panels).to(rowptr.dtype),
        tile_nnz=counts[dense].to(torch.int32),
        nnz_dense=int(counts[dense].sum()),
    )


class TiledAdjacency:
    r"""Adjacency of one graph in CSR with its tiling options, for :func:`fgplugin.spmm`.

    Build it with :meth:`from_edge_index`, :meth:`from_csr` or :meth:`from_scipy`; layers and
    transforms do this for you. The object computes

    .. math::
        \mathrm{out} = \mathrm{diag}(r) \, (A + \mathrm{diag}(d)) \, \mathrm{diag}(c) \, X

    through ``fgplugin.spmm(adj, x, r, c, d)``; ``adj.norm("gcn")`` (and DGL's norms, ``"mean"``)
    gives ``(r, c, d)``.

    Attributes:
        shape: ``(num_dst_nodes, num_src_nodes)``; square for full-graph training.
        rowptr, col: CSR (int32 while every index fits, int64 beyond), columns sorted per row
            when built from an edge list. Never write them in place: what is built from the
            structure (transpose, degrees, kernel plans) would not see it; build a new adjacency.
        values: edge weights in CSR order, or ``None`` for unit weights (costs no bytes).
        edge_perm: CSR position -> position in the edge list it was built from, or ``None``.
        tile_size, threshold: tiles are ``tile_size`` square; one is dense above ``threshold``
            (a density, or ``"auto"``: chosen per graph and dtype class on the GPU by a short
            timed probe before the first kernel plan is built, none under 3M non-zeros;
            fgplugin.autotune).
        perm, inv_perm: node permutation of a reordered graph (``perm``: new -> old, so
            ``x_new = x_old[perm]``; ``inv_perm``: old -> new), or ``None``.
    """

    def __init__(self, rowptr, col, values, shape, *, tile_size=32, threshold="auto", edge_perm=None,
                 perm=None, _shared=None, _edge_order_dropped=False):
        self.shape = (int(shape[0]), int(shape[1]))
        if rowptr.dim() != 1 or rowptr.numel() != self.shape[0] + 1 or col.dim() != 1 or self.shape[1] < 0 or \
                (values is not None and values.shape != col.shape) or int(tile_size) < 1:
            raise ValueError(f"TiledAdjacency: rowptr must have shape[0] + 1 = {self.shape[0] + 1} entries (it has "
                             f"{rowptr.numel()}), values one per entry of col, tile_size >= 1; build it with "
                             "TiledAdjacency.from_edge_index or from_csr, which check the whole graph")
        self.rowptr = rowptr
        self.col = col
        self._values = values
        self.edge_perm = edge_perm
        # built from an edge list whose order was not kept: per-edge values in that order cannot be mapped
        self._edge_order_dropped = bool(_edge_order_dropped)
        self.tile_size = int(tile_size)
        self.threshold = threshold
        self._perm, self._inv_perm = perm, None
        # Caches that depend on the structure only (transpose, degrees, self loops, threshold
        # choices, kernel plans), shared with the copies made by with_values(); and caches that
        # depend on the values (normalizations, the op's arguments), each kept with the values'
        # version so that an in-place write to them is seen (_kept_for_values).
        self._shared = {} if _shared is None else _shared
        self._cache = {}
        self._calls = {}  # fgplugin.spmm's decided calls (fgplugin.repeated_calls)

    # ------------------------------------------------------------------ constructors
    @classmethod
    @outside_inference_mode
    def from_edge_index(cls, edge_index, num_nodes=None, edge_weight=None, *, size=None, tile_size=32,
                        threshold="auto", index_dtype=None, keep_edge_order=True,
                        perm=None) -> "TiledAdjacency":
        """From a PyG-style ``edge_index`` [2, E] (row 0 = source, row 1 = target).

        Args:
            num_nodes (int, optional): number of nodes of a square graph; inferred as
                ``edge_index.max() + 1`` when omitted (pass it when the last nodes are isolated).
            edge_weight (Tensor, optional): [E] finite edge weights; duplicate edges are summed.
            size ((int, int), optional): ``(num_src_nodes, num_dst_nodes)`` of a bipartite graph,
                PyG's ``size`` convention; excludes ``num_nodes``.
            tile_size, threshold: tiling options (T, dense when nnz > threshold * T * T, or
                ``"auto"``).
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
        dtype = _index_dtype(index_dtype, num_edges, n_dst, n_src)
        src, dst = edge_index[0], edge_index[1]
        order = _sort_by_row_then_col(dst, src, n_src)
        rows = dst[order]
        rowptr = rowptr_from_sorted_rows(rows, n_dst, dtype)
        col = src[order].to(dtype)
        values = None if edge_weight is None else refuse_spent_weights(edge_weight[order])
        edge_perm = order.to(dtype) if keep_edge_order else None
        if perm is not None:
            perm = check_perm(perm, n_dst, edge_index.device) if n_src == n_dst else _refuse_perm_rectangular()
        return cls(rowptr, col, values, (n_dst, n_src), tile_size=tile_size, threshold=threshold,
                   edge_perm=edge_perm, perm=perm, _edge_order_dropped=not keep_edge_order)

    @classmethod
    @outside_inference_mode
    def from_csr(cls, rowptr, col, values=None, *, shape=None, tile_size=32, threshold="auto",
                 index_dtype=None, perm=None) -> "TiledAdjacency":
        """From CSR arrays with rows = destination nodes; ``shape`` defaults to square."""
        check_tile_options(tile_size, threshold)
        rowptr, col, shape = check_csr(rowptr, col, shape)
        if values is not None:
            values = check_edge_values(values, col.numel(), "values", col.device)
        dtype = _index_dtype(index_dtype, col.numel(), shape[0], shape[1])
        if perm is not None:
            perm = check_perm(perm, shape[0], col.device) if shape[0] == shape[1] else _refuse_perm_rectangular()
        return cls(rowptr.to(dtype), col.to(dtype), values, shape, tile_size=tile_size, threshold=threshold,
                   perm=perm)

    @classmethod
    @outside_inference_mode
    def from_scipy(cls, matrix, **options) -> "TiledAdjacency":
        """From a ``scipy.sparse`` matrix (rows = destination nodes); its data become edge weights
        (float64 data kept float64, other real types as float32) unless every entry is 1."""
        if not hasattr(matrix, "tocsr"):
            raise TypeError(f"from_scipy takes a scipy.sparse matrix or array, got {type(matrix).__name__}")
        csr = matrix.tocsr()
        if csr.dtype.kind not in "biuf":
            raise TypeError(f"from_scipy takes real edge weights, got a {csr.dtype} matrix")
        data = torch.from_numpy(csr.data.astype("float64" if csr.dtype == "float64" else "float32"))
        values = None if bool((data == 1).all()) else data
        return cls.from_csr(torch.from_numpy(csr.indptr.astype("int64")), torch.from_numpy(csr.indices.astype("int64")),
                            values, shape=csr.shape, **options)

    @outside_inference_mode
    def with_values(self, edge_values) -> "TiledAdjacency":
        """The same structure (and kernel plans) with new edge weights, or ``None`` for unit
        weights. Differentiable. The weights come in the order of the edge list this adjacency was
        built from (``from_edge_index``), or in CSR order when it was built from CSR or scipy.

        Weights that need no gradient give the same copy again while they are the same tensor,
        unchanged (its version, data and shape: fgplugin.stamps), so that a layer called with them
        every step keeps what the copy caches (its normalization, the op's arguments, a cuSPARSE
        fold) and checks them once. The finite-value check needs a host sync: it is skipped under
        torch.compile and inside a CUDA graph capture (the warm-up steps before a capture check the
        same weights)."""
        if edge_values is None:
            return self._copy(values=None)
        if self._edge_order_dropped:
            raise ValueError("this TiledAdjacency was built from an edge list without keeping its order "
                             "(keep_edge_order=False, as fgplugin.preprocess.reorder_graph and PyG's BlockReorder "
                             "build it), so per-edge values in that order cannot be mapped onto it: build it with "
                             "TiledAdjacency.from_edge_index(edge_index, num_nodes, keep_edge_order=True) (after "
                             "BlockReorder: from data.edge_index, in the new ids) or reorder_graph(..., "
                             "keep_edge_order=True), or give the weights when it is built")
        memo = self._cache.setdefault("with_values", {}) if self._memoizable(edge_values) else None
        if memo is not None:
            kept = memo.get(id(edge_values))
            # the weights unchanged, and the copy's own values too (they may be a copy of them)
            if kept is not None and kept[0]() is edge_values and kept[1] == (stamp(edge_values),
                                                                            kept[2].values._version):
                return hold(kept[2])
        source = edge_values
        edge_values = check_edge_values(edge_values, self.nnz, "edge values", self.device,
                                        check_finite=not (torch.compiler.is_compiling() or capturing(edge_values)))
        if self.edge_perm is not None:
            edge_values = refuse_spent_weights(edge_values[self.edge_perm.long()])
        copy = self._copy(values=edge_values)
        if memo is not None:
            memo.pop(id(source), None)
            if copy.values is source:  # it holds the weights: at most one such entry, or they outlive their use
                for key in [k for k, entry in list(memo.items()) if entry[2].values is entry[0]()]:
                    memo.pop(key, None)  # (a weak reference's callback may have dropped it meanwhile)
            memo[id(source)] = (weakref.ref(source, _forget_in(memo, id(source))),
                                (stamp(source), copy.values._version), copy, pin(source))
            while len(memo) > MAX_WEIGHTED_COPIES:
                memo.pop(next(iter(memo)))
        return hold(copy)

    @staticmethod
    def _memoizable(edge_values) -> bool:
        # weights that need a gradient are indexed into each step's autograd graph: never reused;
        # tensors made in inference mode or wrapped by functorch have nothing to stamp
        return isinstance(edge_values, torch.Tensor) and not edge_values.requires_grad \
            and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled() \
            and stampable(edge_values)

    def with_tiles(self, tile_size=None, threshold=None) -> "TiledAdjacency":
        """The same graph with another tile size or density threshold."""
        tile_size = self.tile_size if tile_size is None else tile_size
        threshold = self.threshold if threshold is None else threshold
        check_tile_options(tile_size, threshold)
        return self._copy(tile_size=tile_size, threshold=threshold)

    def _copy(self, **changes) -> "TiledAdjacency":
        """A copy sharing the structure's caches (``_shared``: transpose, plans, threshold choices)."""
        kwargs = dict(values=self.values, tile_size=self.tile_size, threshold=self.threshold)
        kwargs.update(changes)
        clone = TiledAdjacency(self.rowptr, self.col, kwargs.pop("values"), self.shape, edge_perm=self.edge_perm,
                               perm=self.perm, _shared=self._shared, _edge_order_dropped=self._edge_order_dropped,
                               **kwargs)
        clone._inv_perm = self._inv_perm
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
    def perm(self) -> torch.Tensor | None:
        """new -> old node ids of a reordered graph (``x_new = x_old[perm]``), or ``None``."""
        return self._perm

    @perm.setter
    def perm(self, perm: torch.Tensor | None) -> None:
        if perm is not None:
            perm = check_perm(perm, self.shape[0], self.device) if self.is_square else _refuse_perm_rectangular()
        self._perm, self._inv_perm = perm, None

    @property
    def inv_perm(self) -> torch.Tensor | None:
        """old -> new node ids (the inverse of ``perm``), computed once."""
        if self._inv_perm is None and self._perm is not None:
            self._inv_perm = inverse_permutation(self._perm)
        return self._inv_perm

    @property
    @outside_inference_mode
    def tiles(self) -> TileStats:
        """The dense tiles at the threshold in force (for ``"auto"``: the one chosen for float32 on
        this device if the choice was made, else the default), computed once."""
        threshold = self._stats_threshold()
        key = ("tile_stats", self.tile_size, threshold)
        stats = self._shared.get(key)
        if stats is None:
            stats = self._shared[key] = tile_stats(self.rowptr, self.col, self.shape, self.tile_size, threshold)
        return stats

    @property
    def dense_share(self) -> float:
        """Share of the non-zeros that sit in dense tiles (of :attr:`tiles`)."""
        return self.tiles.nnz_dense / self.nnz if self.nnz else 0.0

    def _stats_threshold(self) -> float:
        if self.threshold != "auto":
            return float(self.threshold)
        chosen = self._shared.get(("auto_threshold", self.tile_size, self.device, "fp32"))
        return DEFAULT_THRESHOLD if chosen is None else chosen["threshold"]

    @outside_inference_mode
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

    @property
    @outside_inference_mode
    def is_symmetric(self) -> bool:
        """Whether A's structure equals its transpose's (builds the transpose)."""
        t_rowptr, t_col, _ = self.transpose()
        return t_rowptr is self.rowptr and t_col is self.col

    @outside_inference_mode
    def in_degree(self, weighted: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Number (or summed weight) of in-edges per destination node, in ``dtype`` (default:
        the weights' dtype, float32 without weights)."""
        if weighted and self.values is not None:
            dtype = dtype or self.values.dtype
            weights = self.values.to(dtype)
            return torch.zeros(self.shape[0], dtype=dtype, device=self.device).index_add_(0, self._rows(), weights)
        return (self.rowptr[1:] - self.rowptr[:-1]).to(dtype or torch.float32)

    @outside_inference_mode
    def out_degree(self, weighted: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Number (or summed weight) of out-edges per source node, in ``dtype`` (as :meth:`in_degree`)."""
        if weighted and self.values is not None:
            dtype = dtype or self.values.dtype
            weights = self.values.to(dtype)
        else:
            dtype = dtype or torch.float32
            weights = torch.ones(self.nnz, dtype=dtype, device=self.device)
        return torch.zeros(self.shape[1], dtype=dtype, device=self.device).index_add_(0, self.col.long(), weights)

    @outside_inference_mode
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
        no allocation per training step); the ``MAX_CONSTANT_DIAGS`` values used last are kept
        per dtype (a self-loop weight that changes every step must not hold a vector per value)."""
        kept = self._shared.setdefault(("diag", dtype), {})
        cached = kept.pop(value, None)
        if cached is None:
            cached = torch.full((min(self.shape),), value, dtype=dtype, device=self.device)
        kept[value] = cached  # the most recently used last
        while len(kept) > MAX_CONSTANT_DIAGS:
            kept.pop(next(iter(kept)))
        return hold(cached)

    def transposed_values(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (``self.values``, already cast) reordered for A^T; kept unless they need
        grad (:meth:`_keep_for_values`), and rebuilt after an in-place write to ``self.values``."""
        key = ("t_values", values.dtype)
        kept = self._kept_for_values(key)
        if kept is not None:
            return kept
        t_values = values[self.transpose()[2].long()]
        self._keep_for_values(key, t_values)
        return t_values

    @outside_inference_mode
    def norm(self, kind: str = "gcn", **options):
        """Row/column scales and diagonal of a normalization, cached: see fgplugin.normalization
        (float64 by default; ``dtype=torch.float32`` for float32 or 16-bit features saves a cast
        per ``spmm`` call); recomputed after an in-place write to the edge values."""
        key = (kind, tuple(sorted(options.items())))
        kept = self._kept_for_values(key)
        if kept is not None:
            return kept
        scales = normalization(self, kind, **options)
        self._keep_for_values(key, scales)
        return scales

    def _kept_for_values(self, key):
        """What ``_keep_for_values`` kept under ``key``, or ``None`` when the edge values were
        written in place since (their ``_version``) or now need a gradient (what was kept without
        one has no autograd path to them, and ``requires_grad_()`` leaves the version as it was).
        Under torch.compile (which cannot read a version) what was kept in eager mode. Values made
        in inference mode have no version: nothing is kept for them."""
        kept = self._cache.get(key)
        if kept is None or self._values_need_grad():
            return None
        if torch.compiler.is_compiling():
            return kept[1]
        if self._values_untracked():
            return None
        return kept[1] if kept[0] == self._values_version() else None

    def _keep_for_values(self, key, value) -> None:
        """Keeps ``value`` for :meth:`_kept_for_values`, except under torch.compile, for values
        made in inference mode, and while the values need a gradient (``value`` then belongs to
        this call's autograd graph, and would never be read)."""
        if torch.compiler.is_compiling() or self._values_untracked() or self._values_need_grad():
            return
        self._cache[key] = self._values_version(), value

    def _values_need_grad(self) -> bool:
        return self.values is not None and self.values.requires_grad

    def _values_untracked(self) -> bool:
        return self.values is not None and self.values.is_inference()

    def _values_version(self):
        return None if self.values is None else self.values._version

    def _rows(self) -> torch.Tensor:
        return rows_of_edges(self.rowptr, self.nnz)

    # ------------------------------------------------------------------ kernel plans
    @outside_inference_mode
    def kernel_plan(self, dtype: torch.dtype, *, transpose: bool = False) -> KernelPlan | None:
        """The block-adaptive CUDA kernel's plan of A (or of A^T) for features of ``dtype``, or
        ``None`` where the plain kernels run (off CUDA, float64, block-adaptive kernel off or not
        built). Built once and kept: ``threshold="auto"`` is resolved first
        (:meth:`resolved_threshold`). Under torch.compile only a plan built before is returned
        (building needs host syncs); without one the plain CSR kernel runs."""
        if not block_adaptive_available(self.device, dtype):
            return None
        threshold = self.resolved_threshold(dtype)
        if threshold is None:
            return None
        if transpose:
            t_rowptr, t_col, _ = self.transpose()
            if t_rowptr is self.rowptr and t_col is self.col:
                transpose = False  # structurally symmetric: A^T's CSR is A's, and so is its plan
        weighted = self.values is not None
        key = self._plan_key(transpose, threshold, weighted)
        plan = self._shared.get(key)
        if plan is None and not torch.compiler.is_compiling():
            rowptr, col = (self.transpose()[:2]) if transpose else (self.rowptr, self.col)
            shape = (self.shape[1], self.shape[0]) if transpose else self.shape
            plan = self._shared[key] = build_kernel_plan(rowptr, col, shape, threshold=threshold,
                                                         tile_size=self.tile_size, weighted=weighted)
        return plan

    def _plan_key(self, transpose: bool, threshold: float, weighted: bool) -> tuple:
        return ("kernel_plan", transpose, self.tile_size, float(threshold), weighted, self.device)

    def cached_kernel_plan(self, threshold: float, weighted: bool) -> KernelPlan | None:
        """A plan of A at ``threshold`` built before (for the threshold probe), or ``None``."""
        return self._shared.get(self._plan_key(False, threshold, weighted))

    def resolved_threshold(self, dtype: torch.dtype = torch.float32) -> float | None:
        """The numeric threshold the kernel plans use for features of ``dtype``: the fixed one, or
        for ``"auto"`` the choice of fgplugin.autotune (once per device and dtype class: the probe's
        on CUDA, 1.0 under its floor of non-zeros, the default off CUDA). ``None`` under
        torch.compile when the choice has not been made yet."""
        if self.threshold != "auto":
            return float(self.threshold)
        key = ("auto_threshold", self.tile_size, self.device, autotune.dtype_class(dtype))
        chosen = self._shared.get(key)
        if chosen is None:
            if torch.compiler.is_compiling():
                return None
            chosen = autotune.choose_threshold(self, dtype)
            plan = chosen.pop("plan")
            if plan is not None:  # the probe's plan of the choice: kept, not built again
                self._shared.setdefault(self._plan_key(False, chosen["threshold"], self.values is not None), plan)
            self._shared[key] = chosen
        return chosen["threshold"]

    @outside_inference_mode
    def prepare(self, dtype: torch.dtype = torch.float32, *, transpose: bool = True) -> float | None:
        """Builds the kernel plans for features of ``dtype`` now (running the ``"auto"`` probe
        first if asked for) instead of in the first forward and backward pass, and returns the
        threshold in use, or ``None`` where the plain kernels run.

        Why: a training loop's first step otherwise pays for the probe and the plans (0.5-1.5 s on
        a 75-200M-edge graph on an H100), which belongs with preprocessing."""
        if self.kernel_plan(dtype) is None:
            return None
        if transpose:
            self.kernel_plan(dtype, transpose=True)
        return self.resolved_threshold(dtype)

    # ------------------------------------------------------------------ devices, memory, pickling
    def to(self, device=None, non_blocking: bool = False, *, dtype=None, copy: bool = False,
           **_ignored) -> "TiledAdjacency":
        """A copy on ``device`` (transpose and permutation included; kernel plans are rebuilt
        there when first needed); itself where it is there already, unless ``copy``. Extra keyword
        arguments that ``torch.Tensor.to`` takes are accepted, so ``data.to(device)`` of a PyG
        ``Data`` that holds this object works; a dtype is refused (see the error)."""
        if dtype is not None or any(isinstance(arg, torch.dtype) for arg in (device, non_blocking)):
            raise TypeError("TiledAdjacency.to moves the adjacency to a device; it has no dtype to change: "
                            "fgplugin.spmm runs in the features' dtype (to store the edge weights in another, "
                            "build the adjacency from weights of that dtype)")
        device = self.device if device is None else torch.device(device)
        if device == self.device and not copy:
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking, copy=copy)  # noqa: E731
        out = TiledAdjacency(move(self.rowptr), move(self.col), move(self.values), self.shape,
                             tile_size=self.tile_size, threshold=self.threshold, edge_perm=move(self.edge_perm),
                             perm=move(self.perm), _edge_order_dropped=self._edge_order_dropped)
        transpose = self._shared.get("transpose")
        if transpose is not None:
            t_rowptr, t_col, t_perm = transpose
            symmetric = t_rowptr is self.rowptr and t_col is self.col  # keep sharing A's arrays
            out._shared["transpose"] = ((out.rowptr, out.col) if symmetric else (move(t_rowptr), move(t_col))) \
                + (move(t_perm),)
        out._inv_perm = move(self._inv_perm)
        return out

    def cpu(self) -> "TiledAdjacency":
        return self.to("cpu")

    def cuda(self, device=None) -> "TiledAdjacency":
        return self.to(torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"))

    def _tensors(self):
        yield from (self.rowptr, self.col, self.values, self.edge_perm, self._perm, self._inv_perm)
        seen = {id(self.rowptr), id(self.col)}
        transpose = self._shared.get("transpose")
        if transpose is not None:
            yield from (t for t in transpose if id(t) not in seen)
        for key, value in self._shared.items():
            if isinstance(value, KernelPlan):
                yield value.buffer
            elif isinstance(value, TileStats):
                yield from (value.panel_ptr, value.tile_col, value.tile_nnz)

    @property
    def nbytes(self) -> int:
        """Bytes held by the structure, permutations and what was built from them (transpose,
        kernel plans, tile statistics)."""
        return sum(t.numel() * t.element_size() for t in self._tensors() if t is not None)

    def __getstate__(self):
        # Plain tensors, numbers and tuples only, so torch.load(weights_only=True) can read it back
        # (fgplugin registers this class with torch.serialization.add_safe_globals). Kernel plans
        # are device-specific and rebuilt where the adjacency is used.
        return {
            "format": _STATE_FORMAT, "shape": self.shape, "rowptr": self.rowptr, "col": self.col,
            "values": self.values, "edge_perm": self.edge_perm, "perm": self.perm,
            "tile_size": self.tile_size, "threshold": self.threshold, "edge_order_dropped": self._edge_order_dropped,
        }

    def __setstate__(self, state):
        """Restores a pickled adjacency and checks it as the constructors check their inputs:
        contents that no longer form a valid graph raise a ValueError here, before any kernel
        reads them (an edit that keeps them valid is not seen: the state has no checksum)."""
        try:
            if "format" not in state:  # written before the state had a format: its tile plan is dropped
                tile_size, threshold = state["tiles"][:2]
                state = {**state, "tile_size": tile_size, "threshold": threshold}
            if state.get("format", _STATE_FORMAT) != _STATE_FORMAT:
                raise ValueError(f"format {state['format']!r}, this fgplugin reads {_STATE_FORMAT}")
            rowptr, col, shape = check_csr(state["rowptr"], state["col"], tuple(state["shape"]))
            check_tile_options(state["tile_size"], state["threshold"])
            values = state["values"]
            if values is not None:
                values = check_edge_values(values, col.numel(), "values", col.device)
            edge_perm = state["edge_perm"]
            if edge_perm is not None:
                edge_perm = check_perm(edge_perm, col.numel(), col.device, what="edge_perm")
            perm = state["perm"]
            if perm is not None:
                perm = check_perm(perm, shape[0], col.device) if shape[0] == shape[1] else _refuse_perm_rectangular()
        except (TypeError, ValueError, KeyError, IndexError) as err:
            raise ValueError(f"this saved TiledAdjacency is damaged or was edited ({err}); rebuild it from the "
                             "graph's edge_index (e.g. TiledAdjacency.from_edge_index or the BlockReorder "
                             "transform)") from err
        # int32 only when both arrays were (check_csr widened them; every id fits what they held)
        dtype = torch.int32 if state["rowptr"].dtype == state["col"].dtype == torch.int32 else torch.int64
        self.__init__(rowptr.to(dtype), col.to(dtype), values, shape,
                      edge_perm=None if edge_perm is None else edge_perm.to(dtype), perm=perm,
                      tile_size=state["tile_size"], threshold=state["threshold"],
                      _edge_order_dropped=bool(state.get("edge_order_dropped", False)))

    def __repr__(self) -> str:
        if self.threshold == "auto":
            chosen = self._stats_threshold()
            threshold = f"auto ({100 * chosen:.3g}% {'chosen' if chosen != DEFAULT_THRESHOLD or self._probed() else 'until probed'})"
        else:
            threshold = f"{100 * float(self.threshold):.3g}%"
        tiles = self.tiles
        return (f"TiledAdjacency(shape={self.shape}, nnz={self.nnz}, index={str(self.col.dtype).replace('torch.', '')}, "
                f"weighted={self.values is not None}, tiles={self.tile_size}x{self.tile_size} dense above "
                f"{threshold}: {tiles.num_dense_tiles} tiles holding {100 * self.dense_share:.1f}% of nnz, "
                f"reordered={self.perm is not None}, device={self.device}, nbytes={self.nbytes})")

    @property
    def values(self) -> torch.Tensor | None:
        """The edge weights in CSR order, or ``None`` for unit weights. Written in place they are
        seen (caches check their version); replacing the tensor is refused: what was built from
        it (normalization, kept calls, a cuSPARSE fold) would go on reading the old one."""
        return self._values

    @values.setter
    def values(self, _):
        raise AttributeError("TiledAdjacency.values cannot be replaced: use adj.with_values(new_weights), a copy "
                             "that shares the structure's caches, or write into adj.values in place")

    def _probed(self) -> bool:
        return ("auto_threshold", self.tile_size, self.device, "fp32") in self._shared


_STATE_FORMAT = 2


def _resolve_size(edge_index, num_nodes, size) -> tuple[int, int]:
    if size is not None:
        if num_nodes is not None:
            raise ValueError("pass either num_nodes (square graph) or size=(num_src_nodes, num_dst_nodes), not both")
        if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
            raise ValueError(f"size must be (num_src_nodes, num_dst_nodes), got {size!r}; for a square graph pass "
                             "num_nodes instead")
        n_src, n_dst = (check_node_count(s, f"size[{i}]") for i, s in enumerate(size))
    else:
        if num_nodes is None:
            num_nodes = _inferred_node_count(edge_index)
        n_src = n_dst = check_node_count(num_nodes, "num_nodes")
    if edge_index.numel():
        for row, bound, what in ((0, n_src, "source"), (1, n_dst, "target")):
            largest = int(edge_index[row].max())
            if largest >= bound:
                hint = "num_nodes" if size is None else f"size[{row}]"
                raise ValueError(f"edge_index refers to {what} node {largest}, but the graph has only {bound} "
                                 f"{what} nodes; pass {hint} >= {largest + 1}")
    return n_src, n_dst


# Inferring the node count from the largest id stops here: beyond it the row pointer alone would
# take gigabytes, which ids from a larger graph (a subgraph keeping its original ids, or hashes)
# would otherwise allocate without a word.
MAX_INFERRED_NODES = 2**31 - 1


def _inferred_node_count(edge_index) -> int:
    if not edge_index.numel():
        return 0
    largest = int(edge_index.max())
    if largest >= MAX_INFERRED_NODES:
        raise ValueError(f"edge_index holds node id {largest} and num_nodes was not given: an adjacency of "
                         f"{largest + 1} nodes would need {8 * (largest + 2) / 2**30:.0f} GiB for its row pointer "
                         "alone. Pass num_nodes if the graph really has that many nodes, or relabel the ids to "
                         "0..k-1 first (torch.unique(edge_index, return_inverse=True))")
    return largest + 1


def _sort_by_row_then_col(rows: torch.Tensor, cols: torch.Tensor, n_cols: int) -> torch.Tensor:
    """Stable permutation that sorts edges by (row, col): columns ascending inside each row."""
    if rows.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=rows.device)
    if (int(rows.max()) + 1) * max(n_cols, 1) < 2**62:
        return torch.argsort(rows * max(n_cols, 1) + cols, stable=True)
    by_col = torch.argsort(cols, stable=True)  # keys would overflow int64: two stable passes
    return by_col[torch.argsort(rows[by_col], stable=True)]


def _index_dtype(asked, nnz: int, n_rows: int, n_cols: int) -> torch.dtype:
    """The index dtype: ``asked`` (int32 or int64; int32 only where every index fits) or the
    narrowest that fits."""
    needed = index_dtype_for(nnz, n_rows, n_cols)
    if asked is None:
        return needed
    if asked not in (torch.int32, torch.int64):
        raise ValueError(f"index_dtype must be torch.int32 or torch.int64, got {asked}")
    if asked == torch.int32 and needed == torch.int64:
        raise ValueError(f"index_dtype=torch.int32 cannot hold this graph's indices ({nnz} non-zeros, shape "
                         f"({n_rows}, {n_cols})): leave index_dtype unset or use torch.int64")
    return asked


def _refuse_perm_rectangular():
    raise ValueError("perm applies to square graphs (one node set); this adjacency is rectangular")

r"""One rank's row block of a graph and the distributed SpMM over it (docs/design.md, "Distributed").

Rank ``(g, k)`` (block ``g``, replica ``k``; see :mod:`fgplugin.distributed.context`) holds the rows
``[s_g, e_g)`` of the normalized adjacency, cut into the column blocks ``A_gj`` it multiplies
(``j in J_k``), each a :class:`~fgplugin.TiledAdjacency` of shape ``(n_g, m_gj)`` together with its
transpose for the backward pass. It computes

.. math::
    T_g = \sum_{j \in J_k} \mathrm{diag}(r_g)\,(A_{gj} + [j = g]\,\mathrm{diag}(d_g))\,\mathrm{diag}(c_j)\,H_j

and, for ``r > 1``, all-reduces ``T_g`` over the replicas of block ``g``. Feature blocks ``H_j`` travel
inside the column group:

- ``comm="broadcast"``: the owner broadcasts all of ``H_j`` (the paper's scheme) straight from the
  tensor it holds; ``m_gj = n_j``.
- ``comm="sparse"``: rank ``g`` receives only the rows of ``H_j`` that ``A_gj`` has non-zeros in;
  ``A_gj``'s columns are compacted to those rows (``m_gj`` = their count). The owner first gathers
  them into a send buffer. Transfers are point to point in a ring-shift schedule: at step ``s``
  rank ``g`` receives block ``(g + s) mod q`` and sends its own rows to rank ``(g - s) mod q``, so
  every link carries one message per step.

In both modes every transfer is posted at once and the own block's product ``A_gg H_g`` runs while
they are in flight; the blocks ``j != g`` are then multiplied as one *remote* block whose columns
are the received rows stacked in block order. Sparse mode moves fewer bytes; broadcast mode needs no
gather of send rows. Which wins depends on the graph: when a rank reads most of the other blocks'
rows anyway (the synthetic graphs' long-range edges: 92% on products-like, 4 ranks), broadcast's
extra bytes cost less than sparse mode's gather (``benchmarks/results/h200-x4/scaling.json``).
``comm="auto"`` (the default) picks sparse mode when the ranks read at most half of those rows.

Backward, ``dL/dH_j = sum_g A_gj^T G_g``. When the normalized adjacency is symmetric (a symmetric
edge multiset and equal row and column scales: GCN normalization of an undirected graph, the usual
case) ``A_gj^T = A_jg``, so the backward *is* the forward product applied to the gradient
``G``: the same exchange (the rows of ``G`` this rank reads) and the same blocks, with no transposed
blocks at all. Otherwise each rank multiplies its transposed blocks and sends the partial products
to the block owners (``reduce`` in broadcast mode, point to point in sparse mode); in sparse mode
the transfers overlap the own block's transposed product. The backward products leave out the
zero rows of ``G`` (a masked loss makes most of them zero), and on a symmetric graph only its
non-zero rows travel (:mod:`fgplugin.distributed.live_rows`). Gradients of replicated tensors are
*partial* per replica (their sum over the replicas is the true gradient); the training wrapper
accounts for it (loss scaled by ``1/r``, weight gradients all-reduced with SUM).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..normalization import scales_of_degrees
from ..ops import padded_width, spmm, spmm_skipping_zero_rows
from ..tile_density import DEFAULT_THRESHOLD
from ..tiling import TiledAdjacency
from ..validation import check_tile_options
from .context import COMM_MODES, BlockLayout, ShardingContext, all_gather_into, check_agreement, check_context
from .live_rows import LiveRowExchange, compact_product

# Two primes below 2**31 and multipliers below 2**30, so that every product below fits in an int64.
_HASHES = ((2**31 - 1, 40503, 69069), (1_000_000_007, 92821, 48271))
_CHUNK = 1 << 24  # edges read per step while sharding (bounds temporaries; works on memory maps)
# comm="auto" picks sparse mode while the ranks read at most this share of the other blocks' rows.
# Sparse mode gathers each row it sends into a buffer, on the critical path, and that gather cost
# about as much per row as the transfer itself (products-like, 4 H200s: 4.1 ms of gathers against
# an all-gather of 8% more rows that the own block's product mostly hid), so at half the rows
# the two are roughly even. One measured point (92% read: broadcast 12.2 ms, sparse 16.2 ms).
AUTO_SPARSE_MAX_SHARE = 0.5
NORMS = ("gcn", "mean", "both", "none", "left")


@dataclass
class ColumnBlock:
    """``A_gj`` of this rank and what it needs to multiply it."""

    j: int
    adj: TiledAdjacency            # (n_g, m): rows of this rank's block, columns of block j (or the remote rows)
    adj_t: TiledAdjacency | None   # (m, n_g); None on a symmetric graph (its backward is the forward product)
    col_scale: torch.Tensor | None  # [m]
    diag: torch.Tensor | None      # [n_g] on the diagonal block only


class ShardedGraph:
    r"""This rank's row block of a graph, ready for :func:`dist_spmm`.

    Build it with :meth:`from_edge_index` on every rank with the same arguments. Node ids inside
    are the reordered ones: row ``i`` of block ``g`` is global node ``perm[s_g + i]``
    (``perm`` new -> old as :func:`fgplugin.reorder.reorder` returns it); :meth:`rows` takes the
    matching rows of node features, labels and masks.

    Attributes:
        ctx: the :class:`ShardingContext`.
        num_nodes, num_edges: of the whole graph.
        row_start, row_end: this rank's node range (reordered ids).
        blocks: ``{g: the own block}`` when this rank multiplies its own column block (always in
            1D); the other blocks are merged into ``remote``.
        remote: one :class:`ColumnBlock` over the rows this rank receives from every other block,
            stacked in block order (``recv_slices[j] = (offset, count)``), or ``None`` without
            edges to other blocks. One SpMM
            over it replaces one per block: each of those wrote and re-added a full ``[n_g, F]``
            output and launched work for all ``n_g`` rows, which doubled the per-rank SpMM time
            on 4 GPUs (products-like: 16 ms against 8 ms ideal).
        row_scale: ``[n_g]`` row scale of the normalization (or ``None``), in the ``scale_dtype``
            of :meth:`from_edge_index`: float32 by default, so float64 features need
            ``scale_dtype=torch.float64`` for float64 accuracy (``ShardedAdjacency`` does that).
        send_rows, send_slices: sparse mode: the rows of this block that the other members of the
            column group read, stacked by member block ``k``, and ``send_slices[k] = (offset,
            count)``; one gather packs every send (one scatter-add unpacks what the transposed
            backward receives).
        comm: the exchange mode in use, ``"sparse"`` or ``"broadcast"`` (what ``"auto"`` resolved to).
        gathers: broadcast mode in 1D: one all-gather into a buffer with a slot per block.
        symmetric: the normalized adjacency equals its transpose (checked exactly at
            construction, the same on every rank); the backward then runs the forward product.
        fingerprint: ints identifying the graph, equal on every rank (checked at construction).
        profiler: a :class:`~fgplugin.distributed.profile.Profiler` to time the block products,
            the packing of rows for the wire and exposed communication, or ``None`` (default).
    """

    def __init__(self, ctx: ShardingContext, num_nodes: int, num_edges: int, perm, blocks, row_scale, send_idx,
                 fingerprint, remote=None, recv_slices=None, recv_rows=0, symmetric=False, comm=None, gathers=False,
                 recv_ids=None):
        self.ctx = ctx
        self.device = ctx.device
        self.layout = BlockLayout(num_nodes, ctx.num_blocks)
        self.num_nodes, self.num_edges = num_nodes, num_edges
        self.perm = perm
        self.row_start, self.row_end = self.layout.start(ctx.block), self.layout.end(ctx.block)
        self.blocks: dict[int, ColumnBlock] = blocks
        self.row_scale = row_scale
        self.send_slices: dict[int, tuple[int, int]] = {}
        offset = 0
        for k in sorted(send_idx):
            self.send_slices[k] = (offset, send_idx[k].numel())
            offset += send_idx[k].numel()
        self.send_rows = torch.cat([send_idx[k] for k in sorted(send_idx)]) if send_idx else torch.zeros(
            0, dtype=torch.long, device=ctx.device)
        self.remote: ColumnBlock | None = remote
        self.recv_slices: dict[int, tuple[int, int]] = recv_slices or {}
        # Sparse mode: the ids (within block j) of the rows received from block j, stacked like the
        # receive buffer (slice recv_slices[j]); the live-row exchange filters them.
        self.recv_ids = recv_ids
        self.recv_rows = int(recv_rows)
        # Rows that come over the wire: the buffer less an all-gather's own slot and padding.
        self.received_rows = sum(count for _, count in self.recv_slices.values())
        self.symmetric = bool(symmetric)
        self.comm = comm or ctx.comm
        self.gathers = bool(gathers)
        self.fingerprint = fingerprint
        self.profiler = None
        self.live_rows = LiveRowExchange(ctx.device)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_edge_index(cls, ctx: ShardingContext, edge_index, num_nodes: int, *, perm: torch.Tensor | None = None,
                        norm: str = "gcn", improved: bool = False, add_self_loops: bool = True,
                        replace_loops: bool = False, tile_size: int = 32,
                        threshold: float | str | None = None, extra_fingerprint=(),
                        scale_dtype: torch.dtype = torch.float32) -> "ShardedGraph":
        r"""Shard a graph given as a global ``edge_index`` ``[2, E]`` (row 0 source, row 1 target).

        Every rank reads the whole edge list in chunks of 16M edges and keeps the edges whose
        target falls in its row block, so ``edge_index`` may be a host tensor, a CUDA tensor or a
        read-only ``numpy.memmap`` (``np.load(path, mmap_mode="r")``): only this rank's share and
        one chunk are ever on its device.

        Args:
            ctx: the :class:`ShardingContext` of this run.
            edge_index: global edges in original node ids.
            num_nodes: ``n``.
            perm: reordering, new -> old (use ``fgplugin.reorder.reorder(..., parts=ctx.num_blocks)``
                for Algorithm 2: one part per row block); ``None`` keeps the given ids.
            norm: ``"gcn"`` (:math:`D^{-1/2}(A+I)D^{-1/2}` with PyG's remaining-self-loops rule),
                ``"mean"``, ``"both"`` and ``"left"`` (DGL) or ``"none"``; degrees are those of the whole
                graph.
            improved: GCN with self-loop weight 2.
            add_self_loops: GCN with self loops added where a node has none (``False``: LightGCN's
                and ``GCNConv(add_self_loops=False)``'s normalization).
            replace_loops: GCN replacing each node's self loops by one (PyG's ``GCNConv`` on an
                unweighted ``edge_index``: duplicate loops count once) instead of keeping them.
            tile_size, threshold: tile plan options of the blocks, checked before any
                collective. ``None`` (the default): ``"auto"`` where the graph has one row
                block (one rank; as for a :class:`~fgplugin.TiledAdjacency`, its products may
                then also run on cuSPARSE), else the fixed 5%. A threshold given is used as
                given; ``"auto"`` on several ranks lets each rank choose for its own blocks
                during its first products (a device sync there, once).
            extra_fingerprint: ints that must also agree between ranks (e.g. feature width).
            scale_dtype: of the normalization's scales: float32 (the kernels' type for float32
                and 16-bit features), or float64 for float64 features.

        Raises:
            ValueError: on every rank, when the ranks were given different graphs, orderings or
                sharding options, or run with different thresholds of the zero-row skipping
                (``fgplugin.grad_rows``; an all-gathered fingerprint differs).
        """
        check_context(ctx, "ShardedGraph.from_edge_index")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if threshold is None:
            # The probe times a product alone, which is an epoch's measure only where nothing
            # overlaps it. On one rank its choice (no dense tiles) made products-like's epoch 6%
            # faster than the fixed 5% (H100); on four ranks, where the own block's product
            # overlaps the exchange, the same choice made it 4.6-6.4% slower in two of three
            # same-lease A/Bs (H200s; archaea-like's 2-3% faster). docs/results.md section 39.
            threshold = "auto" if ctx.num_blocks == 1 else DEFAULT_THRESHOLD
        # Here, on every rank alike: a rank of 1.5D with no own block builds no adjacency before
        # its first collective, and would wait there for ranks that raised.
        check_tile_options(tile_size, threshold)
        device, n = ctx.device, int(num_nodes)
        layout = BlockLayout(n, ctx.num_blocks)
        g, s = ctx.block, layout.start(ctx.block)
        n_own = layout.size(g)
        inv = None
        if perm is not None:
            perm = torch.as_tensor(perm).to(device=device, dtype=torch.long)
            if perm.shape != (n,):
                raise ValueError(f"perm must have shape [{n}] (one entry per node, new -> old), got {list(perm.shape)}")
            inv = torch.full((n,), -1, dtype=torch.long, device=device)
            inv[perm] = torch.arange(n, device=device)
            if bool((inv < 0).any()):
                raise ValueError("perm is not a permutation of 0..num_nodes-1 (some ids missing or repeated)")

        num_edges = int(edge_index.shape[1])
        srcs, dsts, leaving = [], [], []
        hashes = torch.zeros(len(_HASHES), dtype=torch.long, device=device)
        bad = torch.zeros((), dtype=torch.bool, device=device)
        for a in range(0, num_edges, _CHUNK):
            e = torch.as_tensor(edge_index[:, a:a + _CHUNK]).to(device=device, dtype=torch.long)
            src, dst = e[0], e[1]
            bad |= ((src < 0) | (src >= n) | (dst < 0) | (dst >= n)).any()
            # Order-free hash of the edge set (in original ids), so ranks can check they agree.
            hashes = _add_pair_hashes(hashes, src, dst)
            if inv is not None:
                src, dst = inv[src.clamp(0, n - 1)], inv[dst.clamp(0, n - 1)]
            keep = (dst >= s) & (dst < s + n_own)
            srcs.append(src[keep])
            dsts.append(dst[keep] - s)
            leave = (src >= s) & (src < s + n_own)  # edges leaving this block, keyed (source, target)
            leaving.append((src[leave] - s) * n + dst[leave])
        if bool(bad):
            raise ValueError(f"edge_index holds node ids outside [0, num_nodes={n})")
        src = torch.cat(srcs) if srcs else torch.zeros(0, dtype=torch.long, device=device)
        dst = torch.cat(dsts) if dsts else torch.zeros(0, dtype=torch.long, device=device)
        del srcs, dsts
        # The graph is symmetric iff on every block the edges entering it, keyed (target, source),
        # are the edges leaving it, keyed (source, target) (as multisets: duplicates count).
        symmetric = _same_multiset(dst * n + src, torch.cat(leaving) if leaving else src.new_zeros(0))
        del leaving

        perm_hash = 0 if perm is None else int(_add_pair_hashes(hashes.new_zeros(1), torch.arange(n, device=device),
                                                                perm)[0])
        min_work, live_fraction, max_misses, max_kept = LiveRowExchange.settings(device)
        fingerprint = [n, num_edges, *hashes.tolist(), perm_hash, ctx.world_size, ctx.replication,
                       COMM_MODES.index(ctx.comm), NORMS.index(norm), int(improved), int(add_self_loops),
                       int(replace_loops), int(min_work),
                       round(live_fraction * 1e6), int(max_misses), int(max_kept),
                       *[int(v) for v in extra_fingerprint]]
        check_agreement("building a sharded graph", fingerprint,
                        _FIELDS + tuple(f"extra_fingerprint[{i}]" for i in range(len(extra_fingerprint))), device,
                        "the ranks were given different graphs or sharding options; every rank must pass the same "
                        "edge_index, num_nodes, perm and options (and use the same fgplugin.grad_rows thresholds)")

        # Degrees of the whole graph: this rank owns full rows, so its edges give its rows'
        # in-degrees and self loops exactly; one all-reduce (replica 0 of each block adds) spreads them.
        stats = torch.zeros(3, n, dtype=torch.float64, device=device)
        if ctx.replica == 0:
            stats[0, s:s + n_own] = torch.bincount(dst, minlength=n_own).to(torch.float64)
            loops = dst[src == dst + s]
            stats[1, s:s + n_own].index_add_(0, loops, torch.ones_like(loops, dtype=torch.float64))
            if norm in ("both", "left"):
                stats[2] = torch.bincount(src, minlength=n).to(torch.float64)
        asymmetric = torch.tensor([0 if symmetric else 1], dtype=torch.long, device=device)
        dist.all_reduce(stats)
        dist.all_reduce(asymmetric)
        # The same float64 degrees as a single process's normalization, so the same float32 scales
        # as its norm(dtype=torch.float32).
        in_deg, has_loop, out_deg = stats
        fill = 2.0 if improved else 1.0
        diag = None if not add_self_loops else fill - has_loop if replace_loops else (has_loop == 0) * fill
        row_scale, col_scale, diag = scales_of_degrees(norm, in_deg, out_deg, diag=diag, dtype=scale_dtype)
        del stats
        # Symmetric structure and equal row and column scales: the normalized blocks satisfy
        # A_gj^T = A_jg, so the backward runs the forward product and needs no transposed blocks.
        symmetric = int(asymmetric) == 0 and (col_scale is row_scale or (
            row_scale is not None and col_scale is not None and torch.equal(row_scale, col_scale)))
        own = slice(s, s + n_own)
        row_scale_own = None if row_scale is None else row_scale[own].contiguous()
        diag_own = None if diag is None else diag[own].contiguous()

        blocks, others, compact = {}, [], {}
        options = dict(tile_size=tile_size, threshold=threshold)
        for j in ctx.col_blocks:
            sj, nj = layout.start(j), layout.size(j)
            sel = (src >= sj) & (src < sj + nj)
            col_j, row_j = src[sel] - sj, dst[sel]
            cs = None if col_scale is None else col_scale[sj:sj + nj]
            del sel
            if j != g:
                # The other blocks go into one "remote" block (below); the rows of block j that
                # this rank's edges touch are what sparse mode receives and what "auto" counts.
                if ctx.comm != "broadcast":
                    compact[j] = torch.unique(col_j, return_inverse=True)
                # In sparse mode the inverse of the unique replaces the column ids.
                others.append((j, nj, None if ctx.comm == "sparse" else col_j, row_j, cs))
                continue
            adj = TiledAdjacency.from_edge_index(torch.stack([col_j, row_j]), size=(nj, n_own), keep_edge_order=False,
                                                 **options)
            if symmetric:
                adj_t = None
            elif _is_symmetric(adj):
                adj_t = adj
            else:
                adj_t = TiledAdjacency.from_edge_index(torch.stack([row_j, col_j]), size=(n_own, nj),
                                                       keep_edge_order=False, **options)
            blocks[j] = ColumnBlock(j, adj, adj_t, None if cs is None else cs.contiguous(), diag_own)
            del col_j, row_j
        del src, dst
        comm = ctx.comm
        if comm == "auto":
            comm = _resolve_comm(sum(cols.numel() for cols, _ in compact.values()), sum(o[1] for o in others),
                                 device)
        # The remote block over the rows received from the other blocks, stacked in column-block
        # order. Sparse mode receives only the rows this rank's edges touch, so its columns are
        # compacted to those; broadcast mode receives all of each block.
        needs, remote_parts = {}, []
        for j, nj, col_j, row_j, cs in others:
            if comm == "sparse":
                cols, inverse = compact[j]
                needs[j] = cols
                remote_parts.append((j, cols.numel(), inverse, row_j, None if cs is None else cs[cols]))
            else:
                remote_parts.append((j, nj, col_j, row_j, cs))
        del others, compact
        # 1D broadcast: every rank owns one block of the one column group, so the q broadcasts are
        # one all-gather, which moves (q-1)/q of their bytes over a ring.
        gathers = comm == "broadcast" and ctx.replication == 1 and ctx.num_blocks > 1
        # Where each block's received rows sit in the stacked receive buffer. In 1D broadcast mode
        # the buffer is the output of one all-gather: block j at j * (largest block size), the own
        # block's slot included (the remote block has no columns there).
        gather_stride = max(layout.size(i) for i in range(ctx.num_blocks)) if gathers else None
        offsets, recv_rows = {}, 0
        for j, count, *_ in remote_parts:
            offsets[j] = j * gather_stride if gather_stride else recv_rows
            recv_rows = offsets[j] + count
        recv_rows = ctx.num_blocks * gather_stride if gather_stride else recv_rows
        remote = _remote_block(remote_parts, offsets, recv_rows, n_own, options, transpose=not symmetric)
        recv_slices = {j: (offsets[j], count) for j, count, *_ in remote_parts}
        del remote_parts
        send_idx = _exchange_needs(ctx, needs, layout) if comm == "sparse" else {}
        recv_ids = torch.cat([needs[j] for j in sorted(needs)]) if needs else None  # in recv_slices' order
        return cls(ctx, n, num_edges, perm, blocks, row_scale_own, send_idx, fingerprint, remote, recv_slices, recv_rows,
                   symmetric, comm, gathers, recv_ids)

    # ------------------------------------------------------------------ node data
    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start

    def rows(self, tensor, device=None) -> torch.Tensor:
        """This rank's rows of a node-level ``tensor`` given in original node order (host, device
        or memory-mapped numpy array), in the reordered order, on the rank's device."""
        device = self.ctx.device if device is None else device
        if self.perm is None:
            part = tensor[self.row_start:self.row_end]
        else:
            idx = self.perm[self.row_start:self.row_end]
            if isinstance(tensor, torch.Tensor):
                part = tensor[idx.to(tensor.device)]
            else:
                part = tensor[idx.cpu().numpy()]
        return torch.as_tensor(part).to(device)

    def global_ids(self) -> torch.Tensor:
        """Original node id of each of this rank's rows."""
        if self.perm is None:
            return torch.arange(self.row_start, self.row_end, device=self.ctx.device)
        return self.perm[self.row_start:self.row_end]

    @property
    def nbytes(self) -> int:
        """Bytes held by this rank's blocks (structure, plans, transposes, scales)."""
        total, seen = 0, set()
        for b in self._all_blocks():
            for adj in (b.adj, b.adj_t):
                if adj is not None and id(adj) not in seen:
                    seen.add(id(adj))
                    total += adj.nbytes
            total += 0 if b.col_scale is None else b.col_scale.numel() * b.col_scale.element_size()
        return total

    def _all_blocks(self) -> list[ColumnBlock]:
        return list(self.blocks.values()) + ([self.remote] if self.remote is not None else [])

    # ------------------------------------------------------------------ an aggregation (fgplugin.aggregation)
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``dist_spmm(self, h)``: layers and models aggregate over this like over a single-device graph."""
        return dist_spmm(self, h)

    @property
    def shape(self) -> tuple[int, int]:
        """This rank's rows in and out (the aggregation's view of the sharded product)."""
        return (self.num_rows, self.num_rows)

    @property
    def key(self) -> tuple:
        return (self,)

    def vector_width(self, features: int, dtype: torch.dtype) -> int:
        """Whole 16-byte rows of ``dtype`` and of the wire dtype: the received rows are multiplied
        in the latter, so neither the products nor the exchange pad a copy."""
        return max(padded_width(features, dtype, self.device),
                   padded_width(features, self.ctx.comm_dtype or dtype, self.device))

    # ------------------------------------------------------------------ SpMM
    def region(self, kind: str):
        """The profiler's timing region ``kind``, or nothing without a profiler. Kinds:
        ``spmm_local`` (the own block's product, which overlaps the transfers), ``spmm_remote``
        (the other blocks' products), ``pack`` (gathering rows into send buffers, wire dtype
        casts, adding received partial products in) and ``comm`` (waits for transfers and
        all-reduces: exposed communication)."""
        return nullcontext() if self.profiler is None else self.profiler.region(kind)

    def _wait(self, works):
        with self.region("comm"):
            for w in works:
                w.wait()

    def _product_kind(self, b: ColumnBlock) -> str:
        return "spmm_local" if b.j == self.ctx.block else "spmm_remote"

    def _block_mm(self, b: ColumnBlock, h: torch.Tensor, out: torch.Tensor | None,
                  skip_zero_rows: bool = False) -> torch.Tensor:
        with self.region(self._product_kind(b)):
            product = spmm_skipping_zero_rows if skip_zero_rows else spmm
            t = product(b.adj, h, self.row_scale, b.col_scale, b.diag)
            return t if out is None else out.add_(t)

    def _block_mm_t(self, b: ColumnBlock, grad: torch.Tensor) -> torch.Tensor:
        """A backward product: it leaves out the zero rows of ``grad`` where that pays
        (fgplugin.grad_rows; a local decision, the exchange does not depend on it)."""
        with self.region(self._product_kind(b)):
            return spmm_skipping_zero_rows(b.adj_t, grad, b.col_scale, self.row_scale, b.diag)

    def _pack(self, t: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``rows`` of ``t`` (all of them when ``None``) as a contiguous send buffer in the wire dtype."""
        with self.region("pack"):
            if rows is not None:
                t = t.index_select(0, rows)
            dtype = self.ctx.comm_dtype
            return t.contiguous() if dtype is None or dtype == t.dtype else t.to(dtype)

    def _unpack(self, buf: torch.Tensor, dtype, received_rows: int | None = None) -> torch.Tensor:
        """A received buffer in the compute dtype ``dtype``; ``received_rows`` of it came over
        the wire (default: all)."""
        self._count_received(buf, received_rows)
        if buf.dtype == dtype:
            return buf
        with self.region("pack"):
            return buf.to(dtype)

    def _count_received(self, buf: torch.Tensor, received_rows: int | None = None) -> None:
        if self.profiler is not None:
            rows = buf.shape[0] if received_rows is None else received_rows
            self.profiler.bytes_received += rows * (buf.numel() // max(buf.shape[0], 1)) * buf.element_size()

    def _recv_slice(self, stacked: torch.Tensor, j: int) -> torch.Tensor:
        offset, count = self.recv_slices[j]
        return stacked[offset:offset + count]

    def _remote_part_t(self, grad: torch.Tensor, wire) -> torch.Tensor:
        """The transposed remote product ``remote^T G`` (stacked partial products for the other
        blocks' rows) in the wire dtype; zeros when this rank has no remote edges. With a
        narrower wire dtype ``G`` is cast first (``n_g`` rows) and the product runs in it, instead
        of casting its output (a row per remote column, several times ``n_g``)."""
        if self.remote is None:
            return torch.zeros(self.recv_rows, grad.shape[1], dtype=wire, device=grad.device)
        return self._pack(self._block_mm_t(self.remote, self._pack(grad)))

    def _forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self._product(h)
        if self.ctx.row_group is not None:
            with self.region("comm"):
                dist.all_reduce(out, group=self.ctx.row_group)
        return out

    def _product(self, h: torch.Tensor, skip_zero_rows: bool = False) -> torch.Tensor:
        """This rank's ``sum_{j in J_k} A_gj H_j`` (before the 1.5D all-reduce over the replicas).
        ``skip_zero_rows`` (the backward of a symmetric graph, where ``H`` is the gradient): only
        ``H``'s non-zero rows travel where that pays (:mod:`fgplugin.distributed.live_rows`), and
        the products leave out the zero rows."""
        compaction = self.live_rows.prepare(self, h) if skip_zero_rows else None
        if compaction is not None:
            return compact_product(self, h, compaction)
        ctx, g = self.ctx, self.ctx.block
        f, wire = h.shape[1], self.ctx.comm_dtype or h.dtype
        out = None
        # Every transfer is posted at once (one NCCL group in sparse mode), the own block's product
        # overlaps them, then one product over all received rows: one remote product instead of
        # one per column block, each of which wrote and re-added a full [n_g, F] output.
        recv_all = torch.empty(self.recv_rows, f, dtype=wire, device=h.device)
        if self.gathers:
            # One all-gather into recv_all, in place: this rank's slot holds its own rows. The
            # slot's padding rows (blocks differ in size by one) are zeroed: a dense tile of the
            # remote block that spans them multiplies them by zero, and 0 * NaN is NaN.
            stride = self.recv_rows // ctx.num_blocks
            slot = recv_all[g * stride:(g + 1) * stride]
            with self.region("pack"):
                slot[:self.num_rows].copy_(h)
                slot[self.num_rows:].zero_()
            works = [all_gather_into(recv_all, slot, group=ctx.col_group, async_op=True)]
        elif self.comm == "broadcast":
            # The owner sends its block as it is (no gather into a send buffer); the others receive
            # it straight into its slice of recv_all.
            works = [dist.broadcast(self._pack(h) if j == g else self._recv_slice(recv_all, j), ctx.owner(j),
                                    group=ctx.col_group, async_op=True) for j in ctx.col_blocks]
        else:
            works = self._exchange(recv_all, dist.irecv, self._pack(h, self.send_rows), dist.isend)
        if g in self.blocks:
            out = self._block_mm(self.blocks[g], h, out, skip_zero_rows)
        self._wait(works)
        if self.remote is not None:
            # The received rows are multiplied in the wire dtype as they arrived, and the result
            # is added in h's: casting the whole buffer to h's dtype first cost more than the
            # transfer saved (products-like, 4 H200s, bf16: 1.8 ms of casts per epoch), and a
            # 16-bit product reads half the bytes. It rounds the remote part of the sum once more
            # to the wire dtype, on top of the rounding of its inputs.
            self._count_received(recv_all, self.received_rows)
            out = self._block_mm(self.remote, recv_all, out, skip_zero_rows)
        return self._product_result(out, h)

    def _product_result(self, out: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        """The summed block products ``out`` as the product of ``h``: zeros when this rank
        multiplies no block, in ``h``'s dtype."""
        if out is None:  # every block this rank multiplies is empty
            return torch.zeros(self.num_rows, h.shape[1], dtype=h.dtype, device=h.device)
        if out.dtype != h.dtype:  # only the remote block's product, in the wire dtype (1.5D)
            with self.region("pack"):
                out = out.to(h.dtype)
        return out

    def _exchange(self, remote, remote_op, peer, peer_op, recv_slices=None, send_slices=None) -> list:
        """Posts the sparse exchange in one group: slice ``recv_slices[j]`` of ``remote`` (the
        stacked rows of the other blocks) with block j's owner, and slice ``send_slices[k]`` of
        ``peer`` (the rows ``send_rows`` of this block) with each member k that reads some. The
        forward product receives ``remote`` and sends ``peer``; the transposed backward sends
        ``remote``'s partial products and receives theirs into ``peer``. The slices default to the
        graph's (the live-row exchange passes its own)."""
        ctx, g, q = self.ctx, self.ctx.block, self.ctx.num_blocks
        recv_slices = self.recv_slices if recv_slices is None else recv_slices
        send_slices = self.send_slices if send_slices is None else send_slices
        ops = []
        for step in range(1, q):
            j, k = (g + step) % q, (g - step) % q
            offset, count = recv_slices.get(j, (0, 0))
            if count:
                ops.append(dist.P2POp(remote_op, remote[offset:offset + count], ctx.owner(j), ctx.col_group))
            offset, count = send_slices.get(k, (0, 0))
            if count:
                ops.append(dist.P2POp(peer_op, peer[offset:offset + count], ctx.owner(k), ctx.col_group))
        return dist.batch_isend_irecv(ops) if ops else []

    def _backward(self, grad: torch.Tensor) -> torch.Tensor:
        ctx, g = self.ctx, self.ctx.block
        if ctx.row_group is not None:
            grad = grad.clone()  # the replicas' partial gradients sum to the gradient of T_g
            with self.region("comm"):
                dist.all_reduce(grad, group=ctx.row_group)
        if self.symmetric:
            # A_gj^T = A_jg, so dL/dH_g = sum_j A_gj G_j: the forward product of G (in 1.5D this
            # replica's partial sum over J_k, which is what a replicated tensor's gradient is).
            # It moves the rows of G this rank reads instead of partial products of every column
            # it touches (as many bytes), and it multiplies no transposed block: in sparse mode
            # that one has a row per remote column (2.8x the own rows, products-like on 4 GPUs)
            # and its partial products had to be scatter-added at the owner.
            return self._product(grad, skip_zero_rows=True)
        f, wire = grad.shape[1], self.ctx.comm_dtype or grad.dtype
        out = None
        if self.comm == "broadcast":
            # Every block's partial product goes to its owner by a reduce (posted in column-block
            # order, the same on every rank); the owner's own part receives the sum.
            part = self._remote_part_t(grad, wire)
            own = self._pack(self._block_mm_t(self.blocks[g], grad)) if g in self.blocks else None
            works = [dist.reduce(own if j == g else self._recv_slice(part, j), ctx.owner(j), group=ctx.col_group,
                                 async_op=True) for j in ctx.col_blocks]
            self._wait(works)
            if own is not None:
                out = self._unpack(own, grad.dtype)
        else:
            # The remote product is computed first and its slices sent to their owners while the
            # own block's product runs; what other ranks computed for this block's rows arrives
            # stacked and is added at the rows they read (send_rows).
            part = self._remote_part_t(grad, wire)
            recv = torch.empty(self.send_rows.numel(), f, dtype=wire, device=grad.device)
            works = self._exchange(part, dist.isend, recv, dist.irecv)
            if g in self.blocks:
                out = self._block_mm_t(self.blocks[g], grad)
            self._wait(works)
            if self.send_rows.numel():
                recv = self._unpack(recv, grad.dtype)
                with self.region("pack"):
                    if out is None:
                        out = torch.zeros(self.num_rows, f, dtype=grad.dtype, device=grad.device)
                    out.index_add_(0, self.send_rows, recv)
        if out is None:  # this replica holds no part of its own block's gradient
            out = torch.zeros(self.num_rows, f, dtype=grad.dtype, device=grad.device)
        return out

    def __repr__(self) -> str:
        m = {j: b.adj.shape[1] for j, b in self.blocks.items()}
        if self.remote is not None:
            m["remote"] = self.remote.adj.shape[1]
        nnz = sum(b.adj.nnz for b in self._all_blocks())
        return (f"ShardedGraph(rank {self.ctx.rank}: rows [{self.row_start}, {self.row_end}) of {self.num_nodes}, "
                f"column blocks {m} (columns each), nnz={nnz} of {self.num_edges}, {self.ctx.scheme} "
                f"r={self.ctx.replication}, comm={self.comm!r}, device={self.ctx.device})")


class _DistSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, graph):
        ctx.graph = graph
        return _vector_padded(graph, graph._forward, h)

    @staticmethod
    @once_differentiable  # the exchange is not recorded: a double backward must fail, not be wrong
    def backward(ctx, grad):
        return _vector_padded(ctx.graph, ctx.graph._backward, grad), None


def _vector_padded(graph: ShardedGraph, product, x: torch.Tensor) -> torch.Tensor:
    """``product(x)``, run on ``x`` padded with zero columns to ``graph.vector_width`` (whole
    16-byte rows on CUDA, of the wire dtype too: the received rows are multiplied in it), and cut
    back.

    Why: every spmm call would otherwise pad its own operand and cut its own output, and the
    operands here include the buffer of received rows (2.8x the own rows on products-like, 4
    GPUs) and, in the transposed backward, the remote partial products. Padded once, the zero
    columns travel (F=47 -> 48: 2% more bytes) and every product runs on them as they are; the
    results are the same numbers."""
    x = x.contiguous()
    pad = graph.vector_width(x.shape[1], x.dtype) - x.shape[1]
    if not pad:
        return product(x)
    return product(torch.nn.functional.pad(x, (0, pad)))[:, :x.shape[1]].contiguous()


def dist_spmm(graph: ShardedGraph, h: torch.Tensor) -> torch.Tensor:
    r"""Normalized aggregation :math:`T = \hat A H` over the sharded graph, differentiable in ``h``.

    ``h`` is this rank's rows ``[n_g, F]`` (reordered order); returns this rank's rows of ``T``.
    Every rank of the world must call it the same number of times, in the same order.
    """
    if not isinstance(graph, ShardedGraph):
        raise TypeError(f"dist_spmm expects a ShardedGraph, got {type(graph).__name__}")
    if h.dim() != 2 or h.shape[0] != graph.num_rows:
        raise ValueError(f"dist_spmm: h must be this rank's rows [{graph.num_rows}, F] (rows "
                         f"[{graph.row_start}, {graph.row_end}) of the reordered graph), got {list(h.shape)}")
    if h.device != graph.ctx.device:
        raise ValueError(f"dist_spmm: h is on {h.device} but the graph is on {graph.ctx.device}")
    return _DistSpMM.apply(h, graph)


# ---------------------------------------------------------------------- helpers
def _is_symmetric(adj: TiledAdjacency) -> bool:
    if not adj.is_square:
        return False
    t_rowptr, _, _ = adj.transpose()
    symmetric = t_rowptr is adj.rowptr
    adj._shared.pop("transpose", None)  # the forward never needs it; keep the memory
    return symmetric


_FIELDS = ("num_nodes", "num_edges", "edge hash 1", "edge hash 2", "perm hash", "world size", "replication",
           "comm", "norm", "improved", "add_self_loops", "replace_loops", "grad_rows.MIN_WORK",
           "grad_rows.MAX_LIVE_FRACTION x 1e6", "grad_rows.MAX_MISSES", "grad_rows.MAX_KEPT")


def _remote_block(parts, offsets: dict[int, int], width: int, n_own: int, options: dict, transpose: bool):
    """One :class:`ColumnBlock` of ``width`` columns over the rows received from every other block,
    block j's ``count`` rows at column ``offsets[j]``, from ``parts = [(j, count, local column ids,
    rows, column scales or None)]``, with its transpose when ``transpose``; ``None`` without edges.
    Columns no part covers (slot padding, the own block's slot of an all-gather) hold no edges."""
    if sum(c.numel() for _, _, c, _, _ in parts) == 0:
        return None
    col = torch.cat([c + offsets[j] for j, _, c, _, _ in parts])
    row = torch.cat([r for *_, r, _ in parts])
    col_scale = None
    if parts[0][4] is not None:
        col_scale = torch.zeros(width, dtype=parts[0][4].dtype, device=col.device)
        for j, count, _, _, cs in parts:
            col_scale[offsets[j]:offsets[j] + count] = cs
    adj = TiledAdjacency.from_edge_index(torch.stack([col, row]), size=(width, n_own), keep_edge_order=False,
                                         **options)
    adj_t = TiledAdjacency.from_edge_index(torch.stack([row, col]), size=(n_own, width), keep_edge_order=False,
                                           **options) if transpose else None
    return ColumnBlock(-1, adj, adj_t, col_scale, None)


def _resolve_comm(read_rows: int, other_rows: int, device) -> str:
    """``comm="auto"``: ``"sparse"`` when the ranks together read at most
    :data:`AUTO_SPARSE_MAX_SHARE` of the rows of the other blocks they multiply (this rank:
    ``read_rows`` of ``other_rows``), else ``"broadcast"``; the same answer on every rank (one
    all-reduce)."""
    counts = torch.tensor([read_rows, other_rows], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return "sparse" if counts[0] <= AUTO_SPARSE_MAX_SHARE * counts[1] else "broadcast"


def _add_pair_hashes(hashes: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``hashes`` (one per entry of ``_HASHES``, or fewer: the first ones) plus the hashes of the
    pairs ``(a_i, b_i)`` (ids below 2**31) as a multiset: a sum over the pairs of a cubic of a linear key, modulo a prime.
    The cubic is what catches a rewiring that keeps every degree (two edges swapping targets), which
    leaves a sum of linear keys unchanged."""
    a, b = a.long(), b.long()  # the products below need int64
    out = []
    for (prime, ca, cb), h in zip(_HASHES, hashes):
        key = (a * ca + b * cb + 12345) % prime
        cube = key * key % prime * key % prime
        out.append((h + cube.sum() % prime) % prime)
    return torch.stack(out)


def _same_multiset(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.equal(torch.sort(a).values, torch.sort(b).values)


def _exchange_needs(ctx: ShardingContext, needs: dict[int, torch.Tensor], layout: BlockLayout) -> dict[int, torch.Tensor]:
    """Tell each block owner which of its rows this rank reads; returns, if this rank owns a block
    of its column group, the rows each other member reads from it (by member block index)."""
    g, device = ctx.block, ctx.device
    owns = g in ctx.col_blocks
    members = [i for i in range(ctx.num_blocks) if i != g] if owns else []
    counts = {i: torch.zeros(1, dtype=torch.long, device=device) for i in members}
    ops = [dist.P2POp(dist.isend, torch.tensor([needs[j].numel()], dtype=torch.long, device=device), ctx.owner(j),
                      ctx.col_group) for j in sorted(needs)]
    ops += [dist.P2POp(dist.irecv, counts[i], ctx.owner(i), ctx.col_group) for i in members]
    _run(ops)
    send_idx = {i: torch.empty(int(counts[i]), dtype=torch.long, device=device) for i in members}
    ops = [dist.P2POp(dist.isend, needs[j].contiguous(), ctx.owner(j), ctx.col_group) for j in sorted(needs)
           if needs[j].numel()]
    ops += [dist.P2POp(dist.irecv, send_idx[i], ctx.owner(i), ctx.col_group) for i in members if send_idx[i].numel()]
    _run(ops)
    for i, idx in send_idx.items():
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= layout.size(g)):
            raise RuntimeError(f"rank {ctx.rank}: block {i} asked for rows outside this rank's block; the ranks "
                               "disagree on the block layout")
    return send_idx


def _run(ops) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()

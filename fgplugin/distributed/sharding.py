r"""One rank's row block of a graph and the distributed SpMM over it (PAPER.md section 1).

Rank ``(g, k)`` (block ``g``, replica ``k``; see :mod:`fgplugin.distributed.context`) holds the rows
``[s_g, e_g)`` of the normalized adjacency, cut into the column blocks ``A_gj`` it multiplies
(``j in J_k``), each a :class:`~fgplugin.TiledAdjacency` of shape ``(n_g, m_gj)`` together with its
transpose for the backward pass. It computes

.. math::
    T_g = \sum_{j \in J_k} \mathrm{diag}(r_g)\,(A_{gj} + [j = g]\,\mathrm{diag}(d_g))\,\mathrm{diag}(c_j)\,H_j

and, for ``r > 1``, all-reduces ``T_g`` over the replicas of block ``g``. Feature blocks ``H_j`` travel
inside the column group, with the transfer of the next block in flight while the current one is
multiplied:

- ``comm="broadcast"``: the owner broadcasts all of ``H_j`` (the paper's scheme); ``m_gj = n_j``.
- ``comm="sparse"``: rank ``g`` receives only the rows of ``H_j`` that ``A_gj`` has non-zeros in;
  ``A_gj``'s columns are compacted to those rows (``m_gj`` = their count). Transfers are point to
  point in a ring-shift schedule: at step ``s`` rank ``g`` receives block ``(g + s) mod q`` and sends
  its own rows to rank ``(g - s) mod q``, so every link carries one message per step.

Backward, ``dL/dH_j = sum_g A_gj^T G_g``. When the normalized adjacency is symmetric (a symmetric
edge multiset and equal row and column scales: GCN normalization of an undirected graph, the usual
case) ``A_gj^T = A_jg``, so the backward *is* the forward product applied to the gradient
``G``: the same exchange (the rows of ``G`` this rank reads) and the same blocks, with no transposed
blocks at all. Otherwise each rank multiplies its transposed blocks and sends the partial products
to the block owners (``reduce`` in broadcast mode, point to point in sparse mode), again overlapped
with the next block's product. Gradients of replicated tensors are *partial* per replica (their sum
over the replicas is the true gradient); the training wrapper accounts for it (loss scaled by
``1/r``, weight gradients all-reduced with SUM).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..ops import _vector_pad, spmm
from ..tiling import TiledAdjacency
from .context import BlockLayout, ShardingContext

_MOD = 2**31 - 1
_CHUNK = 1 << 24  # edges read per step while sharding (bounds temporaries; works on memory maps)
NORMS = ("gcn", "mean", "both", "none")


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
        blocks: the :class:`ColumnBlock` s this rank multiplies, by column block index (sparse
            mode: only its own block ``g``; the others are merged into ``remote``).
        remote: sparse mode: one :class:`ColumnBlock` over the rows this rank receives from every
            other block, stacked in block order (``recv_slices[j] = (offset, count)``). One SpMM
            over it replaces one per block: each of those wrote and re-added a full ``[n_g, F]``
            output and launched work for all ``n_g`` rows, which doubled the per-rank SpMM time
            on 4 GPUs (products-like: 16 ms against 8 ms ideal).
        row_scale: ``[n_g]`` row scale of the normalization (or ``None``).
        send_rows, send_slices: sparse mode: the rows of this block that the other members of the
            column group read, stacked by member block ``k``, and ``send_slices[k] = (offset,
            count)``; one gather packs every send (one scatter-add unpacks what the transposed
            backward receives).
        symmetric: the normalized adjacency equals its transpose (checked exactly at
            construction, the same on every rank); the backward then runs the forward product.
        fingerprint: ints identifying the graph, equal on every rank (checked at construction).
        profiler: a :class:`~fgplugin.distributed.profile.Profiler` to time the block products,
            the packing of rows for the wire and exposed communication, or ``None`` (default).
    """

    def __init__(self, ctx: ShardingContext, num_nodes: int, num_edges: int, perm, blocks, row_scale, send_idx,
                 fingerprint, remote=None, recv_slices=None, symmetric=False):
        self.ctx = ctx
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
        self.symmetric = bool(symmetric)
        self.fingerprint = fingerprint
        self.profiler = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_edge_index(cls, ctx: ShardingContext, edge_index, num_nodes: int, *, perm: torch.Tensor | None = None,
                        norm: str = "gcn", improved: bool = False, tile_size: int = 32, threshold: float = 0.05,
                        extra_fingerprint=()) -> "ShardedGraph":
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
                ``"mean"``, ``"both"`` (DGL) or ``"none"``; degrees are those of the whole graph.
            improved: GCN with self-loop weight 2.
            tile_size, threshold: tile plan options of the blocks.
            extra_fingerprint: ints that must also agree between ranks (e.g. feature width).

        Raises:
            ValueError: on every rank, when the ranks were given different graphs, orderings or
                sharding options (an all-gathered fingerprint differs).
        """
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
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
        h1 = torch.zeros((), dtype=torch.long, device=device)
        h2 = torch.zeros((), dtype=torch.long, device=device)
        bad = torch.zeros((), dtype=torch.bool, device=device)
        for a in range(0, num_edges, _CHUNK):
            e = torch.as_tensor(edge_index[:, a:a + _CHUNK]).to(device=device, dtype=torch.long)
            src, dst = e[0], e[1]
            bad |= ((src < 0) | (src >= n) | (dst < 0) | (dst >= n)).any()
            # Order-free hash of the edge set (in original ids), so ranks can check they agree.
            key = (src * 40503 + dst) % _MOD
            h1 += key.sum()
            h2 += ((key * 69069 + 12345) % _MOD).sum()
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
        symmetric = _same_multiset(dst * n + src, torch.cat(leaving))
        del leaving

        perm_hash = 0 if perm is None else int(((perm % _MOD) * (torch.arange(n, device=device) % 65521 + 1) % _MOD).sum())
        fingerprint = [n, num_edges, int(h1), int(h2), perm_hash, ctx.world_size, ctx.replication,
                       ("broadcast", "sparse").index(ctx.comm), NORMS.index(norm), int(improved),
                       *[int(v) for v in extra_fingerprint]]
        _check_agreement(fingerprint, device)

        # Degrees of the whole graph: this rank owns full rows, so its edges give its rows'
        # in-degrees and self loops exactly; one all-reduce (replica 0 of each block adds) spreads them.
        stats = torch.zeros(3, n, dtype=torch.float32, device=device)
        if ctx.replica == 0:
            stats[0, s:s + n_own] = torch.bincount(dst, minlength=n_own).to(torch.float32)
            loops = dst[src == dst + s]
            stats[1, s:s + n_own].index_fill_(0, loops, 1.0)
            if norm == "both":
                stats[2] = torch.bincount(src, minlength=n).to(torch.float32)
        asymmetric = torch.tensor([0 if symmetric else 1], dtype=torch.long, device=device)
        dist.all_reduce(stats)
        dist.all_reduce(asymmetric)
        row_scale, col_scale, diag = _normalization(stats, norm, improved)
        del stats
        # Symmetric structure and equal row and column scales: the normalized blocks satisfy
        # A_gj^T = A_jg, so the backward runs the forward product and needs no transposed blocks.
        symmetric = int(asymmetric) == 0 and (col_scale is row_scale or (
            row_scale is not None and col_scale is not None and torch.equal(row_scale, col_scale)))
        own = slice(s, s + n_own)
        row_scale_own = None if row_scale is None else row_scale[own].contiguous()
        diag_own = None if diag is None else diag[own].contiguous()

        blocks, needs, remote_parts = {}, {}, []
        options = dict(tile_size=tile_size, threshold=threshold)
        for j in ctx.col_blocks:
            sj, nj = layout.start(j), layout.size(j)
            sel = (src >= sj) & (src < sj + nj)
            col_j, row_j = src[sel] - sj, dst[sel]
            cs = None if col_scale is None else col_scale[sj:sj + nj]
            del sel
            if ctx.comm == "sparse" and j != g:
                # Only the rows of block j that this rank's edges touch travel; they get the column
                # ids of one compacted "remote" block (see below).
                cols, col_j = torch.unique(col_j, return_inverse=True)
                needs[j] = cols
                remote_parts.append((j, cols.numel(), col_j, row_j, None if cs is None else cs[cols]))
                continue
            adj = TiledAdjacency.from_edge_index(torch.stack([col_j, row_j]), size=(nj, n_own), keep_edge_order=False,
                                                 **options)
            if symmetric:
                adj_t = None
            elif j == g and _is_symmetric(adj):
                adj_t = adj
            else:
                adj_t = TiledAdjacency.from_edge_index(torch.stack([row_j, col_j]), size=(n_own, nj),
                                                       keep_edge_order=False, **options)
            blocks[j] = ColumnBlock(j, adj, adj_t, None if cs is None else cs.contiguous(),
                                    diag_own if j == g else None)
            del col_j, row_j
        del src, dst
        remote, recv_slices = _remote_block(remote_parts, n_own, options, transpose=not symmetric)
        del remote_parts
        send_idx = _exchange_needs(ctx, needs, layout) if ctx.comm == "sparse" else {}
        return cls(ctx, n, num_edges, perm, blocks, row_scale_own, send_idx, fingerprint, remote, recv_slices,
                   symmetric)

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

    def aggregate(self, h: torch.Tensor) -> torch.Tensor:
        """``dist_spmm(self, h)``, so models take either this or a single-process graph."""
        return dist_spmm(self, h)

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

    def _block_mm(self, b: ColumnBlock, h: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        with self.region(self._product_kind(b)):
            t = spmm(b.adj, h, self.row_scale, b.col_scale, b.diag)
            return t if out is None else out.add_(t)

    def _block_mm_t(self, b: ColumnBlock, grad: torch.Tensor) -> torch.Tensor:
        with self.region(self._product_kind(b)):
            return spmm(b.adj_t, grad, b.col_scale, self.row_scale, b.diag)

    def _pack(self, t: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``rows`` of ``t`` (all of them when ``None``) as a contiguous send buffer in the wire dtype."""
        with self.region("pack"):
            if rows is not None:
                t = t.index_select(0, rows)
            dtype = self.ctx.comm_dtype
            return t.contiguous() if dtype is None or dtype == t.dtype else t.to(dtype)

    def _unpack(self, buf: torch.Tensor, dtype) -> torch.Tensor:
        """A received buffer in the compute dtype ``dtype``."""
        if self.profiler is not None:
            self.profiler.bytes_received += buf.numel() * buf.element_size()
        if buf.dtype == dtype:
            return buf
        with self.region("pack"):
            return buf.to(dtype)

    def _forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self._product(h)
        if self.ctx.row_group is not None:
            with self.region("comm"):
                dist.all_reduce(out, group=self.ctx.row_group)
        return out

    def _product(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's ``sum_{j in J_k} A_gj H_j`` (before the 1.5D all-reduce over the replicas)."""
        ctx, g = self.ctx, self.ctx.block
        f, wire = h.shape[1], self.ctx.comm_dtype or h.dtype
        out = None
        if ctx.comm == "broadcast":
            order = ctx.col_blocks  # the collective order every member of the column group follows

            def post(j):
                if j == g:
                    buf = self._pack(h)
                else:
                    buf = torch.empty(self.layout.size(j), f, dtype=wire, device=h.device)
                return [dist.broadcast(buf, ctx.owner(j), group=ctx.col_group, async_op=True)], buf

            inflight = post(order[0]) if order else None
            if g in self.blocks:
                out = self._block_mm(self.blocks[g], h, out)  # overlaps the first transfer
            for i, j in enumerate(order):
                nxt = post(order[i + 1]) if i + 1 < len(order) else None
                self._wait(inflight[0])
                if j != g:
                    out = self._block_mm(self.blocks[j], self._unpack(inflight[1], h.dtype), out)
                inflight = nxt
        else:
            # Every transfer is posted at once (one NCCL group), the own block's product overlaps
            # them, then one product over all received rows.
            recv_all = None if self.remote is None else torch.empty(self.remote.adj.shape[1], f, dtype=wire,
                                                                     device=h.device)
            works = self._exchange(recv_all, dist.irecv, self._pack(h, self.send_rows), dist.isend)
            if g in self.blocks:
                out = self._block_mm(self.blocks[g], h, out)
            self._wait(works)
            if self.remote is not None:
                out = self._block_mm(self.remote, self._unpack(recv_all, h.dtype), out)
        if out is None:  # every block this rank multiplies is empty
            out = torch.zeros(self.num_rows, f, dtype=h.dtype, device=h.device)
        return out

    def _exchange(self, remote, remote_op, peer, peer_op) -> list:
        """Posts the sparse exchange in one group: slice ``recv_slices[j]`` of ``remote`` (the
        stacked rows of the other blocks) with block j's owner, and slice ``send_slices[k]`` of
        ``peer`` (the rows ``send_rows`` of this block) with each member k that reads some. The
        forward product receives ``remote`` and sends ``peer``; the transposed backward sends
        ``remote``'s partial products and receives theirs into ``peer``."""
        ctx, g, q = self.ctx, self.ctx.block, self.ctx.num_blocks
        ops = []
        for step in range(1, q):
            j, k = (g + step) % q, (g - step) % q
            offset, count = self.recv_slices.get(j, (0, 0))
            if count:
                ops.append(dist.P2POp(remote_op, remote[offset:offset + count], ctx.owner(j), ctx.col_group))
            offset, count = self.send_slices.get(k, (0, 0))
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
            return self._product(grad)
        f, wire = grad.shape[1], self.ctx.comm_dtype or grad.dtype
        out = None
        if ctx.comm == "broadcast":
            pending = []

            def finish(works, part, j):
                self._wait(works)
                return self._unpack(part, grad.dtype) if j == g else out

            for j in ctx.col_blocks:
                part = self._pack(self._block_mm_t(self.blocks[j], grad))
                if len(pending) >= 2:  # at most two partial products in flight: O(n/p) memory
                    out = finish(*pending.pop(0))
                pending.append(([dist.reduce(part, ctx.owner(j), group=ctx.col_group, async_op=True)], part, j))
            for item in pending:
                out = finish(*item)
        else:
            # The remote product is computed first and its slices sent to their owners while the
            # own block's product runs; what other ranks computed for this block's rows arrives
            # stacked and is added at the rows they read (send_rows).
            part = None if self.remote is None else self._pack(self._block_mm_t(self.remote, grad))
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
                f"r={self.ctx.replication}, comm={self.ctx.comm!r}, device={self.ctx.device})")


class _DistSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, graph):
        ctx.graph = graph
        return _vector_padded(graph._forward, h)

    @staticmethod
    def backward(ctx, grad):
        return _vector_padded(ctx.graph._backward, grad), None


def _vector_padded(product, x: torch.Tensor) -> torch.Tensor:
    """``product(x)``, run on ``x`` padded with zero columns to the width fgplugin.spmm pads to
    on CUDA (whole 16-byte rows), and cut back.

    Why: every spmm call would otherwise pad its own operand and cut its own output, and the
    operands here include the buffer of received rows (2.8x the own rows on products-like, 4
    GPUs) and, in the transposed backward, the remote partial products. Padded once, the zero
    columns travel (F=47 -> 48: 2% more bytes) and every product runs on them as they are; the
    results are the same numbers."""
    x = x.contiguous()
    pad = _vector_pad(x)
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
def _normalization(stats: torch.Tensor, norm: str, improved: bool):
    in_deg, has_loop, out_deg = stats
    if norm == "gcn":
        diag = (1.0 - has_loop) * (2.0 if improved else 1.0)
        inv_sqrt = (in_deg + diag).rsqrt()
        inv_sqrt = inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)
        return inv_sqrt, inv_sqrt, diag
    if norm == "mean":
        return in_deg.clamp(min=1).reciprocal(), None, None
    if norm == "both":
        return in_deg.clamp(min=1).rsqrt(), out_deg.clamp(min=1).rsqrt(), None
    return None, None, None


def _is_symmetric(adj: TiledAdjacency) -> bool:
    if not adj.is_square:
        return False
    t_rowptr, _, _ = adj.transpose()
    symmetric = t_rowptr is adj.rowptr
    adj._shared.pop("transpose", None)  # the forward never needs it; keep the memory
    return symmetric


_FIELDS = ("num_nodes", "num_edges", "edge hash 1", "edge hash 2", "perm hash", "world size", "replication",
           "comm", "norm", "improved")


def _remote_block(parts, n_own: int, options: dict, transpose: bool):
    """One :class:`ColumnBlock` over the received rows of every other block, stacked in the order
    of ``parts`` = ``[(j, count, local column ids, rows, column scales or None)]``, with its
    transpose when ``transpose``, and each block's ``(offset, count)`` in it; ``(None, {})``
    without parts or edges."""
    slices, offset = {}, 0
    for j, count, *_ in parts:
        slices[j] = (offset, count)
        offset += count
    if offset == 0:
        return None, slices
    col = torch.cat([c + slices[j][0] for j, _, c, _, _ in parts])
    row = torch.cat([r for *_, r, _ in parts])
    scales = [cs for *_, cs in parts]
    col_scale = None if scales[0] is None else torch.cat(scales).contiguous()
    adj = TiledAdjacency.from_edge_index(torch.stack([col, row]), size=(offset, n_own), keep_edge_order=False,
                                         **options)
    adj_t = TiledAdjacency.from_edge_index(torch.stack([row, col]), size=(n_own, offset), keep_edge_order=False,
                                           **options) if transpose else None
    return ColumnBlock(-1, adj, adj_t, col_scale, None), slices


def _same_multiset(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.equal(torch.sort(a).values, torch.sort(b).values)


def _check_agreement(fingerprint: list[int], device) -> None:
    mine = torch.tensor(fingerprint, dtype=torch.long, device=device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.long, device=device))
    width = max(int(t) for t in sizes)
    padded = torch.full((width,), -1, dtype=torch.long, device=device)
    padded[:mine.numel()] = mine
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    rows = [t.tolist() for t in gathered]
    if all(row == rows[0] for row in rows):
        return
    diffs = []
    for i in range(width):
        values = [row[i] for row in rows]
        if len(set(values)) > 1:
            name = _FIELDS[i] if i < len(_FIELDS) else f"extra_fingerprint[{i - len(_FIELDS)}]"
            diffs.append(f"{name}: " + ", ".join(f"rank {r}={v}" for r, v in enumerate(values)))
    raise ValueError("fgplugin.distributed: the ranks were given different graphs or sharding options; every rank "
                     "must pass the same edge_index, num_nodes, perm and options. Differences: " + "; ".join(diffs))


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

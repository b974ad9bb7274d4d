"""The distributed backward sends only the non-zero rows of the gradient.

In full-batch training the loss reads only the training rows, so the gradient ``G`` that reaches
the last layer's aggregation is zero on every other row (:mod:`fgplugin.grad_rows`). On a
symmetric graph the distributed backward is the forward product applied to ``G``
(:mod:`fgplugin.distributed.sharding`), whose exchange would move every row of ``G`` that a rank
reads. Here only the non-zero rows travel (in broadcast mode one all-gather of them in 1D, one
broadcast per block in 1.5D), and the remote block is kept restricted to the columns of those rows,
renumbered to where they land in the compact receive buffer. With 10% of the nodes training (the
synthetic suite; ogbn-products 8%) the backward exchange moves about a tenth of the bytes and the
remote product reads about a tenth of the non-zeros. The terms left out are products with exact
zeros: the result is the same up to float rounding.

The ranks must agree on the size of every transfer, so each backward product starts with one small
all-gather over the column group of ``[live rows, kept compactions its rows match, skipping on]``
per block, read on the host (a sync). When no kept compaction matches on every rank, a second
all-gather sends the new row ids and every rank builds its restricted remote block. The
decisions use only gathered numbers and the graph's global sizes, so every rank of the group makes
the same ones.

In sparse mode each rank sends, of the rows another rank reads, only the live ones, and receives
likewise; both sides find them from the gathered row ids, so the ring exchange's sizes agree.

It runs when all of these hold (otherwise the full exchange runs, and each rank's products still
skip zero rows locally, which needs no agreement):

- a symmetric normalized graph and at least two row blocks;
- the zero-row skipping on in every rank of the group (:func:`fgplugin.set_row_skipping`), and a
  rank's share of the work, ``num_edges / q x F``, at least :data:`fgplugin.grad_rows.MIN_WORK`;
- at most :data:`~fgplugin.grad_rows.MAX_LIVE_FRACTION` of the graph's rows live;
- fewer than :data:`~fgplugin.grad_rows.MAX_MISSES` new sets of live rows in a row, and fewer than
  as many gradients in a row with too many live rows (then the graph stops trying: a model whose
  gradients are dense pays for the check three times).

Up to :data:`~fgplugin.grad_rows.MAX_KEPT` compactions are kept, one per layer whose gradient is
row-sparse; one unused in the last :data:`~fgplugin.grad_rows.STALE_USES` compact exchanges is
dropped. The thresholds are read when the graph is built and are part of its fingerprint, which
the ranks compare.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import grad_rows
from .._csr import aux_dtype_for
from ..config import settings
from ..kernel_plan import block_adaptive_available
from ..ops import csr_product, spmm_skipping_zero_rows
from .context import all_gather_into


@dataclass(eq=False)
class Compaction:
    """How the live rows travel, for one set of them (all slices ``(offset, count)`` in rows)."""

    live: torch.Tensor                 # bool [n_g]: this rank's non-zero gradient rows
    counts: list[int]                  # live rows of each block of the column group (by block index)
    send_idx: torch.Tensor             # rows of this block to pack for sending, long
    send_slices: dict[int, tuple[int, int]]  # sparse mode: member k's rows in the packed buffer
    recv_slices: dict[int, tuple[int, int]]  # block j's live rows in the compact receive buffer
    stride: int | None                 # 1D broadcast: rows of each rank's slot of the all-gather
    recv_rows: int                     # rows of the compact receive buffer
    remote: tuple | None = None        # (rowptr, col, col_scale or None) of the remote block over it
    plans: dict = field(default_factory=dict)  # kernel plans of ``remote`` (grad_rows.restriction_plan)
    last_use: int = 0                  # the exchange's use count when it was last used (KeptSets)


class LiveRowExchange:
    """Per :class:`~fgplugin.distributed.ShardedGraph`: the kept :class:`Compaction` s and their
    statistics (``sets``: :class:`fgplugin.grad_rows.KeptSets`, the same list on every rank).

    The thresholds are those of :mod:`fgplugin.grad_rows` when the graph was built;
    :meth:`settings` goes into the graph's fingerprint, so ranks with different ones refuse to
    build it instead of mismatching collectives later."""

    def __init__(self, device: torch.device):
        # No reference to the graph (it owns this object): a cycle would leave the graph's
        # tensors to the garbage collector, at interpreter exit after torch.distributed's teardown.
        self.min_work, self.max_live_fraction, self.max_misses, max_kept = self.settings(device)
        self.sets = grad_rows.KeptSets(max_kept=max_kept)  # of Compaction, per compact exchange run
        self.dense = 0  # gradients in a row with too many live rows

    @staticmethod
    def settings(device: torch.device) -> tuple:
        """``(MIN_WORK for the device, MAX_LIVE_FRACTION, MAX_MISSES, MAX_KEPT)`` of grad_rows now."""
        return (grad_rows.MIN_WORK.get(device.type, grad_rows.MIN_WORK["cuda"]), grad_rows.MAX_LIVE_FRACTION,
                grad_rows.MAX_MISSES, grad_rows.MAX_KEPT)

    def stats(self) -> dict:
        kept = self.sets.kept
        return {**self.sets.counts(), "live_rows": sum(kept[0].counts) if kept else None}

    def _eligible(self, g, features: int) -> bool:
        """The checks that need no communication; the same answer on every rank (the counters
        change only on gathered numbers). After ``max_misses`` new row sets, or as many dense
        gradients, in a row the graph stops trying: no collective, no sync."""
        share = g.num_edges // g.ctx.num_blocks  # a rank's share of the work, the same on every rank
        return (g.symmetric and g.ctx.num_blocks > 1 and features > 0 and not torch.is_grad_enabled()
                and self.sets.misses < self.max_misses and self.dense < self.max_misses
                and share * features >= self.min_work)

    def prepare(self, graph, grad: torch.Tensor) -> Compaction | None:
        """The compaction for ``grad`` (this rank's rows of ``graph``), or ``None`` for the full
        exchange. Collective over the column group when the graph qualifies."""
        if not self._eligible(graph, grad.shape[1]):
            return None
        ctx = graph.ctx
        live = grad_rows.nonzero_rows(grad)
        # Which kept compactions this rank's rows match (a bit each); every rank must match one.
        matches = sum(1 << i for i, kept in enumerate(self.sets.kept) if torch.equal(live, kept.live))
        mine = torch.tensor([0, matches, int(settings.skip_zero_rows)], dtype=torch.long, device=grad.device)
        mine[0] = live.sum()  # stays on the device: no host sync of its own
        with graph.region("comm"):
            info = _gather(mine, ctx).tolist()
        counts = [row[0] for row in info]
        if not all(row[2] for row in info):
            return None
        if not 0 < sum(counts) <= self.max_live_fraction * graph.num_nodes:
            self.dense += 1
            return None
        self.dense = 0
        common = functools.reduce(operator.and_, (row[1] for row in info))
        if common:
            kept = self.sets.kept[(common & -common).bit_length() - 1]  # the lowest common one
        else:
            idx = live.nonzero().squeeze(1)
            padded = torch.full((max(counts),), -1, dtype=torch.long, device=grad.device)
            padded[:idx.numel()] = idx
            with graph.region("comm"):
                ids = _gather(padded, ctx)
            with grad_rows.timed_build(self.sets, grad.device):
                kept = self._build(graph, live, idx, counts, ids)
        # Every rank records the same uses in the same order, so the ranks keep and drop the same.
        self.sets.record(kept, built=not common)
        return kept

    @staticmethod
    def _build(graph, live, idx, counts: list[int], ids: torch.Tensor) -> Compaction:
        ctx, g = graph.ctx, graph.ctx.block
        device = live.device
        sources = [j for j in ctx.col_blocks if j != g]
        # Which received rows are live: in broadcast mode the live rows of each block; in sparse
        # mode those of the rows this rank reads (recv_ids), in the order they arrive.
        received = {}  # block j -> positions, within the full slice recv_slices[j], of its live rows
        if graph.comm == "sparse":
            for j in sources:
                start, count = graph.recv_slices.get(j, (0, 0))
                mask = torch.zeros(graph.layout.size(j), dtype=torch.bool, device=device)
                mask[ids[j, :counts[j]]] = True
                received[j] = mask.index_select(0, graph.recv_ids[start:start + count]).nonzero().squeeze(1)
            # What this rank sends: the live ones of the rows each member reads, in their order.
            send, send_slices, offset = [], {}, 0
            for k, (start, count) in sorted(graph.send_slices.items()):
                rows = graph.send_rows[start:start + count]
                rows = rows[live.index_select(0, rows)]
                send.append(rows)
                send_slices[k], offset = (offset, rows.numel()), offset + rows.numel()
            send_idx = torch.cat(send) if send else idx[:0]
        else:
            received = {j: ids[j, :counts[j]] for j in sources}
            send_idx, send_slices = idx, {}
        stride = None
        if graph.gathers:  # one all-gather: block j's slot at j * (largest count)
            stride = max(counts)
            recv_slices = {j: (j * stride, counts[j]) for j in sources}
            recv_rows = ctx.num_blocks * stride
        else:
            recv_slices, recv_rows = {}, 0
            for j in sources:
                recv_slices[j], recv_rows = (recv_rows, received[j].numel()), recv_rows + received[j].numel()
        compaction = Compaction(live, counts, send_idx, send_slices, recv_slices, stride, recv_rows)
        remote = graph.remote
        if remote is None:
            return compaction
        # Column of the full remote block (a row of the full receive buffer) -> its position in
        # the compact one, -1 where the gradient row is zero.
        position = torch.full((graph.recv_rows,), -1, dtype=torch.long, device=device)
        for j in sources:
            start, offset = graph.recv_slices[j][0], recv_slices[j][0]
            position[start + received[j]] = torch.arange(offset, offset + received[j].numel(), device=device)
        live_columns = position >= 0
        adj = remote.adj  # no edge values: the blocks carry the normalization in their scales
        rowptr, _, col = grad_rows.restrict_columns(adj.rowptr, adj.col, live_columns)
        if col.numel() == 0:  # no edge of this rank reads a live row of another block
            return compaction
        col = position.index_select(0, col).to(adj.col.dtype)
        col_scale = None
        if remote.col_scale is not None:
            col_scale = remote.col_scale.new_zeros(recv_rows)
            col_scale[position[live_columns]] = remote.col_scale[live_columns]
        compaction.remote = (rowptr, col, col_scale)
        return compaction


def compact_product(graph, h: torch.Tensor, compaction: Compaction) -> torch.Tensor:
    """This rank's ``sum_{j in J_k} A_gj H_j`` (as ``ShardedGraph._product``) where ``H``'s rows
    outside ``compaction``'s live rows are zero: only live rows travel and are multiplied."""
    ctx, g = graph.ctx, graph.ctx.block
    f, wire = h.shape[1], ctx.comm_dtype or h.dtype
    recv = torch.empty(compaction.recv_rows, f, dtype=wire, device=h.device)
    with graph.region("pack"):
        send = h.index_select(0, compaction.send_idx).to(wire)
    counts = compaction.counts
    if graph.comm == "sparse":
        works = graph._exchange(recv, dist.irecv, send, dist.isend, compaction.recv_slices, compaction.send_slices)
    elif compaction.stride is not None:
        slot = recv[g * compaction.stride:(g + 1) * compaction.stride]
        with graph.region("pack"):
            slot[:counts[g]].copy_(send)
            slot[counts[g]:].zero_()
        works = [all_gather_into(recv, slot, group=ctx.col_group, async_op=True)]
    else:  # 1.5D broadcast: the owner of each block j of the column group sends its live rows
        works = []
        for j in ctx.col_blocks:
            if counts[j]:
                offset = compaction.recv_slices[j][0] if j != g else 0
                buf = send if j == g else recv[offset:offset + counts[j]]
                works.append(dist.broadcast(buf, ctx.owner(j), group=ctx.col_group, async_op=True))
    out = None
    if g in graph.blocks:
        own = graph.blocks[g]
        with graph.region("spmm_local"):
            out = spmm_skipping_zero_rows(own.adj, h, graph.row_scale, own.col_scale, own.diag, live=compaction.live)
    graph._wait(works)
    if compaction.remote is not None:
        graph._count_received(recv, sum(count for _, count in compaction.recv_slices.values()))
        with graph.region("spmm_remote"):
            t = _remote_product(graph, compaction, recv)
        out = t if out is None else out.add_(t)
    return graph._product_result(out, h)


def _remote_product(graph, compaction: Compaction, recv: torch.Tensor) -> torch.Tensor:
    rowptr, col, col_scale = compaction.remote
    plan = grad_rows.restriction_plan(compaction.plans, rowptr, col, (rowptr.numel() - 1, compaction.recv_rows),
                                      weighted=False, block_adaptive=block_adaptive_available(recv.device, recv.dtype))
    aux = aux_dtype_for(recv.dtype)
    row_scale = None if graph.row_scale is None else graph.row_scale.to(aux)
    col_scale = None if col_scale is None else col_scale.to(aux)
    return csr_product(rowptr, col, None, recv, row_scale, col_scale, None, plan)


def _gather(t: torch.Tensor, ctx) -> torch.Tensor:
    """``t`` of every member of the column group, stacked in block order: ``[q, *t.shape]``."""
    out = t.new_empty(ctx.num_blocks * t.numel())  # gloo wants the output flat
    all_gather_into(out, t.reshape(-1), group=ctx.col_group)
    return out.view(ctx.num_blocks, *t.shape)

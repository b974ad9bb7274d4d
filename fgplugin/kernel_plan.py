"""The block-adaptive CUDA kernel's plan of one CSR: :class:`KernelPlan`, built once per graph.

The CPU kernel and the plain CUDA CSR kernel need nothing beyond the CSR. The block-adaptive
kernel (csrc/cuda/block_adaptive_spmm.cu) needs the plan built here with vectorized torch ops on
the device; ``TiledAdjacency.kernel_plan`` resolves the threshold (``"auto"`` by the probe of
fgplugin.autotune) and caches one plan per graph, threshold, weights and device.

How the plan is made (format: csrc/cuda/block_adaptive_spmm.cuh, ``PLAN_VERSION``):

1. Every non-zero is classified by its ``T x T`` tile with the density rule of
   fgplugin.tile_density.
2. Dense non-zeros are regrouped into the kernel's 32 x 32 tiles (any ``T`` works: a dense
   64 x 64 tile becomes up to four 32 x 32 bitmaps, a dense 16 x 16 tile part of one), each with
   a 32-word bitmap and the same bits in the layout of the tensor-core A fragments (one word per
   lane); for weighted graphs also the CSR position of each entry (values are read per call, so
   new weights need no new plan). A repeated (row, col) entry stays in the remainder.
3. Tiles are grouped by row block (``BLOCK_PANELS`` row panels of 32 rows) and column panel: one
   such group is a *stage*, whose 32 rows of X the kernel loads once for all its tiles. Blocks
   with stages are listed most tiles first (longest job first).
4. The remainder keeps CSR order; each row is cut into work items of at most ``chunk`` entries
   (:func:`chunk_for`: fewer on small matrices), so a hub row is spread over several warps; rows
   with several items are summed by a second pass in a fixed order (deterministic, no atomics).

The sections are packed into one byte buffer on the device, described by a host-side ``layout``
(offsets, sizes, dtypes), so the op takes two arguments per plan and reads every size without a
device sync; the named fields of :class:`KernelPlan` are views into that buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from . import _extension
from ._csr import rows_of_edges
from .config import settings
from .tile_density import dense_tiles, tile_keys

PLAN_VERSION = 3
KERNEL_TILE = 32
BLOCK_PANELS = 4  # row panels per block of the dense kernel (kBlockPanels in the .cuh)
DEFAULT_CHUNK = 256  # remainder non-zeros per work item (one warp) of a large matrix: chunk_for()
_PLAN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# c10::ScalarType values of the section dtypes, as the layout records them
_DTYPE_CODES = {torch.int32: 3, torch.int64: 4}
_ALIGN = 16  # section offsets: the kernel reads dstage as int4


def block_adaptive_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the block-adaptive CUDA kernel can run for features of ``dtype`` on ``device``."""
    return (settings.block_adaptive and device.type == "cuda" and dtype in _PLAN_DTYPES
            and _extension.status.loaded and _extension.status.cuda)


@dataclass(eq=False)
class KernelPlan:
    """The block-adaptive kernel's plan of one CSR (see the module doc and the table in
    csrc/cuda/block_adaptive_spmm.cuh for each section's meaning). The sections are views into
    ``buffer``; ``layout`` is what the op reads them by."""

    dblock_ptr: torch.Tensor
    dwork: torch.Tensor
    dstage: torch.Tensor
    dtile_bits: torch.Tensor
    dtile_roff: torch.Tensor
    dense_eid: torch.Tensor
    rem_col: torch.Tensor
    rem_eid: torch.Tensor
    item_ptr: torch.Tensor
    item_row: torch.Tensor
    item_slot: torch.Tensor
    split_row: torch.Tensor
    split_ptr: torch.Tensor
    slot_row: torch.Tensor
    dtile_frag: torch.Tensor
    dpanel_dense: torch.Tensor
    threshold: float
    tile_size: int
    weighted: bool
    chunk: int
    buffer: torch.Tensor
    layout: tuple[int, ...]

    @classmethod
    def pack(cls, sections: dict, *, threshold: float, tile_size: int, weighted: bool, chunk: int) -> "KernelPlan":
        """Packs ``sections`` (name -> contiguous 1-D int32/int64 tensor, in field order) into one buffer."""
        names = [f.name for f in fields(cls)][:len(sections)]
        assert list(sections) == names, "sections must come in the field order of KernelPlan"
        offsets, total = [], 0
        for t in sections.values():
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        first = next(iter(sections.values()))
        buffer = torch.empty(max(total, _ALIGN), dtype=torch.uint8, device=first.device)
        layout = [PLAN_VERSION, int(weighted), int(chunk), len(sections)]
        views = {}
        for (name, t), offset in zip(sections.items(), offsets):
            nbytes = t.numel() * t.element_size()
            view = buffer[offset:offset + nbytes].view(t.dtype)
            view.copy_(t)
            views[name] = view
            layout += [offset, t.numel(), _DTYPE_CODES[t.dtype]]
        return cls(**views, threshold=threshold, tile_size=tile_size, weighted=bool(weighted), chunk=int(chunk),
                   buffer=buffer, layout=tuple(layout))

    @property
    def num_dense_tiles(self) -> int:
        return self.dtile_bits.numel() // 32

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def stats(self) -> dict:
        """Sizes of the plan (for benchmarks and tests)."""
        table = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.long, device=self.buffer.device)
        dense_nnz = int(table[self.dtile_bits.view(torch.uint8).long()].sum())
        return {"dense_tiles": self.num_dense_tiles, "dense_nnz": dense_nnz, "rem_nnz": self.rem_col.numel(),
                "items": self.item_row.numel(), "split_rows": self.split_row.numel(),
                "stages": self.dstage.numel() // 4, "panels_with_tiles": int(self.dpanel_dense.sum())}


def chunk_for(nnz: int) -> int:
    """Remainder non-zeros per work item for a matrix of ``nnz`` non-zeros.

    A warp walks its item's entries one after the other, so the longest item bounds the kernel's
    time; on a large matrix the warps are many and long items keep them busy, on a small one
    (which cannot fill the GPU anyway) the longest item is the whole time. Forward GCN product,
    H100, CUDA-graph replay, F = 16 / 64 / 128 (benchmarks/results/h100/chunk_probe.json):
    cora (10.5K non-zeros, a row of 168) 26.3 / 17.1 / 16.6 us at 256 against 9.0 / 8.2 / 9.7 at 32;
    small (400K) 48.7 / 42.4 / 52.3 at 256, 18.5 / 26.4 / 40.2 at 64; 1-2.7M-non-zero graphs best
    at 64-128; reddit-like and products-like (110-120M) best at 128-256 for F >= 64."""
    if nnz < 256 * 1024:
        return 32
    if nnz < 8 * 1024 * 1024:
        return 64
    return DEFAULT_CHUNK


@torch.no_grad()
def build_kernel_plan(rowptr: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], *, threshold: float,
                      tile_size: int = 32, weighted: bool = False, chunk: int | None = None) -> KernelPlan:
    """The block-adaptive plan of the CSR ``(rowptr, col)`` of ``shape`` (see the module doc) at a
    numeric ``threshold`` (``"auto"`` is resolved before: ``TiledAdjacency.kernel_plan``); ``chunk``
    defaults to :func:`chunk_for` of its size."""
    if isinstance(threshold, str):
        raise TypeError(f"build_kernel_plan takes a numeric threshold, got {threshold!r}; resolve \"auto\" first "
                        "(TiledAdjacency.kernel_plan does)")
    device, idx = col.device, rowptr.dtype
    n_rows, n_cols = int(shape[0]), int(shape[1])
    nnz = col.numel()
    chunk = chunk_for(nnz) if chunk is None else int(chunk)
    T = int(tile_size)
    long = dict(dtype=torch.long, device=device)
    n_panels = -(-n_rows // KERNEL_TILE)
    ncp = max(1, -(-n_cols // KERNEL_TILE))

    rows = rows_of_edges(rowptr, nnz)
    cols = col.long()

    # 1. dense or not, by T x T tile
    if nnz and threshold < 1.0:
        _, inverse, counts = torch.unique(tile_keys(rows, cols, n_cols, T), return_inverse=True, return_counts=True)
        dense_edge = dense_tiles(counts, threshold, T)[inverse]
        del inverse, counts
    else:
        dense_edge = torch.zeros(nnz, dtype=torch.bool, device=device)

    # 2. dense entries -> 32 x 32 bitmaps, ordered by (block, column panel, panel, row, col)
    d_idx = dense_edge.nonzero().squeeze(1)
    dr, dc = rows[d_idx], cols[d_idx]
    full = (((dr >> 7) * ncp + (dc >> 5)) << 12) + (((dr >> 5) & 3) << 10) + ((dr & 31) << 5) + (dc & 31)
    del dr, dc
    full, order = torch.sort(full, stable=True)
    d_idx = d_idx[order]
    del order
    if full.numel() > 1:
        dup = torch.zeros(full.numel(), dtype=torch.bool, device=device)
        torch.eq(full[1:], full[:-1], out=dup[1:])
        if bool(dup.any()):  # a repeated (row, col) entry cannot share a bitmap bit: remainder
            dense_edge[d_idx[dup]] = False
            full, d_idx = full[~dup], d_idx[~dup]
        del dup
    tile_key = full >> 10  # (block * ncp + column panel) * 4 + panel within the block
    utile, tcounts = torch.unique_consecutive(tile_key, return_counts=True)
    del tile_key
    n_tiles = utile.numel()
    tile_of = torch.repeat_interleave(torch.arange(n_tiles, **long), tcounts, output_size=full.numel())
    within = full & 1023
    del full
    r32, c32 = within >> 5, within & 31
    dtile_bits = _words(tile_of * 32 + r32, c32, n_tiles)
    # A fragment of m16n8k8: lane 4 g + t holds rows g, g + 8 of each m16 half and columns t, t + 4
    # of each k8 step; bit 16 m + 4 ks + j <-> row 16 m + g + 8 (j & 1), column 8 ks + t + 4 (j >> 1)
    lane = (r32 & 7) * 4 + (c32 & 3)
    fbit = (r32 >> 4) * 16 + (c32 >> 3) * 4 + ((r32 >> 3) & 1) + ((c32 >> 2) & 1) * 2
    dtile_frag = _words(tile_of * 32 + lane, fbit, n_tiles)
    del lane, fbit, c32
    # stages: tiles of one (block, column panel); mask bit q = panel q of the block has a tile
    ustage, scounts = torch.unique_consecutive(utile >> 2, return_counts=True)
    n_stages = ustage.numel()
    stage_of = torch.repeat_interleave(torch.arange(n_stages, **long), scounts, output_size=n_tiles)
    mask = torch.zeros(n_stages, **long).index_add_(0, stage_of, 1 << (utile & 3))
    first = torch.cumsum(scounts, 0) - scounts
    dstage = torch.stack([ustage % ncp, mask, first, torch.zeros_like(first)], 1).to(torch.int32).reshape(-1)
    n_blocks = -(-n_panels // BLOCK_PANELS)
    block_of_stage = ustage // ncp
    dblock_ptr = torch.searchsorted(block_of_stage, torch.arange(n_blocks + 1, **long)).to(torch.int32)
    tiles_per_block = torch.zeros(n_blocks, **long).index_add_(0, block_of_stage, scounts)
    has_tiles = (tiles_per_block > 0).nonzero().squeeze(1)
    lpt = torch.argsort(tiles_per_block[has_tiles], descending=True, stable=True)
    dwork = has_tiles[lpt].to(torch.int32)
    dpanel_dense = torch.zeros(n_panels, dtype=torch.int32, device=device)
    dpanel_dense[(utile >> 2) // ncp * BLOCK_PANELS + (utile & 3)] = 1
    del ustage, scounts, stage_of, mask, first, block_of_stage, tiles_per_block, has_tiles, lpt, utile
    if weighted:
        word = tile_of * 32 + r32
        row_counts = torch.zeros(n_tiles * 32, **long).index_add_(0, word, torch.ones_like(word))
        dtile_roff = torch.cumsum(row_counts, 0) - row_counts
        dense_eid = d_idx.clone()
        del word, row_counts
    else:
        dtile_roff = torch.empty(0, **long)
        dense_eid = torch.empty(0, **long)
    del tile_of, r32, within, d_idx

    # 4. remainder in CSR order, rows cut into work items of <= chunk entries
    rem_pos = (~dense_edge).nonzero().squeeze(1)
    del dense_edge
    rem_col = col[rem_pos].contiguous()
    rem_eid = rem_pos.to(idx) if weighted else torch.empty(0, dtype=idx, device=device)
    m = torch.bincount(rows[rem_pos], minlength=n_rows) if rem_pos.numel() else torch.zeros(n_rows, **long)
    del rows, rem_pos
    rem_rowptr = torch.cumsum(m, 0) - m
    nch = ((m + chunk - 1) // chunk).clamp_(min=1)
    n_items = int(nch.sum()) if n_rows else 0
    item_row = torch.repeat_interleave(torch.arange(n_rows, **long), nch, output_size=n_items)
    first_item = torch.cumsum(nch, 0) - nch
    item_begin = rem_rowptr[item_row] + (torch.arange(n_items, **long) - first_item[item_row]) * chunk
    item_ptr = torch.cat([item_begin, torch.tensor([rem_col.numel()], **long)]).to(idx)
    is_split_row = nch > 1
    split_row = is_split_row.nonzero().squeeze(1)
    item_split = is_split_row[item_row]
    item_slot = torch.where(item_split, torch.cumsum(item_split.to(torch.int32), 0, dtype=torch.int32) - 1,
                            torch.full_like(item_row, -1, dtype=torch.int32)).to(torch.int32)
    split_ptr = torch.cat([torch.zeros(1, **long), torch.cumsum(nch[split_row], 0)]).to(torch.int32)
    slot_row = item_row[item_split].to(torch.int32)
    sections = dict(dblock_ptr=dblock_ptr, dwork=dwork, dstage=dstage, dtile_bits=dtile_bits, dtile_roff=dtile_roff,
                    dense_eid=dense_eid, rem_col=rem_col, rem_eid=rem_eid, item_ptr=item_ptr, item_row=item_row.to(idx),
                    item_slot=item_slot, split_row=split_row, split_ptr=split_ptr, slot_row=slot_row,
                    dtile_frag=dtile_frag, dpanel_dense=dpanel_dense)
    return KernelPlan.pack(sections, threshold=float(threshold), tile_size=T, weighted=weighted, chunk=chunk)


def _words(word: torch.Tensor, bit: torch.Tensor, n_tiles: int) -> torch.Tensor:
    """int32[n_tiles * 32] with bit ``bit[i]`` of word ``word[i]`` set (each (word, bit) at most once)."""
    bits64 = torch.zeros(n_tiles * 32, dtype=torch.long, device=word.device).index_add_(0, word, 1 << bit)
    return torch.where(bits64 >= 2**31, bits64 - 2**32, bits64).to(torch.int32)

"""Device-specific kernel plans that ride along with the spmm op (its ``plan`` arguments).

The CPU kernel and the plain CUDA CSR kernel need nothing beyond the CSR, so their plan is the
empty list. On CUDA (float32, float16, bfloat16 features) :func:`kernel_plans` returns the plan
of the block-adaptive kernel (csrc/cuda/block_adaptive_spmm.cu), built once per graph, tile
size, threshold and device with vectorized torch ops on the device and cached on the adjacency.

How the plan is made (format: csrc/cuda/block_adaptive_spmm.cuh, ``PLAN_VERSION``):

1. Every non-zero is classified by its ``T x T`` tile (``T = adj.tiles.tile_size``): dense when
   the tile holds more than ``threshold * T * T`` non-zeros (strictly), as in ``TilePlan``.
2. Dense non-zeros are regrouped into the kernel's 32 x 32 tiles (any ``T`` works: a dense
   64 x 64 tile becomes up to four 32 x 32 bitmaps, a dense 16 x 16 tile part of one), each with
   a 32-word bitmap and the same bits in the layout of the tensor-core A fragments (one word per
   lane); for weighted graphs also the CSR position of each entry (values are read per call, so
   new weights need no new plan). A repeated (row, col) entry stays in the remainder.
3. Tiles are grouped by row block (``BLOCK_PANELS`` row panels of 32 rows) and column panel: one
   such group is a *stage*, whose 32 rows of X the kernel loads once for all its tiles. Blocks
   with stages are listed most tiles first (longest job first).
4. The remainder keeps CSR order; each row is cut into work items of at most ``chunk`` entries,
   so a hub row is spread over several warps; rows with several items are summed by a second
   pass in a fixed order (deterministic, no atomics).
"""
from __future__ import annotations

import os

import torch

from . import _extension
from ._csr import rows_of_edges
from .autotune import auto_threshold_key, choose_threshold

PLAN_VERSION = 2
KERNEL_TILE = 32
BLOCK_PANELS = 4  # row panels per block of the dense kernel (kBlockPanels in the .cuh)
DEFAULT_CHUNK = 256  # remainder non-zeros per work item (one warp)
_PLAN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# FGPLUGIN_BLOCK_ADAPTIVE=0 keeps every CUDA call on the simple CSR kernel (read once, at import).
ENABLED = os.environ.get("FGPLUGIN_BLOCK_ADAPTIVE", "1") != "0"


def block_adaptive_available(x: torch.Tensor) -> bool:
    """True when the block-adaptive CUDA kernel can run for features ``x``."""
    if not ENABLED or x.device.type != "cuda" or x.dtype not in _PLAN_DTYPES:
        return False
    return bool(_extension.status.loaded and _extension.status.cuda)


def kernel_plans(adj, x: torch.Tensor, with_transpose: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(plan of A, plan of A^T) for features ``x``; empty lists select the plain CSR kernels.

    ``adj.tiles.threshold == "auto"`` picks the threshold per graph with a short timed probe
    (:func:`fgplugin.autotune.choose_threshold`), once per graph, device and feature dtype.
    """
    if not block_adaptive_available(x):
        return [], []
    weighted = adj.values is not None
    threshold = adj.tiles.threshold
    if isinstance(threshold, str):
        if torch.compiler.is_compiling():
            threshold = adj._shared.get(auto_threshold_key(adj, x.dtype))
            if threshold is None:
                return [], []
        else:
            threshold = choose_threshold(adj, x)
    plan = plan_for(adj, threshold=threshold, weighted=weighted)
    t_plan = plan_for(adj, threshold=threshold, weighted=weighted, transpose=True) if with_transpose else []
    if plan is None or t_plan is None:  # under torch.compile with nothing cached: plain kernels
        return [], []
    return plan, t_plan


def prepare_plans(adj, dtype: torch.dtype = torch.float32, with_transpose: bool = True) -> float | None:
    """Builds ``adj``'s block-adaptive plans for features of ``dtype`` now (running the
    ``threshold="auto"`` probe first if the adjacency asks for it), instead of in the first
    forward and backward pass; returns the threshold in use, or ``None`` where the plain kernels
    run (off CUDA, float64, block-adaptive kernel unavailable).

    Why: a training loop's first step otherwise pays for the probe and the plans (0.5-1.5 s on a
    75-200M-edge graph on an H100), which belongs with preprocessing, where benchmarks count it."""
    probe = torch.empty(0, 1, dtype=dtype, device=adj.device)
    plan, _ = kernel_plans(adj, probe, with_transpose)
    if not plan:
        return None
    threshold = adj.tiles.threshold
    if isinstance(threshold, str):
        threshold = adj._shared[auto_threshold_key(adj, dtype)]
    return float(threshold)


def plan_for(adj, *, tile_size: int | None = None, threshold: float | None = None, weighted: bool | None = None,
             transpose: bool = False, chunk: int = DEFAULT_CHUNK):
    """The cached block-adaptive plan of ``adj`` (or of its transpose), built on first use.

    Returns ``None`` under torch.compile when nothing is cached yet (building needs host syncs).
    """
    tile_size = adj.tiles.tile_size if tile_size is None else int(tile_size)
    threshold = adj.tiles.threshold if threshold is None else threshold
    threshold = float(threshold)
    weighted = (adj.values is not None) if weighted is None else bool(weighted)
    t_rowptr, t_col = _structure(adj, transpose)
    if transpose and t_rowptr is adj.rowptr and t_col is adj.col:
        transpose = False  # structurally symmetric: A^T's CSR is A's, so is its plan
    key = ("kernel_plan", transpose, tile_size, threshold, weighted, chunk, str(adj.device))
    cached = adj._shared.get(key)
    if cached is not None:
        return cached
    if torch.compiler.is_compiling():
        return None
    shape = (adj.shape[1], adj.shape[0]) if transpose else adj.shape
    plan = build_plan(t_rowptr, t_col, shape, tile_size=tile_size, threshold=threshold, weighted=weighted,
                      chunk=chunk)
    adj._shared[key] = plan
    return plan


def _structure(adj, transpose: bool):
    if not transpose:
        return adj.rowptr, adj.col
    t_rowptr, t_col, _ = adj.transpose()
    return t_rowptr, t_col


def plan_stats(plan) -> dict:
    """Sizes of a plan (for benchmarks and reprs)."""
    if not plan:
        return {"dense_tiles": 0, "dense_nnz": 0, "rem_nnz": 0, "items": 0, "split_rows": 0}
    table = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.long, device=plan[4].device)
    dense_nnz = int(table[plan[4].view(torch.uint8).long()].sum())
    return {"dense_tiles": plan[4].numel() // 32, "dense_nnz": dense_nnz, "rem_nnz": plan[7].numel(),
            "items": plan[10].numel(), "split_rows": plan[12].numel(), "stages": plan[3].numel() // 4,
            "panels_with_tiles": int(plan[16].sum())}


@torch.no_grad()
def build_plan(rowptr: torch.Tensor, col: torch.Tensor, shape: tuple[int, int], *, tile_size: int = 32,
               threshold: float = 0.05, weighted: bool = False, chunk: int = DEFAULT_CHUNK) -> list[torch.Tensor]:
    """The block-adaptive plan of the CSR ``(rowptr, col)`` of ``shape`` (see the module doc)."""
    device, idx = col.device, rowptr.dtype
    n_rows, n_cols = int(shape[0]), int(shape[1])
    nnz = col.numel()
    T = int(tile_size)
    long = dict(dtype=torch.long, device=device)
    n_panels = -(-n_rows // KERNEL_TILE)
    ncp = max(1, -(-n_cols // KERNEL_TILE))

    rows = rows_of_edges(rowptr, nnz)
    cols = col.long()

    # 1. dense or not, by T x T tile
    if nnz and threshold < 1.0:
        key_t = (rows // T) * max(1, -(-n_cols // T)) + cols // T
        _, inverse, counts = torch.unique(key_t, return_inverse=True, return_counts=True)
        del key_t
        dense_edge = (counts > threshold * T * T)[inverse]
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
    meta = torch.tensor([PLAN_VERSION, KERNEL_TILE, int(weighted), chunk], **long)
    return [meta, dblock_ptr, dwork, dstage, dtile_bits, dtile_roff, dense_eid, rem_col, rem_eid, item_ptr,
            item_row.to(idx), item_slot, split_row, split_ptr, slot_row, dtile_frag, dpanel_dense]


def _words(word: torch.Tensor, bit: torch.Tensor, n_tiles: int) -> torch.Tensor:
    """int32[n_tiles * 32] with bit ``bit[i]`` of word ``word[i]`` set (each (word, bit) at most once)."""
    bits64 = torch.zeros(n_tiles * 32, dtype=torch.long, device=word.device).index_add_(0, word, 1 << bit)
    return torch.where(bits64 >= 2**31, bits64 - 2**32, bits64).to(torch.int32)

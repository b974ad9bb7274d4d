"""``threshold="auto"``: pick the dense-tile threshold per graph by a short timed probe.

The probe builds the block-adaptive plan for each candidate threshold, times the forward SpMM
(F = 128 by default, random features in the dtype class of the run, with row and column scales so
the kernel does the work a GCN layer does) with CUDA events, and keeps the fastest. Thresholds
that make the same tiles dense share one timing. A graph of more than ``PROBE_NNZ`` non-zeros is
probed on a sample of its rows: every k-th block of 128 rows, whose tiles are tiles of the graph,
so the candidates compare as on the whole graph at a fraction of the plan-building and timing
cost (which, on the whole of a 100M-edge graph, was 0.5-1.6 s on an H100: more than 200 epochs
saved). It runs once per graph, tile size, device and dtype class (fp32 / 16-bit); the choice is
cached on the adjacency (``adj._shared``). Off CUDA the probe does nothing and returns the
default 0.05.
"""
from __future__ import annotations

import torch

DEFAULT_THRESHOLD = 0.05
# 1.0 = no dense tiles: the whole matrix in the row-balanced CSR kernel, which beat every
# threshold on products-like at fp32 (H100: 9.79 ms against 10.1 ms at 0.15).
CANDIDATES = (0.02, 0.03, 0.05, 0.075, 0.10, 0.15, 1.0)
PROBE_NNZ = 8_000_000  # non-zeros the probe times at most (about 0.4 ms per SpMM at F=128, H100)
SAMPLE_BLOCK = 128  # rows per sampled block: whole row panels of every tile size up to 128


def _dtype_class(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "16bit"


@torch.no_grad()
def probe_thresholds(adj, *, F: int = 128, dtype: torch.dtype = torch.float32, candidates=CANDIDATES,
                     reps: int = 7, tile_size: int | None = None, max_nnz: int = PROBE_NNZ) -> dict[float, float]:
    """Median forward SpMM time (ms) of each candidate threshold on ``adj``'s device (on a
    sample of about ``max_nnz`` non-zeros of ``adj``'s rows when it has more)."""
    from .kernel_plan import DEFAULT_CHUNK, build_plan
    from .tiling import tile_counts

    tile_size = adj.tiles.tile_size if tile_size is None else tile_size
    device = adj.device
    values = None if adj.values is None else adj.values.detach().float()
    weighted = values is not None
    rowptr, col, values, sampled = sample_rows(adj.rowptr, adj.col, values, max_nnz)
    n_rows, n_cols = rowptr.numel() - 1, adj.shape[1]
    gen = torch.Generator(device=device).manual_seed(1234)
    x = torch.randn(n_cols, F, device=device, generator=gen).to(dtype)
    rs = torch.rand(n_rows, device=device, generator=gen) + 0.5
    cs = torch.rand(n_cols, device=device, generator=gen) + 0.5
    # Thresholds that make the same tiles dense make the same plan: time one of each (the
    # original order of a graph often has no tile above any candidate, and all of them are the
    # no-dense-tile plan: reddit-like, 7 timings of its 12 ms SpMM for one answer).
    _, counts = tile_counts(rowptr, col, (n_rows, n_cols), tile_size)
    same_plan = {}
    for thr in candidates:
        same_plan.setdefault(int((counts > float(thr) * tile_size * tile_size).sum()), []).append(float(thr))
    times = {}
    for group in same_plan.values():
        thr = max(group)  # the group's plan; 1.0 when it has no dense tile
        key = ("kernel_plan", False, tile_size, float(thr), weighted, DEFAULT_CHUNK, str(device))
        plan = None if sampled else adj._shared.get(key)
        if plan is None:
            plan = build_plan(rowptr, col, (n_rows, n_cols), tile_size=tile_size, threshold=float(thr),
                              weighted=weighted)
        run = lambda: torch.ops.fgplugin.spmm.default(rowptr, col, values, x, rs, cs, None,  # noqa: E731
                                                       None, None, None, plan, [])
        run()
        torch.cuda.synchronize(device)
        # Each sample times a batch of back-to-back runs lasting >= ~1 ms: a single run of a small
        # graph (~0.06 ms) is dominated by launch gaps after the sync, which picked the wrong
        # threshold on `small` (1.55x the best fixed one).
        batch = max(1, min(64, round(1.0 / max(_time_runs(run, 1), 1e-3))))
        samples = [_time_runs(run, batch) for _ in range(reps)]
        for member in group:
            times[member] = sorted(samples)[len(samples) // 2]
        del plan
    return dict(sorted(times.items()))


def sample_rows(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None, max_nnz: int):
    """``(rowptr, col, values, sampled)`` of every k-th block of ``SAMPLE_BLOCK`` rows of a CSR,
    with the smallest k that keeps about ``max_nnz`` non-zeros (the CSR itself, ``sampled`` False,
    when it has no more). Whole blocks keep every row panel whole, so the sample's tiles are tiles
    of the graph with the same columns and non-zero counts."""
    nnz, n_rows = col.numel(), rowptr.numel() - 1
    if nnz <= max_nnz or n_rows <= SAMPLE_BLOCK:
        return rowptr, col, values, False
    stride = -(-nnz // max_nnz)
    device = rowptr.device
    starts = torch.arange(0, -(-n_rows // SAMPLE_BLOCK), stride, device=device) * SAMPLE_BLOCK
    rows = (starts[:, None] + torch.arange(SAMPLE_BLOCK, device=device)).flatten()
    rows = rows[rows < n_rows]
    begin = rowptr[rows].long()
    degree = rowptr[rows + 1].long() - begin
    new_ptr = torch.zeros(rows.numel() + 1, dtype=torch.long, device=device)
    torch.cumsum(degree, 0, out=new_ptr[1:])
    total = int(new_ptr[-1])
    edges = torch.repeat_interleave(begin - new_ptr[:-1], degree, output_size=total) + torch.arange(total, device=device)
    return (new_ptr.to(rowptr.dtype), col[edges], None if values is None else values[edges], True)


def _time_runs(run, n: int) -> float:
    """Mean ms of ``n`` back-to-back calls of ``run``, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def choose_threshold(adj, x: torch.Tensor | None = None, *, candidates=CANDIDATES, F: int = 128) -> float:
    """The probe's fastest threshold for ``adj`` (cached per tile size, device and dtype class)."""
    device = adj.device
    dtype = torch.float32 if x is None else x.dtype
    key = ("auto_threshold", adj.tiles.tile_size, device, _dtype_class(dtype))
    cached = adj._shared.get(key)
    if cached is not None:
        return cached
    if device.type != "cuda":
        return DEFAULT_THRESHOLD
    times = probe_thresholds(adj, F=F, dtype=dtype if dtype != torch.float64 else torch.float32,
                             candidates=candidates)
    best = min(times, key=lambda thr: (times[thr], -thr))  # of thresholds with one plan, the largest
    adj._shared[key] = best
    adj._shared[key + ("probe",)] = times
    return best

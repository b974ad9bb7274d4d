"""``threshold="auto"``: pick the dense-tile threshold per graph by a short timed probe.

The probe builds the block-adaptive plan for each candidate threshold, times the forward SpMM
(F = 128 by default, random features in the dtype class of the run, with row and column scales so
the kernel does the work a GCN layer does) with CUDA events, and keeps the fastest. It costs one
plan build per distinct plan plus a few runs of each (H100: 0.5-1.5 s on the community-ordered
75-200M-edge synthetic graphs, 0.2-0.4 s in their original order, where every candidate is the
same plan; benchmarks/results/h100/probe_sample.json) and runs once per graph, tile size, device
and dtype class (fp32 / 16-bit); the choice is
cached on the adjacency (``adj._shared``) and so are the winning plans. Only the winner's plan is
kept in memory. Off CUDA the probe does nothing and returns the default 0.05.
"""
from __future__ import annotations

import torch

DEFAULT_THRESHOLD = 0.05
# 1.0 = no dense tiles: the whole matrix in the row-balanced CSR kernel, which beat every
# threshold on products-like at fp32 (H100: 9.79 ms against 10.1 ms at 0.15).
CANDIDATES = (0.02, 0.03, 0.05, 0.075, 0.10, 0.15, 1.0)


def auto_threshold_key(adj, dtype: torch.dtype) -> tuple:
    """The key of the probe's cached choice in ``adj._shared``: one per tile size, device and
    dtype class (fp32 / 16-bit)."""
    return ("auto_threshold", adj.tiles.tile_size, adj.device, "fp32" if dtype == torch.float32 else "16bit")


@torch.no_grad()
def probe_thresholds(adj, *, F: int = 128, dtype: torch.dtype = torch.float32, candidates=CANDIDATES,
                     reps: int = 7, tile_size: int | None = None) -> dict[float, float]:
    """Median forward SpMM time (ms) of each candidate threshold on ``adj``'s device."""
    from .kernel_plan import DEFAULT_CHUNK, build_plan
    from .tiling import tile_counts

    tile_size = adj.tiles.tile_size if tile_size is None else tile_size
    device = adj.device
    n_rows, n_cols = adj.shape
    gen = torch.Generator(device=device).manual_seed(1234)
    x = torch.randn(n_cols, F, device=device, generator=gen).to(dtype)
    rs = torch.rand(n_rows, device=device, generator=gen) + 0.5
    cs = torch.rand(n_cols, device=device, generator=gen) + 0.5
    values = None if adj.values is None else adj.values.detach().float()
    weighted = values is not None
    # Thresholds that make the same tiles dense make the same plan: time one of each (the
    # original order of a graph often has no tile above any candidate, and all of them are the
    # no-dense-tile plan: reddit-like, 7 timings of its 12 ms SpMM for one answer).
    _, counts = tile_counts(adj.rowptr, adj.col, adj.shape, tile_size)
    same_plan = {}
    for thr in candidates:
        same_plan.setdefault(int((counts > float(thr) * tile_size * tile_size).sum()), []).append(float(thr))
    times = {}
    for group in same_plan.values():
        thr = max(group)  # the group's plan; 1.0 when it has no dense tile
        key = ("kernel_plan", False, tile_size, float(thr), weighted, DEFAULT_CHUNK, str(device))
        plan = adj._shared.get(key)
        if plan is None:
            plan = build_plan(adj.rowptr, adj.col, adj.shape, tile_size=tile_size, threshold=float(thr),
                              weighted=weighted)
        run = lambda: torch.ops.fgplugin.spmm.default(adj.rowptr, adj.col, values, x, rs, cs, None,  # noqa: E731
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
    key = auto_threshold_key(adj, dtype)
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

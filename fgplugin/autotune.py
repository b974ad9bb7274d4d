"""Timed probes: ``threshold="auto"`` (the dense-tile threshold chosen per graph) and what a run
costs a training step (:func:`cost_ms`, which the sparse-input and cuSPARSE choices use).

The threshold probe builds the block-adaptive plan of each distinct candidate, from the one
without dense tiles towards denser ones until one is slower (:func:`search_groups`), times the
forward SpMM (F = 128 by default, random features in the dtype class of the run, with row and
column scales so the kernel does the work a GCN layer does) with CUDA events, and keeps the
fastest, a plan with dense tiles only if it is ``MIN_DENSE_GAIN`` faster than the one without
(:func:`fastest`). It costs a plan build and a few runs per plan timed (H100: 0.07-0.54 s on the
75-120M-edge synthetic graphs, 4-108 ms on the 0.01-2.7M-edge real ones, which are no longer
probed: ``PROBE_MIN_NNZ``; docs/results.md) and runs once per graph,
tile size, device and dtype class (fp32 / 16-bit). ``TiledAdjacency.kernel_plan`` calls
:func:`choose_threshold` before it builds a plan and keeps the choice and the winning plan on the
adjacency. Off CUDA it returns the fixed default; graphs under ``PROBE_MIN_NNZ`` non-zeros get no
dense tiles, unprobed.
"""
from __future__ import annotations

import contextlib
import contextvars
import statistics
import time

import torch

from .kernel_plan import build_kernel_plan
from .tile_density import DEFAULT_THRESHOLD, dense_tiles, tile_keys
from ._csr import rows_of_edges

# 1.0 = no dense tiles: the whole matrix in the row-balanced CSR kernel, which beat every
# threshold on products-like at fp32 (H100: 9.79 ms against 10.1 ms at 0.15).
CANDIDATES = (0.02, 0.03, 0.05, 0.075, 0.10, 0.15, 1.0)
MIN_DENSE_SHARE = 0.05
COST_SAMPLES = 3  # batches timed by cost_ms and device_and_host_ms
SLEEP_CYCLES_PER_S = 2e9  # above any GPU's clock: the sleep lasts at least as long as asked
WARM_UP_MS = 0.25  # a plan whose first run took less runs ~0.5 ms more before it is timed (probe_thresholds)
STOP_MARGIN = 0.03  # a plan this much slower than the best ends the probe's walk (search_groups)
MIN_DENSE_GAIN = 0.1  # a plan with dense tiles is chosen only this much faster than the one without
# Below this many non-zeros a graph gets no dense tiles without a probe. On the graphs measured
# there (the 16 real graphs and `small`, 9K-2.7M non-zeros, H100) dense tiles lose: in the spmm
# suite's community order every fixed threshold (2, 5, 10%) made the forward SpMM 1.06-2.8x slower
# than none (h100/spmm.json), and the probe chose none in 389 of 391 builds over ten epoch-suite
# runs, both orders; the two exceptions (cora, original order, 0.02; facebook_pagepage, community
# order, 0.075) were timing noise of the kind that cost small graphs' steps 1.2-1.3x
# (docs/results.md sections 18 and 27). Its cost is real: the plans it builds and times took
# 15-108 ms of a community order's preprocessing (7-45 eager steps).
PROBE_MIN_NNZ = 3_000_000


def dtype_class(dtype: torch.dtype) -> str:
    """The probe runs once per class: ``"fp32"`` (float32 and float64, which never use the plan)
    or ``"16bit"``."""
    return "16bit" if dtype in (torch.float16, torch.bfloat16) else "fp32"


@torch.no_grad()
def probe_thresholds(adj, *, F: int = 128, dtype: torch.dtype = torch.float32, candidates=CANDIDATES,
                     reps: int = 5, fastest_plan: dict | None = None) -> dict[float, float]:
    """Median forward SpMM time (ms) of the candidate thresholds on ``adj``'s device (CUDA) that
    the probe's walk (:func:`search_groups`) reached; ``{}`` where every candidate makes the same
    plan (no tile dense enough for any: most graphs in their original order), which is then not
    built or timed here. ``fastest_plan``, if given, receives ``{threshold: plan}`` of the fastest
    plan timed, so that the caller can keep it instead of building it again."""
    tile_size, device = adj.tile_size, adj.device
    n_rows, n_cols = adj.shape
    gen = torch.Generator(device=device).manual_seed(1234)
    x = torch.randn(n_cols, F, device=device, generator=gen).to(dtype)
    rs = torch.rand(n_rows, device=device, generator=gen) + 0.5
    cs = torch.rand(n_cols, device=device, generator=gen) + 0.5
    values = None if adj.values is None else adj.values.detach().float()
    weighted = values is not None
    _, counts = torch.unique(tile_keys(rows_of_edges(adj.rowptr, adj.nnz), adj.col, n_cols, tile_size),
                             return_counts=True)
    timed: list[float] = []  # the medians so far, for fastest_plan

    def time_group(group: list[float]) -> float:
        thr = max(group)  # the group's plan; 1.0 when it has no dense tile
        plan = adj.cached_kernel_plan(thr, weighted) or build_kernel_plan(
            adj.rowptr, adj.col, adj.shape, threshold=thr, tile_size=tile_size, weighted=weighted)
        run = lambda: torch.ops.fgplugin.spmm.default(adj.rowptr, adj.col, values, x, rs, cs, None,  # noqa: E731
                                                       plan.buffer, plan.layout, None, None, None, None, [])
        run()
        torch.cuda.synchronize(device)
        # Each sample times a batch of back-to-back runs lasting >= ~0.25 ms: a single run of a
        # small graph (~0.01-0.06 ms) is dominated by the launch gap after the sync, which picked
        # the wrong threshold on `small` (1.55x the best fixed one). Batches of >= 1 ms and 7
        # samples cost >= 7 ms per distinct plan, on real graphs whose whole preprocessing took
        # 11-84 ms (H100, h100/epoch_real_graphed.json).
        once = time_runs(run, 1)
        if once < WARM_UP_MS:
            # The first runs after a plan is built run slow: a 40 us kernel timed 90-110 us alone,
            # its first samples 50-95 us (citeseer, community order, H100). Sized on that, the
            # batches were short and the first plan's median high, so denser plans that were no
            # faster seemed as fast and the walk went on (up to 7 plans, 46 ms). Two batches sized
            # on that first run go first (about 0.5 ms), timed only to size the real ones.
            once = time_runs(run, 2 * batch_for(once))
        batch = batch_for(once)
        samples = [time_runs(run, batch) for _ in range(reps)]
        ms = sorted(samples)[len(samples) // 2]
        if fastest_plan is not None and ms < min(timed, default=float("inf")):
            fastest_plan.clear()
            fastest_plan[thr] = plan
        timed.append(ms)
        return ms

    groups = plan_groups(counts, adj.nnz, candidates, tile_size)
    if len(groups) == 1:  # every candidate makes the same plan: nothing to choose, nothing timed
        return {}
    with torch.cuda.device(device):  # the events on the adjacency's device, not the current one
        return search_groups(groups, time_group)


def search_groups(groups: list[list[float]], time_group) -> dict[float, float]:
    """Times the plans of ``groups`` (see :func:`plan_groups`) from the one with the fewest dense
    tiles (the highest threshold) towards the densest, and stops at the first plan more than
    ``STOP_MARGIN`` slower than the best so far: the time over the threshold has had one minimum
    on every graph measured (the community-ordered synthetic graphs fall to it and rise after; the
    real graphs, whose SpMMs take tens of microseconds, rise from the first dense plan on, which
    costs a launch of its own). Stopping there spared a small graph the plans it would otherwise
    build and time one by one (snap_ego_twitter: 7 plans, 45 ms, for a kernel of 0.2 ms). Where
    a denser plan wins, the first one is timed once more. Returns ``{candidate: ms}`` for the
    candidates of the plans timed."""
    times: dict[float, float] = {}
    best = float("inf")
    ordered = sorted(groups, key=max, reverse=True)
    for group in ordered:
        ms = time_group(group)
        times.update(dict.fromkeys(group, ms))
        if ms > best * (1 + STOP_MARGIN):
            break
        best = min(best, ms)
    first = ordered[0] if ordered else []
    if first and min(times.values()) < times[first[0]]:
        # A denser plan won: time the first plan again and keep its better time. A probe's first
        # timing can run slow (suspected: a GPU that idled through reordering and loading, at
        # lower clocks); in one run dense plans won on two small community-ordered graphs
        # (amazon_photo, whose dense plan another run had timed 1.7x slower, and cornell5) and
        # their steps ran 1.19-1.29x slower (H100; docs/results.md section 18).
        times.update(dict.fromkeys(first, min(times[first[0]], time_group(first))))
    return dict(sorted(times.items()))


def plan_groups(tile_counts: torch.Tensor, nnz: int, candidates=CANDIDATES, tile_size: int = 32) -> list[list[float]]:
    """The candidates grouped by the plan they make, given the non-zero count of every occupied
    tile: thresholds that make the same tiles dense make the same plan, timed once (the original
    order of a graph often has no tile above any candidate: reddit-like, 7 timings of its 12 ms
    SpMM for one answer). A threshold whose dense tiles hold under ``MIN_DENSE_SHARE`` of the
    non-zeros joins the no-dense-tile group (and loses the tie to 1.0): the dense pass costs a
    launch and a plan of its own to build, and can save at most that share of the work."""
    groups: dict[int, list[float]] = {}
    for thr in candidates:
        dense = dense_tiles(tile_counts, thr, tile_size)
        share = float(tile_counts[dense].sum()) / max(nnz, 1)
        groups.setdefault(int(dense.sum()) if share >= MIN_DENSE_SHARE else 0, []).append(float(thr))
    return list(groups.values())


def batch_for(once_ms: float) -> int:
    """How many back-to-back runs of ``once_ms`` each make a sample of >= ~0.25 ms (at most 64)."""
    return max(1, min(64, round(0.25 / max(once_ms, 1e-3))))


def time_runs(run, n: int) -> float:
    """Mean ms of ``n`` back-to-back calls of ``run``, by CUDA events."""
    return _device_and_host_ms(run, n)[0]


def _device_and_host_ms(run, n: int) -> tuple[float, float]:
    """Mean ms per call of ``n`` back-to-back calls of ``run``: the device's (CUDA events) and the
    host's to make the calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    queued = time.perf_counter()
    for _ in range(n):
        run()
    host_ms = (time.perf_counter() - queued) * 1e3 / n
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n, host_ms


def choose_threshold(adj, dtype: torch.dtype = torch.float32, *, candidates=CANDIDATES, F: int = 128) -> dict:
    """The probe's fastest threshold for ``adj`` and features of ``dtype``, with every candidate's
    time and the chosen plan of A if the probe built it (else ``None``): ``{"threshold": float,
    "times_ms": {threshold: ms}, "plan": KernelPlan | None}``. Off CUDA (nothing to time) the
    default threshold, no times and no plan; under ``PROBE_MIN_NNZ`` non-zeros 1.0 (no dense
    tiles), untimed."""
    if adj.device.type != "cuda":
        return {"threshold": DEFAULT_THRESHOLD, "times_ms": {}, "plan": None}
    if adj.nnz < PROBE_MIN_NNZ:
        return {"threshold": 1.0, "times_ms": {}, "plan": None}
    probe_dtype = dtype if dtype_class(dtype) == "16bit" else torch.float32
    plans: dict = {}
    times = probe_thresholds(adj, F=F, dtype=probe_dtype, candidates=candidates, fastest_plan=plans)
    threshold = fastest(times) if times else max(candidates)
    return {"threshold": threshold, "times_ms": times, "plan": plans.get(threshold)}


def fastest(times: dict[float, float]) -> float:
    """The threshold to use given the probe's ``times``: the fastest (of thresholds with one plan,
    the largest), except that a plan with dense tiles must beat the one without (1.0) by
    ``MIN_DENSE_GAIN``. On the community-ordered synthetic graphs dense tiles saved 23-25% of the
    product (reddit-like, proteins-like); on small graphs a dense plan's win at the probe's width
    was within the timing's spread, and in a training step, whose products have other widths,
    it cost 1.2-1.3x (H100: cora, amazon_photo, cornell5 in community order; docs/results.md
    section 18)."""
    best = min(times, key=lambda thr: (times[thr], -thr))
    if best != 1.0 and 1.0 in times and times[best] > times[1.0] * (1 - MIN_DENSE_GAIN):
        return 1.0
    return best


# ---------------------------------------------------------------------- what a run costs a step
@contextlib.contextmanager
def for_captured_step():
    """Within: :func:`cost_ms` weighs a run by its device time alone, as a step captured as a CUDA
    graph (fgplugin.graphed_step, whose warm-up runs the probes) replays its kernels without host
    work. Outside, an eager step pays the larger of host and device time for each run: on a small
    graph's host-bound eager step a run of more, shorter kernels costs more than its device time."""
    token = _captured.set(True)
    try:
        yield
    finally:
        _captured.reset(token)


# per thread (and task): one thread warming up a captured step leaves another's eager probe alone
_captured = contextvars.ContextVar("fgplugin_captured_step", default=False)


def in_captured_step() -> bool:
    """Whether the caller runs inside :func:`for_captured_step` (choices timed here are kept
    apart from eager ones, which weigh host time too)."""
    return _captured.get()


def cost_ms(run, device: torch.device, warm_up: bool, stop_above: float = float("inf")) -> float:
    """What ``run`` costs a step, in ms (median over a few batches of >= ~0.25 ms): its device
    time in a captured step (:func:`for_captured_step`), else the larger of its device and host
    time. If a first timed run already takes over ``stop_above`` ms, that run's time, without more
    samples. ``warm_up``: run once untimed first (a first run may build what later ones reuse)."""
    if warm_up:
        run()
    once = _batch_cost_ms(run, 1, device)
    if once > stop_above:
        return once
    batch = batch_for(once)
    return statistics.median(_batch_cost_ms(run, batch, device) for _ in range(COST_SAMPLES))


def _batch_cost_ms(run, n: int, device: torch.device) -> float:
    """ms per run of ``n`` runs. On the CPU: wall time. On CUDA: the device's time, with the GPU
    held by a sleep kernel until the host has queued every run (so that launch gaps are not
    counted), or the host's time to queue a run where that is larger and the step is eager."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - start) * 1e3 / n
    with torch.cuda.device(device):  # the events and the sleep on the run's device, not the current one
        host_s = _host_s(run, device)
        device_ms = _held_batch_ms(run, n, host_s)[0]
    return device_ms if _captured.get() else max(device_ms, host_s * 1e3)


def _host_s(run, device: torch.device) -> float:
    """Seconds the host takes to make one run's calls, the device idle when it starts."""
    torch.cuda.synchronize(device)
    queued = time.perf_counter()
    run()
    return time.perf_counter() - queued


def _held_batch_ms(run, n: int, host_s: float) -> tuple[float, float]:
    """``(device, host)`` ms per run of ``n`` runs (:func:`_device_and_host_ms`) on the current
    CUDA device, queued while a sleep kernel holds it (``host_s``: one run's host time)."""
    torch.cuda.synchronize()
    _hold_device(2.0 * n * host_s)
    return _device_and_host_ms(run, n)


def _hold_device(seconds: float) -> None:
    """Keeps the current CUDA stream busy for about ``seconds`` (at most 0.5 s), so that what the
    host queues meanwhile runs back to back, without the gaps of its launches."""
    sleep = getattr(torch.cuda, "_sleep", None)  # private to torch: without it, launch gaps count too
    if sleep is not None:
        sleep(int(min(seconds, 0.5) * SLEEP_CYCLES_PER_S))


def device_and_host_ms(run, device: torch.device) -> tuple[float, float]:
    """``run``'s device time and the host's time to make its calls, in ms per run (CUDA; medians
    over ``COST_SAMPLES`` batches of >= ~0.25 ms, after an untimed run): the device held while
    the host queues each batch, so that the device time has no launch gaps and the host time no
    waits (a torch without ``torch.cuda._sleep`` counts the gaps as device time). An eager step
    pays the host time where the host is its bottleneck and the device time where the device is."""
    with torch.cuda.device(device):  # the events and the sleep on the run's device, not the current one
        run()
        host_s = _host_s(run, device)
        batch = batch_for(max(time_runs(run, 1), host_s * 1e3))
        timed = [_held_batch_ms(run, batch, host_s) for _ in range(COST_SAMPLES)]
    return statistics.median(d for d, _ in timed), statistics.median(h for _, h in timed)

#!/usr/bin/env python
"""Build, check and time fgplugin's block-adaptive CUDA SpMM in one call (issue 3).

    python benchmarks/gpu_kernel_check.py                 # status, correctness, spmm + threshold suites
    python benchmarks/gpu_kernel_check.py --quick         # small + reddit-like, F=128 only
    python benchmarks/gpu_kernel_check.py --sections status,check
    python benchmarks/gpu_kernel_check.py --graphs reddit-like --orders community --F 128
    compute-sanitizer --tool memcheck  python benchmarks/gpu_kernel_check.py --sanitize
    compute-sanitizer --tool racecheck python benchmarks/gpu_kernel_check.py --sanitize

Sections: ``status`` (extension build status, device), ``check`` (every plan path and precision
against the float64 reference on the graph-case registry and fresh random graphs; gradients
against the CPU op; determinism; exits 1 with a table when anything fails unless --keep-going),
``bench`` (forward ``A X`` and backward ``A^T G`` GCN-normalized SpMM on the synthetic community
graphs in three orders, and on graphs of ../shared/data given by name in the first two; impls: fgplugin (threshold "auto"), fgplugin-t2/-t5/-t10 (fixed
thresholds), fgplugin-nodense (threshold 1.0: every non-zero in the row-balanced CSR part),
fgplugin-csr (empty plan: the simple CSR kernel), cusparse-cached (torch.sparse.mm on a CSR of
A + I holding the normalized values, built once); precisions fp32 (TF32 off), tf32, bf16).
Timing: CUDA events, 3 warm-ups, median of --reps (20) runs, min/max kept, peak memory; inputs
rotated when they fit in L2. Floor per BENCHMARKS.md: 8 B per non-zero + 8 B per row pointer +
read X once + write the output once (in the run's element size), over the measured copy bandwidth.

Writes ``$OUT/spmm.json`` and ``$OUT/threshold.json`` (or --out DIR) in the BENCHMARKS.md schema and
prints a compact table last. The extension builds at import into $FGPLUGIN_CACHE_DIR (default
``<repo>/.cache/fgplugin``, git-ignored, so a warm device machine keeps it between calls).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FGPLUGIN_CACHE_DIR", str(ROOT / ".cache" / "fgplugin"))
os.environ.setdefault("MAX_JOBS", "16")

import torch  # noqa: E402

BIG_GRAPHS = ("reddit-like", "proteins-like", "products-like", "archaea-like")
TOL = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 2e-2, "fp16": 1e-2}
DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FIXED = {"fgplugin-t2": 0.02, "fgplugin-t5": 0.05, "fgplugin-t10": 0.10}


def log(*args):
    print(*args, flush=True)


def set_precision(mode):
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"


# =========================================================================== check
class Checker:
    def __init__(self):
        self.failures, self.count = [], 0
        self._dense = {}

    def dense(self, case):
        if self._dense.get("case") is not case:  # one case at a time: keep only its matrix
            self._dense = {"case": case, "a": case.dense().cuda()}
        return self._dense["a"]

    def record(self, what, err, tol, extra=""):
        self.count += 1
        if not (err <= tol):  # NaN fails too
            self.failures.append((what, err, tol, extra))

    def run_forward(self, case, adj, plan, F, mode, seed, scales=True):
        from fgplugin.testing import dense_spmm, rel_error

        g = torch.Generator().manual_seed(seed)
        n_dst, n_src = case.shape
        x = torch.randn(n_src, F, generator=g).to(DTYPE[mode])
        rs = torch.rand(n_dst, generator=g) + 0.5 if scales else None
        cs = torch.rand(n_src, generator=g) + 0.5 if scales else None
        d = torch.rand(min(n_dst, n_src), generator=g) if scales else None
        cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
        values = None if adj.values is None else adj.values.float()
        set_precision(mode)
        try:
            out = torch.ops.fgplugin.spmm.default(adj.rowptr, adj.col, values, x.cuda(), cuda(rs), cuda(cs), cuda(d),
                                                  None, None, None, plan, [])
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001
            return math.inf, f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
        finally:
            set_precision("fp32")
        ref = dense_spmm(self.dense(case), x.double().cuda(), cuda(rs), cuda(cs), cuda(d)).cpu()
        out = out.float().cpu()
        if out.shape != ref.shape:
            return math.inf, f"shape {tuple(out.shape)}"
        if bool((torch.isnan(out) & ~torch.isnan(ref)).any()):
            return math.inf, "NaN in output"
        return rel_error(out, ref), ""


def check_section(args) -> bool:
    import fgplugin
    from fgplugin.kernel_plan import build_plan
    from fgplugin.testing import clustered_case, graph_cases, rel_error

    t0 = time.time()
    ck = Checker()
    variants = [(32, None, 256), (32, 0.0, 8), (32, 1.0, 8), (16, 0.02, 5), (64, 0.05, 256)]
    cases = list(graph_cases()) + [clustered_case(s, weighted=s % 2 == 1) for s in range(3)] + \
        [clustered_case(7, n_src=150, n_dst=97), clustered_case(8, n_src=90, n_dst=170, weighted=True)]
    for case in cases:
        for index_dtype in (torch.int32, torch.int64):
            adj = case.adjacency(index_dtype=index_dtype).to("cuda")
            for tile, thr, chunk in variants:
                thr = adj.tiles.threshold if thr is None else thr
                plan = build_plan(adj.rowptr, adj.col, adj.shape, tile_size=tile, threshold=thr,
                                  weighted=adj.values is not None, chunk=chunk)
                for mode, fs in (("fp32", (1, 7, 33, 128)), ("tf32", (7, 130)), ("bf16", (7, 32, 130)),
                                 ("fp16", (32,))):
                    for F in fs:
                        for scales in ((True, False) if (mode == "fp32" and F == 33) else (True,)):
                            err, why = ck.run_forward(case, adj, plan, F, mode, seed=F + 31 * tile)
                            ck.record(f"{case.name} idx={str(index_dtype)[6:]} T={tile} thr={thr:g} chunk={chunk} "
                                      f"{mode} F={F} scales={scales}", err, TOL[mode], why)
    log(f"[check] registry + small random graphs: {ck.count} runs, {len(ck.failures)} failures "
        f"({time.time() - t0:.1f} s)")

    # fresh larger random graphs: hubs split over many items, every threshold, every precision
    seed0 = int(time.time()) % 100000
    for k in range(4):
        case = clustered_case(seed0 + k, n_src=3000 + 37 * k, n_dst=None if k != 1 else 2100, weighted=k >= 2,
                              comm=64)
        adj = case.adjacency(index_dtype=torch.int64 if k == 3 else None).to("cuda")
        for thr in (0.02, 0.05, 0.10):
            plan = build_plan(adj.rowptr, adj.col, adj.shape, threshold=thr, weighted=adj.values is not None)
            for mode in ("fp32", "tf32", "bf16", "fp16"):
                for F in (32, 64, 128, 256):
                    err, why = ck.run_forward(case, adj, plan, F, mode, seed=seed0 + F)
                    ck.record(f"fresh seed={seed0 + k} {case.name} thr={thr} {mode} F={F}", err, TOL[mode], why)

    # gradients through fgplugin.spmm (plans of A and A^T built by kernel_plans) vs the CPU op
    for case in cases[2:] + [clustered_case(seed0 + 9, n_src=800, n_dst=500, weighted=True)]:
        adj_cpu = case.adjacency()
        for thr in (0.0, 0.05):
            adj_cpu_t = adj_cpu.with_tiles(threshold=thr)
            grads = {}
            for dev in ("cpu", "cuda"):
                a = adj_cpu_t.to(dev)
                g = torch.Generator().manual_seed(5)
                n_dst, n_src = case.shape
                x = torch.randn(n_src, 24, generator=g).to(dev).requires_grad_()
                sc = [t.to(dev).requires_grad_() for t in (torch.rand(n_dst, generator=g) + .5,
                                                           torch.rand(n_src, generator=g) + .5,
                                                           torch.rand(min(n_dst, n_src), generator=g))]
                gout = torch.randn(n_dst, 24, generator=g).to(dev)
                try:
                    out = fgplugin.spmm(a, x, *sc)
                    (out * gout).sum().backward()
                    grads[dev] = [out.detach().cpu(), x.grad.cpu()] + [s.grad.cpu() for s in sc]
                except Exception as error:  # noqa: BLE001
                    grads[dev] = error
            if isinstance(grads["cuda"], Exception) or isinstance(grads["cpu"], Exception):
                ck.record(f"grad {case.name} thr={thr}", math.inf, 1e-5, repr(grads["cuda"])[:80])
                continue
            for name, a, b in zip(("out", "grad_x", "grad_r", "grad_c", "grad_d"), grads["cpu"], grads["cuda"]):
                ck.record(f"grad {case.name} thr={thr} {name}", rel_error(b, a), 1e-5)

    # determinism (no atomics): bitwise equal reruns
    case = clustered_case(seed0 + 3, n_src=4000, weighted=True, comm=64)
    adj = case.adjacency().to("cuda")
    plan = build_plan(adj.rowptr, adj.col, adj.shape, threshold=0.03, weighted=True, chunk=16)
    x = torch.randn(adj.shape[1], 96, device="cuda")
    outs = [torch.ops.fgplugin.spmm.default(adj.rowptr, adj.col, adj.values, x, None, None, None, None, None, None,
                                            plan, []) for _ in range(3)]
    ck.record("determinism (bitwise equal reruns)", 0.0 if all(torch.equal(o, outs[0]) for o in outs) else 1.0, 0.0)

    log(f"[check] total: {ck.count} comparisons, {len(ck.failures)} failures ({time.time() - t0:.1f} s)")
    if ck.failures:
        log("\nFAILURES (what | rel_err | tol | note):")
        for what, err, tol, extra in ck.failures[:60]:
            log(f"  {what:<78} | {err:9.2e} | {tol:.0e} | {extra}")
        if len(ck.failures) > 60:
            log(f"  ... and {len(ck.failures) - 60} more")
    return not ck.failures


def sanitize_section() -> int:
    """A few tiny runs of every kernel path (memcheck/racecheck friendly: small, no timing)."""
    import fgplugin
    from fgplugin.kernel_plan import build_plan
    from fgplugin.reference import sddmm_reference
    from fgplugin.testing import clustered_case, rel_error

    ck = Checker()
    for case in (clustered_case(1, n_src=150, weighted=True), clustered_case(2, n_src=120, n_dst=90),
                 clustered_case(3, n_src=70)):
        for index_dtype in (torch.int32, torch.int64):
            adj = case.adjacency(index_dtype=index_dtype).to("cuda")
            for thr in (0.0, 0.05, 1.0):
                plan = build_plan(adj.rowptr, adj.col, adj.shape, threshold=thr, weighted=adj.values is not None,
                                  chunk=8)
                for mode, F in (("fp32", 33), ("fp32", 64), ("tf32", 64), ("bf16", 40), ("fp16", 130)):
                    err, why = ck.run_forward(case, adj, plan, F, mode, seed=F)
                    ck.record(f"{case.name} {str(index_dtype)[6:]} thr={thr} {mode} F={F}", err, TOL[mode], why)
        a = case.adjacency(threshold=0.02).to("cuda")
        x = torch.randn(a.shape[1], 16, device="cuda", requires_grad=True)
        fgplugin.spmm(a, x, *a.norm("gcn") if a.is_square else ()).sum().backward()
        torch.cuda.synchronize()
        # sddmm (edge-weight gradients): per-edge dot products against float64
        ga, gb = torch.randn(a.shape[0], 24, device="cuda"), torch.randn(a.shape[1], 24, device="cuda")
        ref = sddmm_reference(a.rowptr, a.col, ga.double(), gb.double())
        got = torch.ops.fgplugin.sddmm.default(a.rowptr, a.col, ga, gb)
        ck.record(f"{case.name} sddmm", rel_error(got, ref), TOL["fp32"])
    # the backward pass's two helpers, against torch (bitwise): nonzero rows of a gradient, and a
    # gradient padded with zero columns (vector and element stores, a strided input, no rows)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for n, F in ((0, 8), (37, 47), (300, 8), (129, 130)):
            g = torch.randn(n, F, device="cuda").to(dtype) * (torch.rand(n, 1, device="cuda") < 0.3)
            ck.record(f"nonzero_rows {dtype} {n}x{F}",
                      0.0 if torch.equal(torch.ops.fgplugin.nonzero_rows.default(g), g.ne(0).any(1)) else 1.0, 0.0)
            for src in (g, g.t().contiguous().t()):
                want = torch.cat([src, src.new_zeros(n, 1)], 1)
                got = torch.ops.fgplugin.pad_columns.default(src, F + 1)
                ck.record(f"pad_columns {dtype} {n}x{F} contiguous={src.is_contiguous()}",
                          0.0 if torch.equal(got, want) else 1.0, 0.0)
    torch.cuda.synchronize()
    for what, err, tol, extra in ck.failures:
        log(f"  FAIL {what}: {err:.2e} > {tol:.0e} {extra}")
    log(f"[sanitize] {ck.count} runs, {len(ck.failures)} failures")
    return 1 if ck.failures else 0


# =========================================================================== bench
def measure_copy_bandwidth() -> float:
    n = 1 << 28  # 1 GiB of fp32
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    ms = sorted(times)[len(times) // 2]
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def time_fn(fn, inputs, reps):
    for i in range(3):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(inputs[i % len(inputs)])
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return times[len(times) // 2], times[0], times[-1], torch.cuda.max_memory_allocated()


def sample_reference(rowptr, col, x, r, c, d, rows):
    """float64 rows of diag(r)(A + diag(d))diag(c) x for the sampled rows (unit weights)."""
    starts, ends = rowptr[rows].long(), rowptr[rows + 1].long()
    counts = ends - starts
    seg = torch.repeat_interleave(torch.arange(rows.numel(), device=x.device), counts)
    pos = torch.arange(int(counts.sum()), device=x.device) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts,
                                                                                      counts) + starts[seg]
    j = col[pos].long()
    msg = x[j].double() * c.double()[j, None]
    out = torch.zeros(rows.numel(), x.shape[1], dtype=torch.float64, device=x.device).index_add_(0, seg, msg)
    if d is not None:
        m = rows < d.numel()
        out[m] += (d.double()[rows[m]] * c.double()[rows[m]])[:, None] * x[rows[m]].double()
    return out * r.double()[rows, None]


class GraphRun:
    """One graph in one order: adjacency, GCN scales, transposes, baselines' CSRs."""

    def __init__(self, name, order, edge_index, n):
        from fgplugin.tiling import TiledAdjacency

        self.name, self.order, self.n = name, order, n
        self.adj = TiledAdjacency.from_edge_index(edge_index, n, keep_edge_order=False)
        self.r, self.c, self.d = self.adj.norm("gcn")
        self.t_rowptr, self.t_col, _ = self.adj.transpose()
        self.symmetric = self.t_rowptr is self.adj.rowptr and self.t_col is self.adj.col
        self.nnz = self.adj.nnz
        self._cusparse = None

    def cusparse(self):
        """(A_norm, A_norm^T) as torch sparse CSR with int32 indices, normalized values, diag added."""
        if self._cusparse is None:
            fwd = self._csr(self.adj.rowptr, self.adj.col, self.r, self.c)
            bwd = fwd if (self.symmetric and self.r is self.c) else self._csr(self.t_rowptr, self.t_col, self.c, self.r)
            self._cusparse = (fwd, bwd)
        return self._cusparse

    def _csr(self, rowptr, col, r, c):
        from fgplugin._csr import rows_of_edges

        n = self.n
        rows = rows_of_edges(rowptr, col.numel())
        cols = col.long()
        loops = (self.d != 0).nonzero().squeeze(1)
        rows = torch.cat([rows, loops])
        cols = torch.cat([cols, loops])
        vals = torch.cat([r[rows[:col.numel()]] * c[cols[:col.numel()]], self.d[loops] * r[loops] * c[loops]])
        order = torch.argsort(rows * n + cols)
        rows, cols, vals = rows[order], cols[order], vals[order].float()
        crow = torch.searchsorted(rows, torch.arange(n + 1, device=rows.device)).to(torch.int32)
        return torch.sparse_csr_tensor(crow, cols.to(torch.int32), vals, (n, n))


def community_run(name: str) -> GraphRun:
    """The synthetic preset ``name``, generated on the GPU, in fgplugin's ``community`` order (the
    setup of the A/B scripts: profile_spmm.py, kernel_times.py, time_dense.py)."""
    from fgplugin.datasets import community_graph
    from fgplugin.reorder import inverse_permutation, reorder

    g = community_graph(name, device="cuda", num_features=0)
    n, ei = g.num_nodes, g.edge_index
    return GraphRun(name, "community", inverse_permutation(reorder(ei, "community", num_nodes=n))[ei], n)


def bench_graph(run: GraphRun, args, rows_out, threshold_rows, copy_tbps, fs, impl_filter):
    from fgplugin.autotune import auto_threshold_key, choose_threshold
    from fgplugin.kernel_plan import plan_for, plan_stats

    op = torch.ops.fgplugin.spmm.default
    adj = run.adj
    meta = {"graph": run.name, "order": run.order, "nodes": run.n, "nnz": run.nnz}
    plans = {}

    def plan_of(thr):
        key = float(thr)
        if key not in plans:
            t0 = time.time()
            p = plan_for(adj, threshold=key, weighted=False)
            tp = plan_for(adj, threshold=key, weighted=False, transpose=True)
            torch.cuda.synchronize()
            plans[key] = (p, tp, time.time() - t0)
        return plans[key]

    impls = ["fgplugin"]
    if run.order != "ideal":
        impls += ["fgplugin-nodense", "fgplugin-csr"]
        if run.order != "original":
            impls += list(FIXED)
    impls.append("cusparse-cached")
    impls = [i for i in impls if impl_filter is None or i in impl_filter]
    for thr in FIXED.values():  # built first, so the auto probe reuses them
        if any(i in impls for i in FIXED) or "fgplugin" in impls:
            plan_of(thr)
    # threshold="auto" probes once per dtype class (fp32 / 16-bit), as fgplugin.spmm does for x's dtype
    auto_thr, probe_s = {}, {}
    if "fgplugin" in impls:
        for cls, dtype in (("fp32", torch.float32), ("16bit", torch.bfloat16)):
            t0 = time.time()
            set_precision("fp32")
            auto_thr[cls] = choose_threshold(adj, torch.empty(0, 128, device="cuda", dtype=dtype))
            probe_s[cls] = time.time() - t0
            probe = adj._shared.get(auto_threshold_key(adj, dtype) + ("probe",), {})
            log(f"  auto threshold ({cls}) {auto_thr[cls]} (probe {probe_s[cls]:.2f} s; ms per candidate: "
                f"{ {k: round(v, 3) for k, v in probe.items()} })")

    gen = torch.Generator(device="cuda").manual_seed(0)
    sample_rows = torch.randperm(run.n, device="cuda", generator=gen)[:512]
    for F in fs:
        for prec in ("fp32", "tf32", "bf16"):
            if F != 128 and prec == "tf32":
                continue
            if run.order == "ideal" and prec != "fp32":
                continue
            dtype = DTYPE[prec]
            esize = torch.tensor([], dtype=dtype).element_size()
            x_bytes = run.n * F * esize
            n_inputs = 1 if x_bytes > 64 << 20 else 4
            xs = [torch.randn(run.n, F, device="cuda", generator=gen).to(dtype) for _ in range(n_inputs)]
            floor_ms = (8 * run.nnz + 8 * (run.n + 1) + 2 * x_bytes) / (copy_tbps * 1e12) * 1e3
            refs = {}
            for which in ("spmm_fwd", "spmm_bwd"):
                rp, cl = (adj.rowptr, adj.col) if which == "spmm_fwd" else (run.t_rowptr, run.t_col)
                r, c = (run.r, run.c) if which == "spmm_fwd" else (run.c, run.r)
                refs[which] = sample_reference(rp, cl, xs[0], r, c, run.d, sample_rows)
            for impl in impls:
                if prec != "fp32" and impl not in ("fgplugin", "fgplugin-nodense", "cusparse-cached"):
                    continue
                if F != 128 and impl not in ("fgplugin", "fgplugin-nodense", "cusparse-cached"):
                    continue
                cls = "fp32" if dtype == torch.float32 else "16bit"
                thr = {"fgplugin": auto_thr.get(cls), "fgplugin-nodense": 1.0, **FIXED}.get(impl)
                for which in ("spmm_fwd", "spmm_bwd"):
                    row = {**meta, "impl": impl, "op": which, "F": F, "precision": prec, "ms_median": None,
                           "ms_min": None, "ms_max": None, "floor_ms": round(floor_ms, 5), "peak_mem_bytes": None,
                           "rel_err": None}
                    try:
                        set_precision(prec)
                        if impl == "cusparse-cached":
                            fwd_m, bwd_m = run.cusparse()
                            m = fwd_m if which == "spmm_fwd" else bwd_m
                            if dtype != torch.float32:
                                key = ("_lowp", which, dtype)
                                if key not in run.__dict__:
                                    run.__dict__[key] = m.to(dtype)
                                m = run.__dict__[key]
                            fn = lambda x, m=m: torch.sparse.mm(m, x)  # noqa: E731
                        else:
                            if impl == "fgplugin-csr":
                                p, tp, build_s = [], [], 0.0
                            else:
                                p, tp, build_s = plan_of(thr)
                                row["threshold"] = thr
                                row["plan_build_s"] = round(build_s, 3)
                                st = plan_stats(p)
                                row["dense_share"] = round(st["dense_nnz"] / max(run.nnz, 1), 4)
                                row["dense_tiles"] = st["dense_tiles"]
                            if which == "spmm_fwd":
                                fn = lambda x, p=p: op(adj.rowptr, adj.col, None, x, run.r, run.c, run.d,  # noqa: E731
                                                       None, None, None, p, [])
                            else:
                                fn = lambda x, p=tp: op(run.t_rowptr, run.t_col, None, x, run.c, run.r,  # noqa: E731
                                                        run.d, None, None, None, p, [])
                        out = fn(xs[0])
                        ref = refs[which]
                        got = out[sample_rows].double()
                        row["rel_err"] = float((got - ref).norm() / ref.norm().clamp_min(1e-300))
                        del out
                        med, lo, hi, peak = time_fn(fn, xs, args.reps)
                        row.update(ms_median=round(med, 4), ms_min=round(lo, 4), ms_max=round(hi, 4),
                                   peak_mem_bytes=int(peak), x_floor=round(med / floor_ms, 2))
                    except torch.cuda.OutOfMemoryError:
                        row["error"] = "OOM"
                        torch.cuda.empty_cache()
                    except Exception as error:  # noqa: BLE001
                        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                    finally:
                        set_precision("fp32")
                    if impl == "fgplugin" and cls in probe_s:
                        row["auto_probe_s"] = round(probe_s[cls], 3)
                    rows_out.append(row)
                    if F == 128 and prec == "fp32" and impl in ("fgplugin", *FIXED):
                        threshold_rows.append({**row, "threshold": "auto" if impl == "fgplugin" else thr,
                                               "auto_choice": auto_thr.get("fp32")})
            del xs
    plans.clear()
    for key in [k for k in adj._shared if isinstance(k, tuple) and k and k[0] == "kernel_plan"]:
        del adj._shared[key]
    torch.cuda.empty_cache()


def load_bench_graph(name):
    """A synthetic preset (generated on the GPU) or a graph of ../shared/data (by name or path): an
    object with ``num_nodes``, ``edge_index`` on the GPU and ``community`` (None for real graphs,
    which then skip the "ideal" order)."""
    from types import SimpleNamespace

    from fgplugin.datasets import SUITE, community_graph, load_npz

    if name in SUITE:
        return community_graph(name, device="cuda", num_features=0)
    g = load_npz(name, features=None)
    return SimpleNamespace(num_nodes=g.num_nodes, edge_index=g.edge_index.cuda(), community=None)


def bench_section(args):
    from fgplugin.reorder import inverse_permutation, reorder

    copy_tbps = measure_copy_bandwidth()
    log(f"[bench] copy bandwidth {copy_tbps:.2f} TB/s (read + write)")
    rows, threshold_rows, prep = [], [], []
    for name in args.graphs:
        t0 = time.time()
        try:
            g = load_bench_graph(name)
        except Exception as error:  # noqa: BLE001
            log(f"[bench] {name}: generation failed: {error}")
            rows.append({"graph": name, "order": "original", "impl": "-", "op": "-", "ms_median": None,
                         "error": f"generation: {error}"})
            continue
        torch.cuda.synchronize()
        gen_s = time.time() - t0
        n, ei = g.num_nodes, g.edge_index
        log(f"[bench] {name}: {n:,} nodes, {ei.shape[1]:,} edges, generated in {gen_s:.1f} s")
        for order in args.orders:
            if order == "ideal" and g.community is None:
                continue  # a real graph: no generator communities to sort by
            t0 = time.time()
            try:
                if order == "original":
                    ei_o = ei
                else:
                    if order == "ideal":
                        perm = torch.argsort(g.community, stable=True)
                    else:
                        perm = reorder(ei, order, num_nodes=n)
                    torch.cuda.synchronize()
                    ei_o = inverse_permutation(perm)[ei]
                reorder_s = time.time() - t0
                t0 = time.time()
                run = GraphRun(name, order, ei_o, n)
                del ei_o
                torch.cuda.synchronize()
                prep.append({"graph": name, "order": order, "reorder_s": round(reorder_s, 3),
                             "adjacency_s": round(time.time() - t0, 3)})
                log(f"[bench]   order {order}: reorder {reorder_s:.2f} s, adjacency {time.time() - t0:.2f} s, "
                    f"dense share @5% {run.adj.dense_share:.1%}")
                fs = [128] + ([f for f in args.f_sweep if f != 128]
                              if (name == args.sweep_graph and order == args.sweep_order) else [])
                t0 = time.time()
                bench_graph(run, args, rows, threshold_rows, copy_tbps, fs, args.impls)
                log(f"[bench]   timed in {time.time() - t0:.1f} s")
                del run
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"graph": name, "order": order, "impl": "-", "op": "-", "ms_median": None,
                             "error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"})
            torch.cuda.empty_cache()
        del g, ei
        torch.cuda.empty_cache()
    return copy_tbps, rows, threshold_rows, prep


def write_results(args, copy_tbps, rows, threshold_rows, prep):
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "h100")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        commit = None
    head = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "commit": commit, "command": " ".join([Path(sys.executable).name] + sys.argv),
            "copy_TBps": round(copy_tbps, 3)}
    (out_dir / "spmm.json").write_text(json.dumps({"suite": "spmm", **head, "preprocess": prep, "rows": rows},
                                                  indent=1))
    summary = {}
    for r in threshold_rows:
        if r.get("ms_median") is None:
            continue
        key = (r["graph"], r["order"], r["op"])
        summary.setdefault(key, {})[str(r["threshold"])] = r["ms_median"]
    notes = []
    for (graph, order, op_name), t in summary.items():
        fixed = [v for k, v in t.items() if k != "auto"]
        if fixed and "auto" in t:
            notes.append({"graph": graph, "order": order, "op": op_name, "auto_over_best_fixed": round(t["auto"] / min(fixed), 3)})
    (out_dir / "threshold.json").write_text(json.dumps({"suite": "threshold", **head, "rows": threshold_rows,
                                                        "auto_vs_best": notes}, indent=1))
    log(f"[bench] wrote {out_dir / 'spmm.json'} and {out_dir / 'threshold.json'}")
    return notes


def print_tables(rows, notes):
    def get(graph, order, impl, op_name, F=128, prec="fp32"):
        for r in rows:
            if (r.get("graph"), r.get("order"), r.get("impl"), r.get("op"), r.get("F"), r.get("precision")) == \
                    (graph, order, impl, op_name, F, prec):
                return r.get("ms_median")
        return None

    log("\n" + "=" * 108)
    log(f"{'graph':<14}{'order':<10}{'impl':<18}{'op':<9}{'F':>4} {'prec':<5}{'ms':>9}{'x floor':>8}"
        f"{'rel_err':>10}{'thr':>7}{'dense':>7}  note")
    for r in rows:
        if r.get("F") not in (128, None) and r.get("impl") not in ("fgplugin", "cusparse-cached"):
            continue
        ms, err, thr, share = r.get("ms_median"), r.get("rel_err"), r.get("threshold"), r.get("dense_share")
        xf = r.get("x_floor")
        log(f"{r.get('graph', ''):<14}{r.get('order', ''):<10}{r.get('impl', ''):<18}{r.get('op', ''):<9}"
            f"{r.get('F', '') or '':>4} {r.get('precision', '') or '':<5}"
            f"{'' if ms is None else format(ms, '.3f'):>9}{'' if xf is None else format(xf, '.2f'):>8}"
            f"{'' if err is None else format(err, '.1e'):>10}{'' if thr is None else thr:>7}"
            f"{'' if share is None else format(share, '.0%'):>7}  {r.get('error', '')}")
    log("-" * 108)
    log("targets (F=128, fp32-accurate; fgplugin = threshold auto on the community order):")
    for graph in sorted({r.get("graph") for r in rows if r.get("graph")}):
        for op_name in ("spmm_fwd", "spmm_bwd"):
            best = None
            for order in ("community",):
                v = get(graph, order, "fgplugin", op_name)
                if v is not None and (best is None or v < best[0]):
                    best = (v, order)
            if best is None:
                continue
            cs_orig = get(graph, "original", "cusparse-cached", op_name)
            cs_same = get(graph, best[1], "cusparse-cached", op_name)
            bf = get(graph, best[1], "fgplugin", op_name, prec="bf16")
            floor = next((r["floor_ms"] for r in rows if r.get("graph") == graph and r.get("F") == 128
                          and r.get("precision") == "fp32" and r.get("floor_ms")), None)
            parts = [f"{graph:<14}{op_name:<9} fgplugin[{best[1]}] {best[0]:.3f} ms"]
            if cs_orig:
                parts.append(f"vs cuSPARSE original {cs_orig / best[0]:.2f}x (>=4)")
            if cs_same:
                parts.append(f"vs cuSPARSE same order {cs_same / best[0]:.2f}x (>=2)")
            if floor:
                parts.append(f"{best[0] / floor:.2f}x floor (proteins <=5)")
            if bf:
                parts.append(f"bf16 {best[0] / bf:.2f}x faster (>=1.7)")
            log("  " + "; ".join(parts))
    for n_ in notes:
        log(f"  auto/best-fixed {n_['graph']:<14}{n_['order']:<10}{n_['op']:<9} {n_['auto_over_best_fixed']:.3f} (<=1.05)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="status,check,bench", help="comma list of status,check,bench")
    ap.add_argument("--graphs", default="small," + ",".join(BIG_GRAPHS))
    ap.add_argument("--orders", default="original,community,ideal")
    ap.add_argument("--impls", default=None, help="comma list to restrict impls (default: all)")
    ap.add_argument("--F", dest="f_sweep", default="32,64,128,256", help="F values of the sweep graph")
    ap.add_argument("--sweep-graph", default="reddit-like")
    ap.add_argument("--sweep-order", default="community")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="result folder (default $OUT, else benchmarks/results/h100)")
    ap.add_argument("--quick", action="store_true", help="small + reddit-like, F=128 only")
    ap.add_argument("--keep-going", action="store_true", help="run the benchmark even if checks fail")
    ap.add_argument("--sanitize", action="store_true", help="tiny runs of every kernel path, for compute-sanitizer")
    args = ap.parse_args()
    if args.quick:
        args.graphs, args.f_sweep = "small,reddit-like", "128"
    args.graphs = [g for g in args.graphs.split(",") if g]
    args.orders = [o for o in args.orders.split(",") if o]
    args.f_sweep = [int(f) for f in str(args.f_sweep).split(",") if f]
    args.impls = None if args.impls is None else args.impls.split(",")
    sections = set(args.sections.split(","))

    t_import = time.time()
    import fgplugin

    status = fgplugin.extension_status()
    log(f"[status] fgplugin extension: loaded={status.loaded} cuda={status.cuda} reason={status.reason!r} "
        f"build_dir={status.build_dir} (import {time.time() - t_import:.1f} s)")
    if not torch.cuda.is_available():
        log("[status] no CUDA device: nothing to check")
        return 2
    log(f"[status] device {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}")
    if not status.cuda:
        log("[status] the CUDA kernels did not build: rerun with FGPLUGIN_VERBOSE_BUILD=1 to see why")
        return 2
    if args.sanitize:
        return sanitize_section()
    ok = True
    if "check" in sections:
        ok = check_section(args)
        if not ok and not args.keep_going:
            log("[check] FAILED: not benchmarking (pass --keep-going to time anyway)")
            return 1
    if "bench" in sections:
        copy_tbps, rows, threshold_rows, prep = bench_section(args)
        notes = write_results(args, copy_tbps, rows, threshold_rows, prep)
        print_tables(rows, notes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

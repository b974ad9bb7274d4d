"""The ``spmm`` and ``threshold`` suites: fgplugin's CUDA SpMM kernels, one product at a time.

    fgplugin bench spmm                               # every default graph, order, impl, F, precision
    fgplugin bench spmm --quick                       # small + reddit-like, F=128 only
    fgplugin bench spmm --graphs reddit-like --orders community --F 128
    fgplugin bench threshold --graphs reddit-like     # fixed dense-tile thresholds against "auto"

Needs a CUDA GPU and fgplugin's CUDA kernels: without them the command exits with status 2.

What is timed: the forward ``A X`` (``op="spmm_fwd"``) and backward ``A^T G`` (``op="spmm_bwd"``)
GCN-normalized SpMM (``diag(r) (A + diag(d)) diag(c) X`` with the scales of ``adj.norm("gcn")``),
as fgplugin's op runs it, on

- graphs: the synthetic presets of :data:`fgplugin.datasets.SUITE` (generated on the GPU) and
  real ``.npz`` graphs given by name (in ``$FGPLUGIN_DATA_DIR``) or path;
- orders: ``original``, a :mod:`fgplugin.reorder` method (``community``, ...,
  ``<method>-blockwise<parts>``) and ``ideal`` (the generator's communities; synthetic graphs
  only);
- impls: ``fgplugin`` (threshold ``"auto"``: the probe's choice per dtype class; no dense tiles
  under 3M non-zeros),
  ``fgplugin-t2`` / ``-t5`` / ``-t10`` (fixed 2 / 5 / 10% thresholds; reordered graphs only),
  ``fgplugin-nodense`` (threshold 1.0: every non-zero in the row-balanced CSR part),
  ``fgplugin-csr`` (empty plan: the simple CSR kernel), and the baselines ``cusparse-cached``
  (``torch.sparse.mm`` on a CSR of ``A + I`` holding the normalized values, built once) and
  ``dgl-path`` (DGL's GPU path as the epoch suite rebuilds it, ``baselines.dgl_path_product``:
  ``D^-1/2`` as elementwise ops before and after an uncached cuSPARSE SpMM of ``A + I`` with
  all-ones values; backward on the transposed CSR, built once; DGL normalizes the source side by
  out-degrees, so on a directed graph it is another product, checked against its own float64
  reference, ``GraphRun.dgl_path_reference``);
- ``F`` = 128 on every graph, plus the ``--F`` sweep on ``--sweep-graph`` in ``--sweep-order``;
  precisions ``fp32`` (TF32 off), ``tf32`` (F = 128 only) and ``bf16``; below F = 128 or in
  16-bit only ``fgplugin``, ``fgplugin-nodense`` and the baselines run (``EVERY_WIDTH``), and the
  ``ideal`` order runs fp32 only.

Correct first: each row's product is called once on memory filled with NaN
(:func:`poison_free_blocks`) and checked (:func:`checked`): ``rel_err``, the Frobenius error on 512
sampled rows against a float64 reference, must be within the limit of the row's precision
(``REL_ERR_LIMIT``: fp32 1e-5, tf32 5e-3, bf16 2e-2), and the output must hold no NaN. A row that
fails keeps ``rel_err`` and gets an ``error`` naming what failed and the limit; it is not timed, and
the command exits with status 1.

Timing: CUDA events, 3 warm-up calls, median of ``--reps`` (20) calls with min and max kept,
``peak_mem_bytes`` (``max_memory_allocated`` over the timed calls); inputs rotated over 4 buffers
when ``X`` is at most 64 MiB (so L2 does not hold the next call's input). ``floor_ms``: 8 B per
non-zero + 8 B per row pointer + reading ``X`` once + writing the output once (in the run's
element size), over the measured copy bandwidth (``copy_TBps``); ``x_floor`` = ``ms_median /
floor_ms``. See docs/benchmarks.md for the method.

The ``threshold`` suite is the ``fgplugin`` and fixed-threshold rows at F = 128, fp32 (by default
it runs only those); its result adds ``auto_vs_best``: per graph, order and op, auto's time over
the best fixed threshold's. ``fgplugin bench spmm`` writes both result files.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

import torch

BIG_GRAPHS = ("reddit-like", "proteins-like", "products-like", "archaea-like")
DEFAULT_GRAPHS = ("small", *BIG_GRAPHS)
QUICK_GRAPHS = ("small", "reddit-like")
DEFAULT_ORDERS = ("original", "community", "ideal")
DEFAULT_F = (32, 64, 128, 256)
SWEEP_GRAPH = "reddit-like"
SWEEP_ORDER = "community"
REPS = 20
PRECISIONS = ("fp32", "tf32", "bf16")
DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FIXED = {"fgplugin-t2": 0.02, "fgplugin-t5": 0.05, "fgplugin-t10": 0.10}
BASELINES = ("cusparse-cached", "dgl-path")
IMPLS = ("fgplugin", "fgplugin-nodense", "fgplugin-csr", *FIXED, *BASELINES)
THRESHOLD_IMPLS = ("fgplugin", *FIXED)
EVERY_WIDTH = ("fgplugin", "fgplugin-nodense", *BASELINES)  # the others run at F = 128 in fp32 only
# docs/benchmarks.md's limits of the relative Frobenius error against the float64 reference
REL_ERR_LIMIT = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 2e-2, "fp16": 1e-2}
# A product's output and the temporaries of its size it allocates before it (dgl-path: two) take
# blocks of that size from the caching allocator: poisoning this many covers them.
POISONED_BLOCKS = 4


@dataclass
class Options:
    """What to run (the command-line options of the two suites)."""
    graphs: list = field(default_factory=lambda: list(DEFAULT_GRAPHS))
    orders: list = field(default_factory=lambda: list(DEFAULT_ORDERS))
    impls: list | None = None  # None: all of IMPLS
    f_sweep: list = field(default_factory=lambda: list(DEFAULT_F))
    sweep_graph: str = SWEEP_GRAPH
    sweep_order: str = SWEEP_ORDER
    reps: int = REPS
    precisions: list = field(default_factory=lambda: list(PRECISIONS))


def _print(*args):
    print(*args, flush=True)


def unavailable_reason() -> str | None:
    """Why the suites cannot run here (no CUDA device, no CUDA kernels), or ``None``."""
    if not torch.cuda.is_available():
        return ("needs a CUDA GPU, and this torch sees none (torch.cuda.is_available() is False); "
                "it times fgplugin's CUDA kernels")
    import fgplugin

    status = fgplugin.extension_status()
    if not status.cuda:
        return (f"fgplugin's CUDA kernels are not loaded ({status.reason or 'built without CUDA'}); "
                "rerun with FGPLUGIN_VERBOSE_BUILD=1 to see the build")
    return None


def set_precision(mode):
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"


def spmm_op(rowptr, col, x, row_scale, col_scale, diag, plan):
    """One forward call of the ``fgplugin::spmm`` op (unit weights, no transpose given): what
    every fgplugin row times. ``plan``: a :class:`fgplugin.kernel_plan.KernelPlan` (the
    block-adaptive kernel) or ``None`` (the plain CSR kernel)."""
    buffer, layout = (None, []) if plan is None else (plan.buffer, list(plan.layout))
    return torch.ops.fgplugin.spmm.default(rowptr, col, None, x, row_scale, col_scale, diag, buffer, layout,
                                           None, None, None, None, [])


def plans_at(adj, threshold: float):
    """The block-adaptive plans of ``adj`` and of its transpose at a fixed ``threshold`` (unit
    weights), built once and kept in the adjacency's caches, where the ``"auto"`` probe finds
    them."""
    fixed = adj.with_tiles(threshold=float(threshold))  # shares adj's caches
    plan, t_plan = fixed.kernel_plan(torch.float32), fixed.kernel_plan(torch.float32, transpose=True)
    if plan is None or t_plan is None:
        raise RuntimeError("the block-adaptive CUDA kernel is switched off (FGPLUGIN_BLOCK_ADAPTIVE=0?) or not built")
    return plan, t_plan


def measure_copy_bandwidth() -> float:
    """Device copy bandwidth in TB/s (read + write), median of 10 copies of 1 GiB."""
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
    """``(median, min, max)`` ms of ``fn(inputs[i % len(inputs)])`` over ``reps`` calls after 3
    warm-up calls (CUDA events), and the peak memory allocated meanwhile."""
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


def poison_free_blocks(like: torch.Tensor, blocks: int = POISONED_BLOCKS) -> None:
    """Fills with NaN the memory that CUDA's caching allocator hands out next for ``blocks``
    tensors of ``like``'s size: it allocates them NaN-filled and frees them, and the allocator
    gives the same blocks to the next requests of that size (the smallest free block that fits,
    lowest address first). The products allocate their outputs uninitialized (fgplugin's op,
    ``torch.sparse.mm``), so an element a product never writes then reads NaN instead of whatever
    the memory held. (Useless off CUDA: the host allocator returns large blocks to the system.)"""
    poison = [torch.full_like(like, float("nan")) for _ in range(blocks)]
    del poison


def check_product(out, ref, rows, precision: str) -> tuple[float, str | None]:
    """``(rel_err, error)`` of the product ``out``: ``rel_err`` of its ``rows`` against their
    float64 reference ``ref``; ``error`` names a NaN anywhere in ``out`` or a ``rel_err`` over
    ``REL_ERR_LIMIT[precision]``, and is ``None`` when the product passes."""
    rel_err = float((out[rows].double() - ref).norm() / ref.norm().clamp_min(1e-300))
    nans = int(torch.isnan(out).sum())
    if nans:
        return rel_err, f"NaN in {nans} of {out.numel()} output elements (unwritten elements read NaN)"
    limit = REL_ERR_LIMIT[precision]
    if not rel_err <= limit:
        return rel_err, f"rel_err {rel_err:.2e} over the {precision} limit {limit:.0e}"
    return rel_err, None


def checked(row: dict, fn, x, ref, rows) -> bool:
    """Whether the product ``fn(x)``, called once on poisoned memory (:func:`poison_free_blocks`),
    passes :func:`check_product` at ``row["precision"]``; records its ``rel_err`` in ``row`` and,
    where it fails, the ``error``."""
    poison_free_blocks(x)
    out = fn(x)
    row["rel_err"], error = check_product(out, ref, rows, row["precision"])
    if error is not None:
        row["error"] = error
    return error is None


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
    """One graph in one order: adjacency, GCN scales, transposes, baselines' graphs."""

    def __init__(self, name, order, edge_index, n):
        from fgplugin.tiling import TiledAdjacency

        self.name, self.order, self.n = name, order, n
        self.adj = TiledAdjacency.from_edge_index(edge_index, n, keep_edge_order=False)
        self.r, self.c, self.d = self.adj.norm("gcn", dtype=torch.float32)  # the kernels' scale dtype
        self.t_rowptr, self.t_col, _ = self.adj.transpose()
        self.symmetric = self.t_rowptr is self.adj.rowptr and self.t_col is self.adj.col
        self.nnz = self.adj.nnz
        self._cusparse, self._dgl_path = {}, None

    def baseline_product(self, impl: str, which: str, dtype: torch.dtype):
        """The product of baseline ``impl`` (``BASELINES``) for ``which``: ``x -> A_norm x``
        (``spmm_fwd``) or ``g -> A_norm^T g`` (``spmm_bwd``), on features of ``dtype``."""
        if impl == "cusparse-cached":
            m = self.cusparse(which, dtype)
            return lambda x: torch.sparse.mm(m, x)
        from .baselines import dgl_path_adjoint, dgl_path_product

        g = self.dgl_path()
        if which == "spmm_fwd":
            return lambda x: dgl_path_product(x, g)
        src_norm, dst_norm = g.src_norm(dtype), g.dst_norm(dtype)  # the forward's, which autograd keeps
        return lambda grad: dgl_path_adjoint(grad, g, src_norm, dst_norm)

    def cusparse(self, which: str, dtype: torch.dtype = torch.float32):
        """A_norm (``spmm_fwd``) or A_norm^T (``spmm_bwd``) as a torch sparse CSR with int32
        indices, normalized values and the diagonal added, in ``dtype`` (cuSPARSE multiplies no
        float32 matrix with 16-bit features); each built once."""
        key = (which, dtype)
        if key not in self._cusparse:
            if dtype != torch.float32:
                m = self.cusparse(which).to(dtype)
            elif which == "spmm_fwd":
                m = self._csr(self.adj.rowptr, self.adj.col, self.r, self.c)
            elif self.symmetric and self.r is self.c:
                m = self.cusparse("spmm_fwd")
            else:
                m = self._csr(self.t_rowptr, self.t_col, self.c, self.r)
            self._cusparse[key] = m
        return self._cusparse[key]

    def dgl_path(self):
        """DGL's graph of ``A + I`` (:class:`fgplugin.bench.baselines.DGLPathGraph`: CSR with
        all-ones values and degrees; its transposed CSR built on the first backward product),
        built from the adjacency when first asked for and kept until :meth:`drop_dgl_path` (the
        suite drops it after each group of dgl-path rows)."""
        if self._dgl_path is None:
            from fgplugin._csr import rows_of_edges

            from .baselines import DGLPathGraph

            edge_index = torch.stack([self.adj.col.long(), rows_of_edges(self.adj.rowptr, self.nnz)])  # (src, dst)
            self._dgl_path = DGLPathGraph(edge_index, self.n)
        return self._dgl_path

    def drop_dgl_path(self) -> None:
        """Frees DGL's graph (:meth:`dgl_path`); the next dgl-path product builds it again."""
        self._dgl_path = None

    def dgl_path_reference(self, which: str, x, rows):
        """float64 ``rows`` of DGL's own product (:meth:`dgl_path`), which the ``dgl-path`` rows are
        checked against: ``D_in^-1/2 (A + I) D_out^-1/2 x`` (``spmm_fwd``) or its transpose
        (``spmm_bwd``). DGL scales the source side by out-degrees where the suite's product (PyG's
        ``gcn_norm``) uses in-degrees on both sides, so on a directed graph the two differ."""
        g = self.dgl_path()
        src, dst = g.src_norm(torch.float64)[:, 0], g.dst_norm(torch.float64)[:, 0]
        if which == "spmm_fwd":
            return sample_reference(g.rowptr, g.col, x, dst, src, None, rows)
        t = g.transposed(torch.float32)
        return sample_reference(t.crow_indices(), t.col_indices(), x, src, dst, None, rows)

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
    setup of the kernel A/B experiments)."""
    from fgplugin.datasets import community_graph
    from fgplugin.reorder import inverse_permutation, reorder

    g = community_graph(name, device="cuda", num_features=0)
    n, ei = g.num_nodes, g.edge_index
    return GraphRun(name, "community", inverse_permutation(reorder(ei, "community", num_nodes=n))[ei], n)


def bench_graph(run: GraphRun, args, rows_out, threshold_rows, copy_tbps, fs, impl_filter, log=_print):
    """Time every impl, F and precision on ``run``; appends to ``rows_out`` (the spmm rows) and
    ``threshold_rows`` (F = 128 fp32 rows of ``fgplugin`` and the fixed thresholds)."""
    from fgplugin.autotune import choose_threshold

    adj = run.adj
    meta = {"graph": run.name, "order": run.order, "nodes": run.n, "nnz": run.nnz}
    plans = {}
    precisions = list(getattr(args, "precisions", PRECISIONS))

    def plan_of(thr):
        key = float(thr)
        if key not in plans:
            t0 = time.time()
            p, tp = plans_at(adj, key)
            torch.cuda.synchronize()
            plans[key] = (p, tp, time.time() - t0)
        return plans[key]

    impls = ["fgplugin"]
    if run.order != "ideal":
        impls += ["fgplugin-nodense", "fgplugin-csr"]
        if run.order != "original":
            impls += list(FIXED)
    impls += list(BASELINES)
    impls = [i for i in impls if impl_filter is None or i in impl_filter]
    for thr in FIXED.values():  # built first, so the auto probe reuses them
        if any(i in impls for i in FIXED) or "fgplugin" in impls:
            plan_of(thr)
    # threshold="auto" probes once per dtype class (fp32 / 16-bit), as fgplugin.spmm does for x's dtype
    auto_thr, probe_s = {}, {}
    if "fgplugin" in impls:
        classes = [("fp32", torch.float32)]
        if any(DTYPE[p] != torch.float32 for p in precisions):
            classes.append(("16bit", torch.bfloat16))
        for cls, dtype in classes:
            t0 = time.time()
            set_precision("fp32")
            choice = choose_threshold(adj, dtype)
            auto_thr[cls] = choice["threshold"]
            probe_s[cls] = time.time() - t0
            probe = choice.get("times_ms", {})
            log(f"  auto threshold ({cls}) {auto_thr[cls]} (probe {probe_s[cls]:.2f} s; ms per candidate: "
                f"{ {k: round(v, 3) for k, v in probe.items()} })")

    gen = torch.Generator(device="cuda").manual_seed(0)
    sample_rows = torch.randperm(run.n, device="cuda", generator=gen)[:512]
    for F in fs:
        for prec in precisions:
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
                if (prec != "fp32" or F != 128) and impl not in EVERY_WIDTH:
                    continue
                cls = "fp32" if dtype == torch.float32 else "16bit"
                thr = {"fgplugin": auto_thr.get(cls), "fgplugin-nodense": 1.0, **FIXED}.get(impl)
                for which in ("spmm_fwd", "spmm_bwd"):
                    row = {**meta, "impl": impl, "op": which, "F": F, "precision": prec, "ms_median": None,
                           "ms_min": None, "ms_max": None, "floor_ms": round(floor_ms, 5), "peak_mem_bytes": None,
                           "rel_err": None}
                    try:
                        set_precision(prec)
                        if impl in BASELINES:
                            fn = run.baseline_product(impl, which, dtype)
                        else:
                            if impl == "fgplugin-csr":
                                p, tp, build_s = None, None, 0.0
                            else:
                                p, tp, build_s = plan_of(thr)
                                row["threshold"] = thr
                                row["plan_build_s"] = round(build_s, 3)
                                st = p.stats()
                                row["dense_share"] = round(st["dense_nnz"] / max(run.nnz, 1), 4)
                                row["dense_tiles"] = st["dense_tiles"]
                            if which == "spmm_fwd":
                                fn = lambda x, p=p: spmm_op(adj.rowptr, adj.col, x, run.r, run.c, run.d, p)  # noqa: E731
                            else:
                                fn = lambda x, p=tp: spmm_op(run.t_rowptr, run.t_col, x, run.c, run.r,  # noqa: E731
                                                             run.d, p)
                        # checked first: a wrong product's time is no result
                        ref = run.dgl_path_reference(which, xs[0], sample_rows) if impl == "dgl-path" else refs[which]
                        if checked(row, fn, xs[0], ref, sample_rows):
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
                if impl == "dgl-path":  # its graph is in no other row's peak memory
                    fn = None
                    run.drop_dgl_path()
            del xs
    plans.clear()  # the plans live in the adjacency's caches: freed with run
    torch.cuda.empty_cache()


def load_bench_graph(name):
    """A synthetic preset (generated on the GPU) or a real ``.npz`` graph (by name in
    ``$FGPLUGIN_DATA_DIR``, or path): an object with ``num_nodes``, ``edge_index`` on the GPU and
    ``community`` (None for real graphs, which then skip the "ideal" order)."""
    from types import SimpleNamespace

    from fgplugin.datasets import SUITE, community_graph, load_npz

    if name in SUITE:
        return community_graph(name, device="cuda", num_features=0)
    g = load_npz(name, features=None)
    return SimpleNamespace(num_nodes=g.num_nodes, edge_index=g.edge_index.cuda(), community=None)


def _short(error) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}" if str(error) else type(error).__name__


def bench_section(args, log=_print, checkpoint=None):
    """Every graph of ``args.graphs`` in every order of ``args.orders``: ``(copy_TBps, spmm rows,
    threshold rows, preprocessing rows)``. ``checkpoint(copy_tbps, rows, threshold_rows, prep)`` is
    called after each graph (to write partial results)."""
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
            if checkpoint:
                checkpoint(copy_tbps, rows, threshold_rows, prep)
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
                        method, _, parts = order.partition("-blockwise")
                        perm = reorder(ei, method, num_nodes=n, **({"parts": int(parts)} if parts else {}))
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
                bench_graph(run, args, rows, threshold_rows, copy_tbps, fs, args.impls, log=log)
                log(f"[bench]   timed in {time.time() - t0:.1f} s")
                del run
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"graph": name, "order": order, "impl": "-", "op": "-", "ms_median": None,
                             "error": _short(error)})
            torch.cuda.empty_cache()
        del g, ei
        torch.cuda.empty_cache()
        if checkpoint:
            checkpoint(copy_tbps, rows, threshold_rows, prep)
    return copy_tbps, rows, threshold_rows, prep


def auto_vs_best(threshold_rows) -> list[dict]:
    """Per (graph, order, op): auto's time over the best fixed threshold's (``auto_over_best_fixed``)."""
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
            notes.append({"graph": graph, "order": order, "op": op_name,
                          "auto_over_best_fixed": round(t["auto"] / min(fixed), 3)})
    return notes


def write_results(out_dir, copy_tbps, rows, threshold_rows, prep, *, suites=("spmm", "threshold"), names=None,
                  argv=None, commit=None, partial=False, log=_print) -> dict:
    """``spmm.json`` (``copy_TBps``, ``preprocess``, ``rows``) and/or ``threshold.json``
    (``copy_TBps``, ``rows``, ``auto_vs_best``) with their ``.md`` tables in ``out_dir``; returns
    ``{suite: {"json": path, "md": path}}``. ``names`` maps a suite to its file stem."""
    from . import report

    names = names or {}
    paths = {}
    device = torch.device("cuda", torch.cuda.current_device())
    extra = {"copy_TBps": round(copy_tbps, 3), "commit": commit}
    if partial:
        extra["partial"] = True
    if "spmm" in suites:
        res = report.result("spmm", rows, device, argv=argv, preprocess=prep, **extra)
        paths["spmm"] = report.write(res, out_dir, names.get("spmm"), log=log, plot=False)
    if "threshold" in suites:
        res = report.result("threshold", threshold_rows, device, argv=argv, auto_vs_best=auto_vs_best(threshold_rows),
                            **extra)
        paths["threshold"] = report.write(res, out_dir, names.get("threshold"), log=log, plot=False)
    return paths


def print_tables(rows, notes, log=_print):
    """A compact table of the rows and the targets' ratios (F=128, fp32; community order)."""
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
        if r.get("F") not in (128, None) and r.get("impl") not in ("fgplugin", *BASELINES):
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
            dgl_orig = get(graph, "original", "dgl-path", op_name)
            bf = get(graph, best[1], "fgplugin", op_name, prec="bf16")
            floor = next((r["floor_ms"] for r in rows if r.get("graph") == graph and r.get("F") == 128
                          and r.get("precision") == "fp32" and r.get("floor_ms")), None)
            parts = [f"{graph:<14}{op_name:<9} fgplugin[{best[1]}] {best[0]:.3f} ms"]
            if cs_orig:
                parts.append(f"vs cuSPARSE original {cs_orig / best[0]:.2f}x (>=4)")
            if cs_same:
                parts.append(f"vs cuSPARSE same order {cs_same / best[0]:.2f}x (>=2)")
            if dgl_orig:
                parts.append(f"vs DGL path original {dgl_orig / best[0]:.2f}x")
            if floor:
                parts.append(f"{best[0] / floor:.2f}x floor (proteins <=5)")
            if bf:
                parts.append(f"bf16 {best[0] / bf:.2f}x faster (>=1.7)")
            log("  " + "; ".join(parts))
    for n_ in notes:
        log(f"  auto/best-fixed {n_['graph']:<14}{n_['order']:<10}{n_['op']:<9} {n_['auto_over_best_fixed']:.3f} (<=1.05)")


def run_suite(suite: str, opts: Options, out_dir, *, name=None, argv=None, commit=None, log=_print):
    """Run the ``spmm`` or ``threshold`` suite on the current CUDA device and write its results
    (``spmm`` writes the threshold file too); returns ``(rows of the suite, result paths)``.
    Partial results are written after each graph."""
    import fgplugin

    suites = ("spmm", "threshold") if suite == "spmm" else ("threshold",)
    names = {suite: name} if name else {}
    if name and suite == "spmm":
        names["threshold"] = f"{name}-threshold"
    status = fgplugin.extension_status()
    log(f"[status] fgplugin {fgplugin.__version__}: extension loaded={status.loaded} cuda={status.cuda} "
        f"build_dir={status.build_dir}")
    log(f"[status] device {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}")

    def checkpoint(copy_tbps, rows, threshold_rows, prep):
        write_results(out_dir, copy_tbps, rows, threshold_rows, prep, suites=suites, names=names, argv=argv,
                      commit=commit, partial=True, log=log)

    copy_tbps, rows, threshold_rows, prep = bench_section(opts, log=log, checkpoint=checkpoint)
    paths = write_results(out_dir, copy_tbps, rows, threshold_rows, prep, suites=suites, names=names, argv=argv,
                          commit=commit, log=log)
    print_tables(rows, auto_vs_best(threshold_rows))
    return (rows if suite == "spmm" else threshold_rows), paths

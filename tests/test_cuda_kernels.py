"""The block-adaptive CUDA SpMM (csrc/cuda/block_adaptive_spmm.cu, dense_tiles_sm90.cu) against the
float64 reference.

Every plan path (all tiles dense, the default threshold, no dense tiles, other tile sizes) on the
graph-case registry and on fresh random graphs with hubs and dense blocks; fp32 (<= 1e-5), TF32
(<= 5e-3), bf16 (<= 2e-2) and fp16; F in (1, 7, 32, 33, 128, 130); rectangular shapes, int64
indices, weights, scales and diag; forward and backward (gradients compared with the CPU op).
The kernel allocates its output, so the "poison" check is: no NaN where the reference has none.

Unit-weight dense tiles run on the wgmma kernel on Hopper and on the mma.sync kernel elsewhere (or
with ``fgplugin.config.set_wgmma(False)``); the ``dense_kernel`` fixture runs the registry, random-graph and
determinism tests on each kernel the GPU has.

The plan builder itself is checked on any machine by executing the plan's semantics in float64
(test_plan_semantics_cpu).
"""
from __future__ import annotations

import contextlib
import re

import pytest
import torch

import fgplugin
from fgplugin._extension import source_dir
from fgplugin.config import set_wgmma
from fgplugin.kernel_plan import build_kernel_plan
from fgplugin.tiling import TiledAdjacency

from fgplugin.testing import clustered_case, dense_spmm, graph_cases, random_graph_case, record_spmm_widths, rel_error

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (block-adaptive kernel)")
requires_kernel = pytest.mark.skipif(
    not (torch.cuda.is_available() and fgplugin.extension_status().cuda),
    reason="the CUDA extension is not built: " + (fgplugin.extension_status().reason or "no GPU"))

TOL = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 2e-2, "fp16": 1e-2}
DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def precision(mode):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _wgmma_available():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@contextlib.contextmanager
def wgmma(enabled: bool):
    previous = set_wgmma(enabled)
    try:
        yield
    finally:
        set_wgmma(previous)


@pytest.fixture(params=["wgmma", "mma"])
def dense_kernel(request):
    """Which kernel computes unit-weight dense tiles (the switch takes effect at the next launch)."""
    if request.param == "wgmma" and not _wgmma_available():
        pytest.skip("the wgmma dense-tile kernel needs a compute capability 9.0 GPU (H100/H200)")
    with wgmma(request.param == "wgmma"):
        yield request.param


def _adj(case, **options):
    options.setdefault("threshold", getattr(case, "threshold", 0.05))
    return TiledAdjacency.from_edge_index(case.edge_index, case.num_nodes, case.edge_weight, size=case.size,
                                          **options)


def _inputs(case, F, dtype, seed, scales=True, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    n_dst, n_src = case.shape
    x = torch.randn(n_src, F, generator=g).to(dtype)
    if not scales:
        return x.to(device), None, None, None
    rs = torch.rand(n_dst, generator=g) + 0.5
    cs = torch.rand(n_src, generator=g) + 0.5
    d = torch.rand(min(n_dst, n_src), generator=g)
    return x.to(device), rs.to(device), cs.to(device), d.to(device)


def _run(adj, plan, x, rs, cs, d, bias=None, width=-1):
    from fgplugin.ops import csr_product

    values = None if adj.values is None else adj.values.float()
    return csr_product(adj.rowptr, adj.col, values, x, rs, cs, d, plan, bias, width)


def _check(case, out, x, rs, cs, d, tol, what):
    ref = dense_spmm(case.dense(), x.double().cpu(), None if rs is None else rs.cpu(),
                     None if cs is None else cs.cpu(), None if d is None else d.cpu())
    assert out.shape == ref.shape, what
    assert out.dtype == x.dtype, what
    nan_out = torch.isnan(out.float().cpu())
    assert not (nan_out & ~torch.isnan(ref)).any(), f"{what}: NaN (unwritten or wrong) elements in the output"
    err = rel_error(out.float(), ref)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


# --------------------------------------------------------------------------- CPU: plan semantics
def _emulate(plan, adj, x, rs, cs, d):
    dblock_ptr, dstage, bits, roff, deid, rem_col, rem_eid, item_ptr, item_row, frag, panel_dense = (
        getattr(plan, name).cpu() for name in ("dblock_ptr", "dstage", "dtile_bits", "dtile_roff", "dense_eid",
                                               "rem_col", "rem_eid", "item_ptr", "item_row", "dtile_frag",
                                               "dpanel_dense"))
    values = None if adj.values is None else adj.values.double().cpu()
    n_rows, n_cols = adj.shape
    xc = x.double() * (cs.double()[:, None] if cs is not None else 1.0)
    out = torch.zeros(n_rows, x.shape[1], dtype=torch.float64)
    dstage = dstage.view(-1, 4)
    panels_seen = set()
    for blk in range(dblock_ptr.numel() - 1):
        for s in range(int(dblock_ptr[blk]), int(dblock_ptr[blk + 1])):
            cp, mask, first, _ = (int(v) for v in dstage[s])
            assert 0 < mask < 16
            for q in range(4):
                if not (mask >> q) & 1:
                    continue
                t = first + bin(mask & ((1 << q) - 1)).count("1")
                p = blk * 4 + q
                panels_seen.add(p)
                for r in range(32):
                    w, k = int(bits[t * 32 + r]) & 0xFFFFFFFF, 0
                    for b in range(32):
                        # the fragment word of lane 4 (r % 8) + b % 4 holds the same bit
                        lane = (r % 8) * 4 + b % 4
                        fbit = (r // 16) * 16 + (b // 8) * 4 + (r // 8) % 2 + ((b // 4) % 2) * 2
                        assert ((int(frag[t * 32 + lane]) >> fbit) & 1) == ((w >> b) & 1)
                        if (w >> b) & 1:
                            v = 1.0 if values is None else float(values[int(deid[int(roff[t * 32 + r]) + k])])
                            k += 1
                            out[p * 32 + r] += v * xc[cp * 32 + b]
    assert panel_dense.nonzero().squeeze(1).tolist() == sorted(panels_seen)
    for it in range(item_row.numel()):
        for e in range(int(item_ptr[it]), int(item_ptr[it + 1])):
            v = 1.0 if values is None else float(values[int(rem_eid[e])])
            out[int(item_row[it])] += v * xc[int(rem_col[e])]
    if d is not None:
        out[:d.numel()] += d.double()[:, None] * xc[:d.numel()]
    return out * (rs.double()[:, None] if rs is not None else 1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tile_size,threshold,chunk", [(32, 0.05, 16), (16, 0.02, 5), (64, 0.08, 256), (32, 1.0, 3),
                                                       (32, 0.0, 7)])
def test_plan_semantics_cpu(seed, tile_size, threshold, chunk):
    case = clustered_case(seed, weighted=seed % 2 == 1, n_dst=None if seed != 2 else 90, max_hub_edges=900)
    adj = _adj(case, index_dtype=torch.int64 if seed == 1 else None)
    plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, tile_size=tile_size, threshold=threshold,
                             weighted=case.edge_weight is not None, chunk=chunk)
    x, rs, cs, d = _inputs(case, 3, torch.float64, seed, device="cpu")
    err = rel_error(_emulate(plan, adj, x, rs, cs, d), dense_spmm(case.dense(), x, rs, cs, d))
    assert err < 1e-12
    # split rows: slots of a row are consecutive, in item order
    item_row, item_slot, split_row, split_ptr = plan.item_row, plan.item_slot, plan.split_row, plan.split_ptr
    for s in range(split_row.numel()):
        items = (item_row == split_row[s]).nonzero().squeeze(1)
        assert item_slot[items].tolist() == list(range(int(split_ptr[s]), int(split_ptr[s + 1])))
    assert bool((item_slot[(item_row[:, None] != split_row[None, :]).all(1)] == -1).all())


def test_plan_work_items_sized_by_chunk_for():
    """Without an explicit chunk, a plan cuts its remainder into items of chunk_for(nnz) entries:
    32 on a small matrix (hub rows split over several items), 256 from 8M non-zeros on."""
    from fgplugin.kernel_plan import chunk_for

    assert (chunk_for(10_000), chunk_for(1_000_000), chunk_for(20_000_000)) == (32, 64, 256)
    case = clustered_case(0, max_hub_edges=900)
    adj = _adj(case)
    plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=1.0)
    assert plan.chunk == chunk_for(adj.nnz) == 32
    assert int(plan.item_ptr.diff().max()) <= 32 < int(adj.rowptr.diff().max())
    assert plan.split_row.numel() > 0


def test_cpu_runs_without_kernel_plans():
    case = clustered_case(0, max_hub_edges=900)
    adj = _adj(case)
    assert adj.kernel_plan(torch.float32) is None and adj.kernel_plan(torch.float32, transpose=True) is None
    assert adj.prepare() is None


# --------------------------------------------------------------------------- GPU
VARIANTS = [(32, None), (32, 0.0), (32, 1.0), (16, 0.02), (64, 0.05)]  # (tile size, threshold; None = case's)


@requires_kernel
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"T{v[0]}-thr{v[1]}")
@pytest.mark.parametrize("F", [1, 7, 33, 128])
def test_registry_fp32(dense_kernel, variant, F):
    tile_size, threshold = variant
    for case in graph_cases():
        for index_dtype in (None, torch.int64):
            adj = _adj(case, index_dtype=index_dtype).to("cuda")
            thr = adj.threshold if threshold is None else threshold
            plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, tile_size=tile_size, threshold=thr,
                                     weighted=adj.values is not None, chunk=8)
            for scales in (False, True):
                x, rs, cs, d = _inputs(case, F, torch.float32, F + 7 * scales)
                with precision("fp32"):
                    out = _run(adj, plan, x, rs, cs, d)
                _check(case, out, x, rs, cs, d, TOL["fp32"], f"{case.name} {variant} F={F} idx={index_dtype} "
                                                              f"scales={scales}")


@requires_kernel
@pytest.mark.parametrize("mode", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("F", [7, 32, 130])
def test_registry_low_precision(dense_kernel, mode, F):
    for case in graph_cases():
        adj = _adj(case).to("cuda")
        for threshold in (0.0, adj.threshold):
            plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=threshold,
                                     weighted=adj.values is not None)
            x, rs, cs, d = _inputs(case, F, DTYPE[mode], F)
            with precision(mode):
                out = _run(adj, plan, x, rs, cs, d)
            _check(case, out, x, rs, cs, d, TOL[mode], f"{case.name} {mode} thr={threshold} F={F}")


@requires_kernel
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("F", [1, 32, 33, 64, 128, 130, 256])
def test_fresh_random_graphs(dense_kernel, fresh_seed, mode, F):
    for k in range(3):
        seed = fresh_seed + k
        rect = k == 1
        case = clustered_case(seed, n_src=200 if rect else None, n_dst=137 if rect else None, weighted=k == 2,
                              max_hub_edges=900)
        adj = _adj(case, index_dtype=torch.int64 if k == 2 else None).to("cuda")
        for threshold in (0.02, 0.05, 0.10):
            plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=threshold,
                                     weighted=case.edge_weight is not None, chunk=32)
            x, rs, cs, d = _inputs(case, F, DTYPE[mode], seed)
            with precision(mode):
                out = _run(adj, plan, x, rs, cs, d)
            _check(case, out, x, rs, cs, d, TOL[mode], f"seed={seed} {mode} F={F} thr={threshold}")


@requires_kernel
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_remainder_pass_long_and_short_items(fresh_seed, mode):
    """The remainder pass splits its work two ways when F is narrower than 32 vector lanes: one
    item per warp when the items are long on average, one item per group of lanes when they are
    short (the cut is kGroupedMaxMeanItem in the .cu file). A graph of long rows runs through both,
    with chunk 256 (rows of ~288 entries: most split in two) and with chunk 8, at F < 32 lanes."""
    source = (source_dir() / "cuda" / "block_adaptive_spmm.cu").read_text()
    limit = int(re.search(r"kGroupedMaxMeanItem = (\d+);", source).group(1))
    case = random_graph_case(fresh_seed, n_src=500, avg_degree=3 * limit)  # rows of ~288: most split at 256
    adj = _adj(case).to("cuda")
    for chunk, grouped in ((256, False), (8, True)):
        plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=1.0, weighted=False, chunk=chunk)
        rem_nnz, items = plan.rem_col.numel(), plan.item_row.numel()
        assert (rem_nnz <= limit * items) == grouped, (chunk, rem_nnz / items)
        for F in (1, 7, 16, 48, 64):
            x, rs, cs, d = _inputs(case, F, DTYPE[mode], fresh_seed + F)
            _check(case, _run(adj, plan, x, rs, cs, d), x, rs, cs, d, TOL[mode], f"chunk={chunk} {mode} F={F}")


@requires_kernel
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_epilogue_in_the_output_pass(dense_kernel, fresh_seed, mode):
    """``bias`` and ``width`` (a layer's bias add and the cut of the zero columns it padded)
    applied by the kernels' output pass: rows finished by the remainder pass (one item per warp
    and grouped), rows with dense tiles (their partial read back), split rows finished by the
    combine pass; against the float64 reference's first ``width`` columns plus the bias."""
    cases = graph_cases() + [clustered_case(fresh_seed, max_hub_edges=900)]
    for case in cases:
        adj = _adj(case).to("cuda")
        for threshold, chunk in ((adj.threshold, 8), (0.0, 256), (1.0, 8)):
            plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=threshold,
                                     weighted=adj.values is not None, chunk=chunk)
            for F, width in ((8, 8), (8, 5), (48, 47), (64, 64), (132, 129), (32, 1)):
                x, rs, cs, d = _inputs(case, F, DTYPE[mode], fresh_seed + F)
                bias = torch.randn(width, generator=torch.Generator().manual_seed(F)).cuda()
                out = _run(adj, plan, x, rs, cs, d, bias, width)
                what = f"{case.name} thr={threshold} chunk={chunk} {mode} F={F} width={width}"
                ref = dense_spmm(case.dense(), x.double().cpu(), None if rs is None else rs.cpu(),
                                 None if cs is None else cs.cpu(), None if d is None else d.cpu())
                ref = ref[:, :width] + bias.double().cpu()
                assert out.shape == ref.shape and out.dtype == x.dtype and out.is_contiguous(), what
                assert not torch.isnan(out.float()).any(), f"{what}: NaN (unwritten or wrong) elements"
                err = rel_error(out.float(), ref)
                assert err <= TOL[mode], f"{what}: relative error {err:.2e} > {TOL[mode]:.0e}"


@requires_kernel
@pytest.mark.parametrize("weighted", [True, False])
def test_deterministic(dense_kernel, weighted):
    case = clustered_case(5, n_src=3000, weighted=weighted, max_hub_edges=900)
    adj = _adj(case).to("cuda")
    plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=0.03, weighted=weighted, chunk=16)
    x, rs, cs, d = _inputs(case, 96, torch.float32, 5)
    first = _run(adj, plan, x, rs, cs, d)
    for _ in range(3):
        assert torch.equal(_run(adj, plan, x, rs, cs, d), first)


@requires_kernel
def test_hopper_runs_the_wgmma_kernel():
    """On an H100/H200 unit-weight dense tiles take the wgmma kernel unless switched off (a build
    without sm_90a code would silently fall back to mma.sync: this catches it), and both kernels
    give the same function of the input."""
    device = torch.cuda.current_device()
    with wgmma(False):
        assert torch.ops.fgplugin.dense_tile_arch(device) == 80
    with wgmma(True):
        assert torch.ops.fgplugin.dense_tile_arch(device) == (90 if _wgmma_available() else 80)
    case = clustered_case(7, n_src=2500, max_hub_edges=900)
    adj = _adj(case).to("cuda")
    plan = build_kernel_plan(adj.rowptr, adj.col, adj.shape, threshold=0.02, weighted=False, chunk=16)
    assert plan.num_dense_tiles > 0, "the case should have dense tiles"
    x, rs, cs, d = _inputs(case, 128, torch.float32, 7)
    with precision("fp32"):
        outs = {}
        for enabled in (True, False):
            with wgmma(enabled):
                outs[enabled] = _run(adj, plan, x, rs, cs, d)
    assert rel_error(outs[True].double(), outs[False].double()) <= 1e-6


@requires_kernel
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("square", [True, False])
def test_forward_backward_through_fgplugin_spmm(weighted, square, monkeypatch):
    """fgplugin.spmm builds the plans itself (forward and transpose); grads match the CPU op."""
    monkeypatch.setattr(fgplugin.ops, "PAD_MIN_WORK", 0)  # pad even this small product
    case = clustered_case(11, n_src=None if square else 180, n_dst=None if square else 100, weighted=weighted,
                          max_hub_edges=900)
    adj_cpu = _adj(case, threshold=0.03)
    adj = adj_cpu.to("cuda")
    # F=41: not whole 16-byte vectors, so fgplugin.spmm pads x on CUDA (and the gradient through it)
    x_cpu, rs, cs, d = _inputs(case, 41, torch.float32, 3, device="cpu")
    results = {}
    for name, a, dev in (("cpu", adj_cpu, "cpu"), ("cuda", adj, "cuda")):
        x = x_cpu.detach().to(dev, copy=True).requires_grad_()  # fresh leaves for each device
        scales = [t.detach().to(dev, copy=True).requires_grad_() for t in (rs, cs, d)]
        with precision("fp32"):
            out = fgplugin.spmm(a, x, *scales)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(dev)
            (out * g).sum().backward()
        results[name] = [out.detach().cpu(), x.grad.cpu()] + [s.grad.cpu() for s in scales]
    if weighted is False:
        assert adj.cached_kernel_plan(0.03, weighted=False) is not None
    for a, b in zip(results["cpu"], results["cuda"]):
        assert rel_error(b, a) <= 1e-5


@requires_kernel
def test_bf16_backward_and_plan_cache():
    case = clustered_case(3, n_src=500, max_hub_edges=900)
    adj = _adj(case).to("cuda")
    x = torch.randn(adj.shape[1], 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = fgplugin.spmm(adj, x, *adj.norm("gcn"))
    out.float().sum().backward()
    assert x.grad is not None and not torch.isnan(x.grad.float()).any()
    p1, p2 = adj.kernel_plan(x.dtype), adj.kernel_plan(x.dtype)
    assert p1 is not None and p1 is p2  # kept, not rebuilt


@requires_kernel
def test_auto_threshold_probe(monkeypatch):
    from fgplugin import autotune
    from fgplugin.autotune import CANDIDATES, choose_threshold, probe_thresholds

    monkeypatch.setattr(autotune, "PROBE_MIN_NNZ", 0)  # probe these small graphs too

    case = clustered_case(4, n_src=2000, max_hub_edges=900)
    adj = _adj(case).to("cuda")
    x = torch.randn(adj.shape[1], 128, device="cuda")
    assert choose_threshold(adj, x.dtype)["threshold"] in CANDIDATES
    # The user-facing form: an adjacency built with threshold="auto" resolves it before the first
    # plan is built, once per dtype class, and runs the probe's choice.
    auto = _adj(case).to("cuda").with_tiles(threshold="auto")
    out = fgplugin.spmm(auto, x)
    chosen = auto.resolved_threshold(torch.float32)
    assert chosen in CANDIDATES and auto.kernel_plan(torch.float32).threshold == chosen
    assert auto.resolved_threshold(torch.float32) == chosen  # kept
    assert rel_error(out, fgplugin.spmm(adj, x)) <= 1e-5
    # prepare(): the probe's choice and both plans, built before the first product.
    fresh = _adj(case).to("cuda").with_tiles(threshold="auto")
    chosen = fresh.prepare()  # its own probe (close candidates may come out in another order)
    assert chosen in CANDIDATES and chosen == fresh.resolved_threshold(torch.float32)
    assert {k[1] for k in fresh._shared if k[0] == "kernel_plan" and k[3] == chosen} == {False, True} \
        or fresh.is_symmetric
    assert fresh.prepare(torch.float64) is None  # float64 runs the plain CSR kernel
    # No tile above the lowest candidate: every candidate is the same plan, nothing is timed, and
    # the choice is 1.0 (no dense tiles).
    scattered = _adj(random_graph_case(3, n_src=5000, avg_degree=5)).to("cuda")
    assert probe_thresholds(scattered) == {}
    assert choose_threshold(scattered) == {"threshold": 1.0, "times_ms": {}, "plan": None}


@requires_kernel
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: an adjacency on the one not current")
def test_the_probe_times_the_adjacencys_device(monkeypatch):
    """An adjacency on cuda:1 while cuda:0 is current: the probe's CUDA events are recorded on
    cuda:1, where its products run (on cuda:0 they would time an idle stream)."""
    from fgplugin import autotune

    monkeypatch.setattr(autotune, "PROBE_MIN_NNZ", 0)
    timed_on, timing = [], autotune._device_and_host_ms

    def recording(run, n):
        timed_on.append(torch.cuda.current_device())
        return timing(run, n)

    monkeypatch.setattr(autotune, "_device_and_host_ms", recording)
    adj = _adj(clustered_case(4, n_src=2000, max_hub_edges=900)).to("cuda:1")
    with torch.cuda.device(0):
        assert autotune.choose_threshold(adj)["times_ms"]
    assert timed_on and set(timed_on) == {1}


@requires_kernel
def test_the_probe_keeps_the_plan_it_chose(monkeypatch):
    """The plan of the chosen threshold that the probe built and timed is the one the products
    run, not built a second time; a graph whose candidates all make one plan is not timed."""
    from fgplugin import autotune

    built = []

    def counting(*args, **kwargs):
        built.append(build_kernel_plan(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(autotune, "build_kernel_plan", counting)
    monkeypatch.setattr(autotune, "PROBE_MIN_NNZ", 0)  # probe these small graphs too
    auto = _adj(clustered_case(4, n_src=2000, max_hub_edges=900)).to("cuda").with_tiles(threshold="auto")
    chosen = auto.resolved_threshold(torch.float32)
    times = auto._shared[("auto_threshold", auto.tile_size, auto.device, "fp32")]["times_ms"]
    assert len(built) >= 2  # this graph has dense tiles to weigh
    if min(times.values()) == times[chosen]:  # the fastest was chosen (not overruled by MIN_DENSE_GAIN)
        assert any(auto.kernel_plan(torch.float32) is plan for plan in built)
    built.clear()
    scattered = _adj(random_graph_case(3, n_src=5000, avg_degree=5)).to("cuda").with_tiles(threshold="auto")
    assert scattered.resolved_threshold(torch.float32) == 1.0 and built == []
    assert scattered.kernel_plan(torch.float32) is not None


@requires_kernel
@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gcn_layer_pads_the_weight_on_cuda(dtype, pad, monkeypatch):
    """fgplugin.pyg.GCNConv with 47 output channels: where the product is large enough to pad
    (forced here), the SpMM runs on the 48 columns (whole 16-byte rows at fp32 and bf16) made by
    the padded weight (no pad or cut copies); this graph's product is too small to pad by itself
    and runs at 47. Outputs and gradients match the stock layer on the GPU either way."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    import fgplugin.pyg as fp
    from fgplugin import ops

    if pad:
        monkeypatch.setattr(ops, "PAD_MIN_WORK", 0)
    widths = record_spmm_widths(monkeypatch)
    case = clustered_case(2, n_src=3000, max_hub_edges=900)
    edge_index = case.edge_index.cuda()
    torch.manual_seed(0)
    stock = pyg_nn.GCNConv(64, 47).cuda()  # the fp32 stock layer is the reference for both dtypes
    ours = fp.GCNConv(64, 47).cuda().to(dtype)
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(case.num_nodes, 64, device="cuda")
    outs, grads = [], []
    for layer, xd in ((stock, x), (ours, x.to(dtype))):
        xi = xd.clone().requires_grad_()
        out = layer(xi, edge_index)
        out.float().square().sum().backward()
        outs.append(out)
        grads.append([xi.grad] + [p.grad for p in layer.parameters()])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert outs[1].is_contiguous() and rel_error(outs[1], outs[0]) <= tol
    for g_ours, g_stock in zip(grads[1], grads[0]):
        assert rel_error(g_ours, g_stock) <= tol
    assert widths and set(widths) == ({48} if pad else {47})


@requires_kernel
def test_plan_mismatch_is_an_error():
    """A plan of another graph, a damaged layout or a buffer of the wrong kind is refused by the
    op's host-side checks (never launched)."""
    a = _adj(clustered_case(0, n_src=100, max_hub_edges=900)).to("cuda")
    b = _adj(clustered_case(1, n_src=200, max_hub_edges=900)).to("cuda")
    plan = build_kernel_plan(b.rowptr, b.col, b.shape, threshold=0.05)
    with pytest.raises(RuntimeError, match="plan"):
        _run(a, plan, torch.randn(a.shape[1], 8, device="cuda"), None, None, None)
    own = build_kernel_plan(a.rowptr, a.col, a.shape, threshold=0.05)
    x = torch.randn(a.shape[1], 8, device="cuda")
    layout = list(own.layout)
    damaged = {
        "version": [99] + layout[1:],
        "short layout": layout[:-3],
        "section past the end": layout[:4] + [layout[4], own.buffer.numel() * 2] + layout[6:],
        "misaligned section": layout[:4] + [layout[4] + 4] + layout[5:],
        "wrong section dtype": layout[:6] + [4 if layout[6] == 3 else 3] + layout[7:],
    }
    for what, bad in damaged.items():
        with pytest.raises(RuntimeError, match="plan"):
            torch.ops.fgplugin.spmm(a.rowptr, a.col, None, x, None, None, None, own.buffer, bad, None, None, None,
                                    None, [])
    with pytest.raises(RuntimeError, match="uint8 buffer"):
        torch.ops.fgplugin.spmm(a.rowptr, a.col, None, x, None, None, None, own.buffer.cpu(), own.layout, None,
                                None, None, None, [])

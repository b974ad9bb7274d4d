"""fgplugin.spmm (compiled kernels and the reference path) against a dense float64 product."""
import pytest
import torch

import fgplugin
from fgplugin import TiledAdjacency
from fgplugin.ops import spmm_adjoint, spmm_vjp
from fgplugin.reference import spmm_reference
from fgplugin.testing import dense_spmm, graph_cases, random_graph_case, rel_error

CASES = graph_cases()
# CUDA runs wherever a GPU is visible (the GPU machine); CPU everywhere.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NORMS = ["gcn", "both", "right", "left", "none", "mean", "gcn-improved", "lgconv", "custom"]


def _scales(adj, norm, generator):
    if norm == "custom":  # arbitrary scales and per-node diagonal, signs included
        n_rows, n_cols = adj.shape
        return (torch.randn(n_rows, generator=generator), torch.randn(n_cols, generator=generator),
                torch.randn(min(adj.shape), generator=generator))
    if norm == "gcn-improved":
        return tuple(adj.norm("gcn", improved=True))
    if norm == "lgconv":
        return tuple(adj.norm("gcn", add_self_loops=False))
    return tuple(adj.norm(norm))


# GCN-style normalizations need one node set (square adjacency).
CASE_NORMS = [(case, norm) for case in CASES for norm in NORMS
              if case.is_square or norm not in ("gcn", "gcn-improved", "lgconv")]


@pytest.mark.parametrize("case,norm", CASE_NORMS, ids=lambda p: p if isinstance(p, str) else p.name)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("device", DEVICES)
def test_forward_matches_dense_reference(case, norm, index_dtype, device):
    g = torch.Generator().manual_seed(1)
    adj = case.adjacency(index_dtype=index_dtype)
    r, c, d = _scales(adj, norm, g)
    x = torch.randn(case.shape[1], 19, generator=g)
    ref = dense_spmm(case.dense(), x, r, c, d)
    on = lambda t: None if t is None else t.to(device)  # noqa: E731
    assert rel_error(fgplugin.spmm(adj.to(device), x.to(device), on(r), on(c), on(d)), ref) <= 1e-5
    assert rel_error(spmm_reference(on(adj.rowptr), on(adj.col), on(adj.values), x.to(device), on(r), on(c), on(d)),
                     ref) <= 1e-5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_dense_reference(case, device):
    g = torch.Generator().manual_seed(2)
    adj = case.adjacency()
    r, c, d = _scales(adj, "custom", g)
    x = torch.randn(case.shape[1], 5, generator=g).to(device).requires_grad_()
    grad_out = torch.randn(case.shape[0], 5, generator=g)
    fgplugin.spmm(adj.to(device), x, r.to(device), c.to(device), d.to(device)).backward(grad_out.to(device))
    ref_grad = dense_spmm(case.dense().t(), grad_out, c, r, d)  # diag(c) (A^T + D) diag(r) g
    assert rel_error(x.grad, ref_grad) <= 1e-5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("device", DEVICES)
def test_adjoint_matches_dense_reference(case, device):
    """spmm_adjoint: diag(c) (A^T + D) diag(r) g, the x-gradient of spmm without its forward."""
    g = torch.Generator().manual_seed(3)
    adj = case.adjacency()
    r, c, d = _scales(adj, "custom", g)
    grad_out = torch.randn(case.shape[0], 6, generator=g)
    got = spmm_adjoint(adj.to(device), grad_out.to(device), r.to(device), c.to(device), d.to(device))
    assert got.shape == (case.shape[1], 6)
    assert rel_error(got, dense_spmm(case.dense().t(), grad_out, c, r, d)) <= 1e-5
    with pytest.raises(ValueError, match="target nodes"):
        spmm_adjoint(adj, torch.randn(case.shape[0] + 1, 6))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("device", DEVICES)
def test_vjp_without_autograd_matches_autograd(case, device):
    """spmm_vjp: every input's gradient, computed without autograd, equals autograd's."""
    g = torch.Generator().manual_seed(5)
    structure = case.adjacency().to(device)
    values = torch.rand(structure.nnz, generator=g).to(device) + 0.1
    adj = TiledAdjacency.from_csr(structure.rowptr, structure.col, values, shape=structure.shape)
    scales = [t.to(device) for t in _scales(adj, "custom", g)]
    x = torch.randn(case.shape[1], 6, generator=g).to(device)
    grad_out = torch.randn(case.shape[0], 6, generator=g).to(device)
    with torch.no_grad():
        got = spmm_vjp(adj, x, grad_out, *scales)
    leaves = [adj.values.detach().requires_grad_(), x.requires_grad_(), *(t.requires_grad_() for t in scales)]
    out = fgplugin.spmm(TiledAdjacency.from_csr(adj.rowptr, adj.col, leaves[0], shape=adj.shape), *leaves[1:])
    for name, a, b in zip(("values", "x", "row_scale", "col_scale", "diag"), got,
                          torch.autograd.grad(out, leaves, grad_out)):
        assert rel_error(a, b) <= 1e-5, name


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("device", DEVICES)
def test_other_precisions(dtype, tol, device):
    case = [c for c in CASES if c.name == "not_divisible_weighted"][0]
    adj = case.adjacency().to(device)
    x = torch.randn(case.shape[1], 33)
    r, c, d = adj.norm("gcn")
    out = fgplugin.spmm(adj, x.to(device, dtype), r, c, d)
    assert out.dtype == dtype
    assert rel_error(out, dense_spmm(case.dense(), x.to(dtype), r, c, d)) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_fresh_random_graphs(fresh_seed, device):
    for offset, weighted in enumerate([False, True, False, True]):
        seed = fresh_seed + offset
        bipartite = offset >= 2
        case = random_graph_case(seed, weighted=weighted, n_src=None if not bipartite else 97,
                                 n_dst=None if not bipartite else 61)
        adj = case.adjacency().to(device)
        g = torch.Generator().manual_seed(seed)
        r, c, d = _scales(adj.cpu(), "custom", g)
        x = torch.randn(case.shape[1], 1 + seed % 70, generator=g).to(device).requires_grad_()
        out = fgplugin.spmm(adj, x, r.to(device), c.to(device), d.to(device))
        assert rel_error(out, dense_spmm(case.dense(), x.detach(), r, c, d)) <= 1e-5, f"seed {seed}"
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        assert rel_error(x.grad, dense_spmm(case.dense().t(), grad_out, c, r, d)) <= 1e-5, f"seed {seed}"


def test_gradcheck_all_inputs_float64():
    case = [c for c in CASES if c.name == "not_divisible_weighted"][0]
    g = torch.Generator().manual_seed(3)
    base = case.adjacency()
    weights = case.edge_weight.double().requires_grad_()
    r = torch.rand(70, generator=g, dtype=torch.float64).add_(0.5).requires_grad_()
    c = torch.rand(70, generator=g, dtype=torch.float64).add_(0.5).requires_grad_()
    d = torch.rand(70, generator=g, dtype=torch.float64).requires_grad_()
    x = torch.randn(70, 4, generator=g, dtype=torch.float64, requires_grad=True)

    def f(x, weights, r, c, d):
        return fgplugin.spmm(base.with_values(weights), x, r, c, d)

    assert torch.autograd.gradcheck(f, (x, weights, r, c, d))
    assert torch.autograd.gradgradcheck(lambda x: fgplugin.spmm(base, x, r.detach(), c.detach(), d.detach()), (x,))


def test_edge_weight_gradient_through_gcn_norm_matches_dense():
    case = [c for c in CASES if c.name == "self_loops"][0]
    g = torch.Generator().manual_seed(4)
    weights = (torch.rand(case.edge_index.shape[1], generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    adj = case.adjacency().with_values(weights)
    out = fgplugin.spmm(adj, x, *adj.norm("gcn"))

    dense_w = weights.clone().detach().requires_grad_()
    a = torch.zeros(40, 40, dtype=torch.float64).index_put((case.edge_index[1], case.edge_index[0]), dense_w,
                                                          accumulate=True)
    has_loop = torch.zeros(40, dtype=torch.bool)
    has_loop[case.edge_index[0][case.edge_index[0] == case.edge_index[1]]] = True
    a = a + torch.diag((~has_loop).double())
    dis = a.sum(1).rsqrt()
    ref = dis[:, None] * a * dis[None, :] @ x
    assert rel_error(out, ref) <= 1e-10
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref.backward(grad_out)
    assert rel_error(weights.grad, dense_w.grad) <= 1e-10


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float64])
def test_edge_weights_unfrozen_after_a_call_get_their_full_gradient(x_dtype):
    """``requires_grad_()`` leaves the weights' version as it was: the normalization and the op's
    arguments kept by a call made while the weights were frozen (an evaluation, a first step) must
    not be reused, or the gradient loses the normalization's part or goes missing."""
    case = [c for c in CASES if c.name == "self_loops"][0]
    g = torch.Generator().manual_seed(5)
    weights = torch.rand(case.edge_index.shape[1], generator=g) + 0.1
    x = torch.randn(40, 3, generator=g, dtype=x_dtype)

    def weight_grad(adj):
        out = fgplugin.spmm(adj, x, *adj.norm("gcn", dtype=torch.float32))
        return torch.autograd.grad((out ** 2).sum(), adj.values, allow_unused=True)[0]

    fresh = case.adjacency().with_values(weights.clone().requires_grad_())
    expected = weight_grad(fresh)
    adj = case.adjacency().with_values(weights.clone())
    for _ in range(2):
        fgplugin.spmm(adj, x, *adj.norm("gcn", dtype=torch.float32))  # frozen: kept on the adjacency
    adj.values.requires_grad_()
    got = weight_grad(adj)
    assert got is not None and rel_error(got, expected) <= 1e-5


def test_opcheck():
    """Every op passes torch.library.opcheck (schema, fake kernel, autograd registration, and
    dispatch), with and without inputs that require grad."""
    from fgplugin.ops import op_args

    case = [c for c in CASES if c.name == "not_divisible_weighted"][0]
    adj = case.adjacency()
    for requires_grad in (False, True):
        x = torch.randn(70, 6, requires_grad=requires_grad)
        args, _ = op_args(adj, x, *adj.norm("gcn"), with_transpose=True, name="test")
        torch.library.opcheck(torch.ops.fgplugin.spmm.default, tuple(args))
        epilogue = args._replace(bias=torch.randn(4, requires_grad=requires_grad), width=4)
        torch.library.opcheck(torch.ops.fgplugin.spmm.default, tuple(epilogue))
    unweighted = [c for c in CASES if c.name == "hub_row"][0].adjacency()
    args, _ = op_args(unweighted, torch.randn(300, 6, requires_grad=True), None, None, None, True, "test")
    torch.library.opcheck(torch.ops.fgplugin.spmm.default, tuple(args))
    for requires_grad in (False, True):
        a, b = torch.randn(70, 6, requires_grad=requires_grad), torch.randn(70, 6, requires_grad=requires_grad)
        torch.library.opcheck(torch.ops.fgplugin.sddmm.default, (adj.rowptr, adj.col, a, b))
    g = torch.randn(9, 5)
    g[::2] = 0
    torch.library.opcheck(torch.ops.fgplugin.nonzero_rows.default, (g,))
    torch.library.opcheck(torch.ops.fgplugin.pad_columns.default, (g, 8))


def test_torch_compile_fullgraph_no_graph_breaks():
    case = [c for c in CASES if c.name == "not_divisible_weighted"][0]
    adj = case.adjacency()
    weight = torch.randn(8, 8, requires_grad=True)
    norm = adj.norm("gcn")

    def two_layers(x):
        h = torch.relu(fgplugin.spmm(adj, x @ weight, *norm))
        return fgplugin.spmm(adj, h, *norm).sum()

    x = torch.randn(70, 8, requires_grad=True)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(two_layers)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(two_layers, fullgraph=True, backend="aot_eager")
    expected = two_layers(x)
    (grad_expected,) = torch.autograd.grad(expected, x)
    got = compiled(x)
    (grad_got,) = torch.autograd.grad(got, x)
    assert rel_error(got, expected) <= 1e-6 and rel_error(grad_got, grad_expected) <= 1e-6


def test_deterministic_repeat():
    adj = [c for c in CASES if c.name == "hub_row"][0].adjacency()
    x = torch.randn(300, 64)
    assert torch.equal(fgplugin.spmm(adj, x, *adj.norm("both")), fgplugin.spmm(adj, x, *adj.norm("both")))


def test_no_transpose_built_without_grad():
    adj = [c for c in CASES if c.name == "duplicate_edges"][0].adjacency()
    fgplugin.spmm(adj, torch.randn(60, 3))
    assert "transpose" not in adj._shared
    fgplugin.spmm(adj, torch.randn(60, 3, requires_grad=True))
    assert "transpose" in adj._shared


def test_padded_width_rule():
    """CUDA products pad to whole 16-byte rows, unless their work (nnz x width) is under
    PAD_MIN_WORK; off CUDA and for float64 nothing pads."""
    big, small = fgplugin.ops.PAD_MIN_WORK, 1000
    assert fgplugin.ops.padded_width(47, torch.float32, torch.device("cuda")) == 48
    assert fgplugin.ops.padded_width(47, torch.float32, torch.device("cuda"), nnz=big) == 48
    assert fgplugin.ops.padded_width(47, torch.float32, torch.device("cuda"), nnz=small) == 47
    assert fgplugin.ops.padded_width(41, torch.bfloat16, torch.device("cuda"), nnz=big) == 48
    assert fgplugin.ops.padded_width(47, torch.float64, torch.device("cuda"), nnz=big) == 47
    assert fgplugin.ops.padded_width(47, torch.float32, torch.device("cpu"), nnz=big) == 47


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_aggregate_padded_product_matches_the_unpadded_one(device, with_bias, monkeypatch):
    """The padded product (W with zero columns, cut by the bias add) gives the values and the
    gradients of A (X W) + b; on the CPU nothing pads, so the padding is forced here."""
    from fgplugin import aggregation
    from fgplugin.aggregation import Aggregation, aggregate

    case = random_graph_case(11, avg_degree=8.0)
    adj = case.adjacency().to(device)
    scales = adj.norm("gcn")
    g = torch.Generator().manual_seed(12)
    x = torch.randn(adj.shape[1], 9, generator=g).to(device).requires_grad_()
    w = torch.randn(9, 5, generator=g).to(device).requires_grad_()
    b = torch.randn(5, generator=g).to(device).requires_grad_() if with_bias else None
    upstream = torch.randn(adj.shape[0], 5, generator=g).to(device)
    leaves = [t for t in (x, w, b) if t is not None]

    def run(width):
        monkeypatch.setattr(aggregation, "padded_width", lambda features, dtype, device, nnz=None: width)
        out = aggregate(Aggregation(adj, scales), x, weight=w, bias=b)
        return out, torch.autograd.grad(out, leaves, upstream)

    want, want_grads = run(5)
    got, got_grads = run(8)
    assert got.shape == want.shape and got.is_contiguous()
    assert rel_error(got, want) <= 1e-6
    for a, e in zip(got_grads, want_grads):
        assert rel_error(a, e) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rows, cols, width", [(1000, 47, 48), (333, 5, 8), (77, 5, 7), (50, 16, 16), (0, 3, 8)])
def test_pad_columns_kernel(device, dtype, rows, cols, width):
    """[x, 0] exactly as torch.cat builds it: on CUDA whole 16-byte output rows (vector stores)
    and not."""
    x = torch.randn(rows, cols, device=device).to(dtype)
    x[::7] = float("nan")  # values move bit for bit, NaN included
    want = torch.cat([x, x.new_zeros(rows, width - cols)], dim=1)
    got = torch.ops.fgplugin.pad_columns(x, width)
    assert got.shape == want.shape and got.dtype == dtype and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    wide = torch.randn(rows, 2 * cols, device=device).to(dtype)[:, ::2]  # a non-contiguous input
    assert torch.equal(torch.ops.fgplugin.pad_columns(wide, width),
                       torch.cat([wide, wide.new_zeros(rows, width - cols)], dim=1))
    with pytest.raises(RuntimeError, match="width 2 is below x's"):
        torch.ops.fgplugin.pad_columns(torch.zeros(4, 3, device=device, dtype=dtype), 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_aggregates_in_16_bits_with_float32_scales(device, dtype):
    """Under torch.autocast a float32 x is aggregated in the autocast dtype (the kernels accumulate
    in float32; edge weights and scales stay float32): forward and backward against float64."""
    case = random_graph_case(21, n_src=300, avg_degree=8.0)
    adj = case.adjacency().to(device)
    scales = adj.norm("gcn")
    dense = case.dense()
    operator = torch.diag(scales[0].double().cpu()) @ (dense + torch.diag(scales[2].double().cpu())) \
        @ torch.diag(scales[1].double().cpu())
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 24, generator=g).to(device).requires_grad_()
    upstream = torch.randn(300, 24, generator=g)
    with torch.autocast(device, dtype=dtype):
        out = fgplugin.spmm(adj, x, *scales)
    assert out.dtype == dtype
    (grad,) = torch.autograd.grad(out, x, upstream.to(device, dtype))
    assert grad.dtype == torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    assert rel_error(out.float().cpu(), operator @ x.detach().double().cpu()) <= tol
    assert rel_error(grad.cpu(), operator.t() @ upstream.double()) <= tol


def test_learned_edge_values_in_another_dtype_train_step_after_step():
    """The op's adjacency arguments are kept on the adjacency after the first call, except edge
    values that need a gradient: their cast to the kernels' dtype (float64 -> float32 here) is part
    of each step's autograd graph. Two steps, each against a dense float64 product."""
    base = random_graph_case(3, n_src=30).adjacency()
    values = torch.rand(base.nnz, dtype=torch.float64, requires_grad=True)  # a leaf, in CSR order
    adj = TiledAdjacency.from_csr(base.rowptr, base.col, values, shape=base.shape)
    rows = torch.repeat_interleave(torch.arange(30), base.rowptr.diff())
    x = torch.randn(30, 5)
    for _ in range(2):
        out = fgplugin.spmm(adj, x)
        (grad,) = torch.autograd.grad(out.pow(2).sum(), values)
        ref_values = values.detach().clone().requires_grad_()
        dense = torch.zeros(30, 30, dtype=torch.float64).index_put((rows, base.col.long()), ref_values,
                                                                   accumulate=True)
        ref = dense @ x.double()
        (ref_grad,) = torch.autograd.grad(ref.pow(2).sum(), ref_values)
        assert rel_error(out, ref) < 1e-5
        assert rel_error(grad, ref_grad) < 1e-5


def test_eager_call_and_dispatcher_call_agree():
    """Eager ``fgplugin.spmm`` takes the op's autocast and autograd steps itself; under a torch
    dispatch mode (as tracing tools use) the call goes through the dispatcher. Both give the same
    output and gradients, with and without autocast, and the mode sees the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    adj = random_graph_case(4, n_src=40).adjacency()
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    for dtype in (None, torch.bfloat16):
        results = []
        for mode in (None, Seen()):
            x = torch.randn(40, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                if mode is None:
                    out = fgplugin.spmm(adj, x, r, c, d)
                else:
                    with mode:
                        out = fgplugin.spmm(adj, x, r, c, d)
                    assert any("fgplugin.spmm" in op for op in mode.ops), mode.ops
            out.float().sum().backward()
            results.append((out, x.grad))
        (out_a, grad_a), (out_b, grad_b) = results
        assert out_a.dtype == out_b.dtype == (dtype or torch.float32)
        assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)


def test_replacing_the_edge_values_is_refused():
    """What was built from the edge values would go on reading the old tensor: replacing it is an
    error that names the two ways that work."""
    adj = random_graph_case(9, n_src=30).adjacency()
    with pytest.raises(AttributeError, match=r"with_values\(new_weights\).*in place"):
        adj.values = torch.ones(adj.nnz)


def test_spmm_wrt_x_refuses_tangents_it_would_drop():
    """Called directly, spmm_wrt_x with a forward-mode tangent on a scale is the spmm op, which
    refuses forward mode, instead of its node (which records x and the bias alone)."""
    import torch.autograd.forward_ad as fwAD

    from fgplugin import ops

    adj, (r, c, d) = _small_gcn_case()
    x = torch.randn(30, 4, requires_grad=True)
    args, _ = ops.op_args(adj, x, r, c, d, True, "test")
    with fwAD.dual_level():
        dual_r = fwAD.make_dual(args.row_scale, torch.ones_like(args.row_scale))
        with pytest.raises((NotImplementedError, RuntimeError)):
            torch.ops.fgplugin.spmm_wrt_x.default(*args._replace(row_scale=dual_r))


@pytest.mark.parametrize("values_dtype", [torch.float32, torch.float64])
def test_an_in_place_write_to_the_edge_values_is_seen(values_dtype):
    """What an adjacency keeps from its edge values (their cast to the kernels' dtype, their
    transpose order, the GCN scales) is rebuilt after ``adj.values`` is written in place:
    forward, gradient and normalization all follow, never the old values."""
    base = random_graph_case(3, n_src=30).adjacency()
    values = torch.rand(base.nnz, dtype=values_dtype) + 0.5
    adj = TiledAdjacency.from_csr(base.rowptr, base.col, values, shape=base.shape)
    x = torch.randn(30, 4, requires_grad=True)
    scales = adj.norm("gcn", dtype=torch.float32)
    fgplugin.spmm(adj, x, *scales).sum().backward()  # fills the kept arguments
    adj.values.mul_(3.0).add_(1.0)
    rows = torch.repeat_interleave(torch.arange(30), base.rowptr.diff())
    dense = torch.zeros(30, 30, dtype=torch.float64).index_put((rows, base.col.long()), adj.values.double(),
                                                               accumulate=True)
    x.grad = None
    out = fgplugin.spmm(adj, x)
    out.backward(torch.ones_like(out))
    assert rel_error(out, dense @ x.double()) < 1e-6
    assert rel_error(x.grad, dense.t() @ torch.ones(30, 4, dtype=torch.float64)) < 1e-6
    assert all(not torch.equal(a, b) for a, b in zip(adj.norm("gcn", dtype=torch.float32)[:2], scales[:2]))


def test_product_needing_the_gradient_of_x_alone_has_a_cpp_autograd_node(monkeypatch):
    """Where only ``x`` needs a gradient and the zero-row skipping cannot apply, the product's
    autograd node is the extension's C++ one (``spmm_wrt_x``); its gradients, first and second,
    match the dense float64 reference. Any other case keeps the Python autograd function."""
    if not fgplugin.extension_status().loaded:
        pytest.skip("the C++ autograd node is the extension's; the reference path has the Python one alone")
    from fgplugin import grad_rows

    case = random_graph_case(7, n_src=50)
    adj = case.adjacency()
    g = torch.Generator().manual_seed(8)
    r, c, d = _scales(adj, "custom", g)
    r, c, d = r.double(), c.double(), d.double()
    x = torch.randn(50, 3, generator=g, dtype=torch.float64, requires_grad=True)
    out = fgplugin.spmm(adj, x, r, c, d)
    assert out.grad_fn.name().endswith("::SpmmWrtX>")  # torch::autograd::CppNode<...>
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64, requires_grad=True)
    (grad_x,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    dense = case.dense().double()
    assert rel_error(out, dense_spmm(dense, x.detach(), r, c, d)) <= 1e-12
    assert rel_error(grad_x, dense_spmm(dense.t(), grad_out.detach(), c, r, d)) <= 1e-12
    # second order: d<grad_x, v>/d grad_out = A-product of v (the adjoint's adjoint)
    v = torch.randn(grad_x.shape, generator=g, dtype=torch.float64)
    (second,) = torch.autograd.grad(grad_x, grad_out, v)
    assert rel_error(second, dense_spmm(dense, v, r, c, d)) <= 1e-12
    assert torch.autograd.gradcheck(lambda x: fgplugin.spmm(adj, x, r, c, d), (x,))
    assert torch.autograd.gradgradcheck(lambda x: fgplugin.spmm(adj, x, r, c, d), (x,))

    python_node = "_SpmmAutogradBackward"
    assert fgplugin.spmm(adj, x, r.requires_grad_(), c, d).grad_fn.name() == python_node
    r.requires_grad_(False)
    weighted = adj.with_values(torch.rand(case.edge_index.shape[1], dtype=torch.float64, requires_grad=True))
    assert fgplugin.spmm(weighted, x, r, c, d).grad_fn.name() == python_node
    monkeypatch.setitem(grad_rows.MIN_WORK, "cpu", 0)  # the zero-row skipping may apply now
    # (to calls decided from now on: adj's earlier call keeps its choice, fgplugin.repeated_calls)
    assert fgplugin.spmm(case.adjacency(), x, r, c, d).grad_fn.name() == python_node


def _python_node_only(monkeypatch):
    from fgplugin import ops
    monkeypatch.setattr(ops, "_wrt_x_alone", lambda args: False)


def _small_gcn_case():
    adj = random_graph_case(9, n_src=30).adjacency()
    return adj, adj.norm("gcn", dtype=torch.float32)


@pytest.mark.parametrize("create_graph", [False, True])
def test_backward_inside_autocast_is_the_same_on_either_autograd_node(monkeypatch, create_graph):
    """A float32 product whose backward runs inside an autocast region: the C++ node casts the
    output gradient as the op's autocast kernel does, so x's gradient is the Python node's."""
    adj, (r, c, d) = _small_gcn_case()
    g = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    grads = []
    for python_only in (False, True):
        if python_only:
            _python_node_only(monkeypatch)
        x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        out = fgplugin.spmm(adj, x, r, c, d)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (grad,) = torch.autograd.grad(out, x, g, create_graph=create_graph)
        grads.append(grad)
    assert torch.equal(grads[0], grads[1])
    assert rel_error(grads[0], dense_spmm(random_graph_case(9, n_src=30).dense().t(), g, c, r, d)) <= 2e-2


def test_spmm_wrt_x_called_directly_is_the_op_wherever_its_node_does_not_apply():
    """Called directly, ``spmm_wrt_x`` gives the spmm op's result and gradients also where other
    inputs need a gradient (then it is the op itself) or nothing does (no transpose needed)."""
    if not fgplugin.extension_status().loaded:
        pytest.skip("spmm_wrt_x is the extension's op")
    from fgplugin.ops import op_args
    adj, (r, c, d) = _small_gcn_case()
    results = []
    for op in (torch.ops.fgplugin.spmm_wrt_x.default, torch.ops.fgplugin.spmm.default):
        x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        rg = r.clone().requires_grad_()
        args, _ = op_args(adj, x, rg, c, d, True, "test")
        out = op(*args)
        out.backward(torch.ones_like(out))
        results.append((out, x.grad, rg.grad))
    for a, b in zip(*results):
        assert b is not None and torch.equal(a, b)
    plain, _ = op_args(adj, torch.randn(30, 4), r, c, d, False, "test")
    assert plain.t_rowptr is None
    assert torch.equal(torch.ops.fgplugin.spmm_wrt_x.default(*plain), torch.ops.fgplugin.spmm.default(*plain))


@pytest.mark.parametrize("python_only", [False, True])
def test_writing_to_x_after_the_product_is_no_error(monkeypatch, python_only):
    """x's gradient does not read x: neither autograd node saves it, so a later in-place write
    to it (an optimizer step on an embedding, a reused buffer) leaves the backward right."""
    if python_only:
        _python_node_only(monkeypatch)
    adj, (r, c, d) = _small_gcn_case()
    leaf = torch.randn(30, 4, requires_grad=True)
    h = leaf * 1
    out = fgplugin.spmm(adj, h, r, c, d)
    h.mul_(2)
    g = torch.randn(30, 4)
    out.backward(g)
    assert rel_error(leaf.grad, dense_spmm(random_graph_case(9, n_src=30).dense().t(), g, c, r, d)) <= 1e-5
    # the values' gradient does read x: there a write to x is still caught
    weighted = adj.with_values(torch.rand(random_graph_case(9, n_src=30).edge_index.shape[1], requires_grad=True))
    h = leaf * 1
    out = fgplugin.spmm(weighted, h, r, c, d)
    h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("reverse_too", [True, False])
def test_forward_mode_ad_raises_not_implemented_on_either_path(reverse_too):
    """With or without a reverse-mode gradient wanted too (without, the product would run below
    autograd and drop the tangent: a zero tangent, silently), in a dual level and under
    torch.func.jvp, warm or not."""
    import torch.autograd.forward_ad as fwAD
    adj, (r, c, d) = _small_gcn_case()
    x = torch.randn(30, 4, requires_grad=reverse_too)
    for _ in range(2):
        fgplugin.spmm(adj, x, r, c, d)  # what a kept call would serve
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward.mode"):
        fgplugin.spmm(adj, fwAD.make_dual(x, torch.ones_like(x)), r, c, d)
    if not reverse_too:
        with pytest.raises(NotImplementedError, match="forward.mode"):
            torch.func.jvp(lambda t: fgplugin.spmm(adj, t, r, c, d), (x,), (torch.ones_like(x),))


@pytest.mark.parametrize("other", ["row_scale", "col_scale", "diag"])
def test_gradcheck_x_with_each_scale_float64(other):
    """The Python node keeps x only for the gradients that read it: with each scale in turn."""
    adj = random_graph_case(10, n_src=25).adjacency()
    g = torch.Generator().manual_seed(4)
    scales = {name: torch.rand(25, generator=g, dtype=torch.float64).add_(0.5) for name in ("row_scale", "col_scale", "diag")}
    x = torch.randn(25, 3, generator=g, dtype=torch.float64, requires_grad=True)
    s = scales[other].requires_grad_()

    def f(x, s):
        return fgplugin.spmm(adj, x, **{**scales, other: s})

    assert torch.autograd.gradcheck(f, (x, s))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("node", ["cpp", "python"])
def test_bias_and_width_match_dense_reference(case, device, node, monkeypatch):
    """``spmm(..., bias=b, width=w)`` is the product's first ``w`` columns plus ``b``: the output
    and the gradients of ``x`` and ``b`` against the dense float64 reference, on either autograd
    node; ``width`` alone and ``bias`` alone too."""
    if node == "python":
        _python_node_only(monkeypatch)
    g = torch.Generator().manual_seed(3)
    adj = case.adjacency()
    r, c, d = _scales(adj, "custom", g)
    dense, n_dst, n_src = case.dense(), *case.shape
    on = lambda t: None if t is None else t.to(device)  # noqa: E731
    for width, with_bias in ((6, True), (9, True), (4, False), (9, False), (1, True)):
        x = torch.randn(n_src, 9, generator=g)
        b = torch.randn(width, generator=g) if with_bias else None
        leaves = [t.to(device).requires_grad_() for t in (x, b) if t is not None]
        out = fgplugin.spmm(adj.to(device), leaves[0], on(r), on(c), on(d), bias=leaves[1] if with_bias else None,
                            width=None if width == 9 else width)
        ref = dense_spmm(dense, x, r, c, d)[:, :width] + (0 if b is None else b.double())
        assert out.shape == (n_dst, width) and out.is_contiguous()
        assert rel_error(out, ref) <= 1e-5, (width, with_bias)
        grad_out = torch.randn(n_dst, width, generator=g)
        grads = torch.autograd.grad(out, leaves, grad_out.to(device))
        padded = torch.nn.functional.pad(grad_out, (0, 9 - width))
        assert rel_error(grads[0], dense_spmm(dense.t(), padded, c, r, d)) <= 1e-5, (width, with_bias)
        if with_bias:
            assert rel_error(grads[1], grad_out.double().sum(0)) <= 1e-5


@pytest.mark.parametrize("node", ["cpp", "python"])
def test_gradcheck_bias_width_and_scales_float64(node, monkeypatch):
    """First and second derivatives through the epilogue, with the scales needing gradients too."""
    if node == "python":
        _python_node_only(monkeypatch)
    case = random_graph_case(4, n_src=24)
    adj = case.adjacency()
    g = torch.Generator().manual_seed(5)
    r, c, d = (t.double() for t in _scales(adj, "custom", g))
    x = torch.randn(24, 6, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: fgplugin.spmm(adj, x, r, c, d, bias=b, width=4), (x, b))
    assert torch.autograd.gradgradcheck(lambda x, b: fgplugin.spmm(adj, x, r, c, d, bias=b, width=4), (x, b))
    rg = r.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, b, rg: fgplugin.spmm(adj, x, rg, c, d, bias=b, width=4), (x, b, rg))
    xd = x.detach()  # the bias alone needs a gradient
    assert torch.autograd.gradcheck(lambda b: fgplugin.spmm(adj, xd, r, c, d, bias=b, width=4), (b,))


def test_bias_and_width_errors_name_the_problem():
    adj = random_graph_case(6, n_src=20).adjacency()
    x = torch.randn(20, 6)
    for width in (7, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"width must be an int from 0 to 6 \(x's columns\)"):
            fgplugin.spmm(adj, x, width=width)
    with pytest.raises(ValueError, match="bias must be a 1-D tensor of length 4"):
        fgplugin.spmm(adj, x, bias=torch.zeros(6), width=4)
    with pytest.raises(ValueError, match="bias must be a 1-D tensor of length 6"):
        fgplugin.spmm(adj, x, bias=torch.zeros(2, 3))
    for name in ("row_scale", "col_scale", "diag", "bias"):  # a cast to the real dtype would drop the imaginary part
        with pytest.raises(ValueError, match=f"{name} is torch.complex64; fgplugin computes with real numbers"):
            fgplugin.spmm(adj, x, **{name: torch.ones(20 if name != "bias" else 6, dtype=torch.complex64)})
    if fgplugin.extension_status().loaded:  # the op's own checks, for callers that bypass fgplugin.spmm
        with pytest.raises(RuntimeError, match="width must be -1"):
            torch.ops.fgplugin.spmm(adj.rowptr, adj.col, None, x, None, None, None, None, [], None, None, None, None,
                                    [], None, 9)
        with pytest.raises(RuntimeError, match="bias must be a 1-D tensor with 6 entries"):
            torch.ops.fgplugin.spmm(adj.rowptr, adj.col, None, x, None, None, None, None, [], None, None, None, None,
                                    [], torch.zeros(5), -1)


def test_bias_under_torch_compile_keeps_a_dynamic_feature_width():
    """With a bias and nothing to cut the op gets ``width=-1``, not the features' count: a model
    compiled with dynamic shapes is traced once for every width, as without the bias."""
    case = random_graph_case(13, n_src=50)
    adj = case.adjacency()
    torch._dynamo.reset()
    frames = []
    compiled = torch.compile(lambda x, b: fgplugin.spmm(adj, x, bias=b), dynamic=True, fullgraph=True,
                             backend=lambda gm, inputs: frames.append(gm) or gm.forward)
    for features in (8, 9, 10):
        x, b = torch.randn(50, features), torch.randn(features)
        assert rel_error(compiled(x, b), dense_spmm(case.dense(), x) + b.double()) <= 1e-5
    assert len(frames) <= 2  # the first call may be traced with static shapes, the rest share one graph

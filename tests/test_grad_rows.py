"""fgplugin.grad_rows: the backward product leaves out the zero rows of its output gradient, with
the answer of the full product (float64 dense reference), and falls back to the full product
wherever skipping would be wrong or slow."""
import gc
import weakref

import pytest
import torch

import fgplugin
from fgplugin import grad_rows
from fgplugin.testing import clustered_case, dense_spmm, random_graph_case, rel_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = 1e-5


@pytest.fixture(autouse=True)
def skipping_on(monkeypatch):
    """Skipping on, also for the small products of these tests (test_small_products_run_in_full
    checks the size threshold itself)."""
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": 0, "cpu": 0})
    previous = fgplugin.set_row_skipping(True)
    yield
    fgplugin.set_row_skipping(previous)


def case_and_adj(device, weighted=False, seed=0):
    case = clustered_case(seed, weighted=weighted) if weighted else random_graph_case(seed, avg_degree=12.0)
    return case, case.adjacency().to(device)


def row_sparse(n, features, live_fraction, seed, device):
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(n, features, generator=g, dtype=torch.float64)
    live = torch.rand(n, generator=g) < live_fraction
    grad[~live] = 0
    return grad.float().to(device), live


def x_grad(adj, grad, norm=True, create_graph=False):
    x = torch.randn(adj.shape[1], grad.shape[1], device=grad.device, requires_grad=True)
    scales = adj.norm("gcn") if norm else ()
    out = fgplugin.spmm(adj, x, *scales)
    return torch.autograd.grad(out, x, grad, create_graph=create_graph)[0], scales


def reference(case, adj, grad, scales):
    """float64 grad_x = diag(c) (A^T + diag(d)) diag(r) G."""
    r, c, d = scales if scales else (None, None, None)
    return dense_spmm(case.dense().T, grad.double(), c, r, d)


def counting_host_checks(monkeypatch) -> list:
    """Counts the calls of restrict_to_live_rows, the path that looks at the gradient's rows on the host."""
    calls = []
    restrict = grad_rows.restrict_to_live_rows
    monkeypatch.setattr(grad_rows, "restrict_to_live_rows", lambda *args: calls.append(1) or restrict(*args))
    return calls


def transposed_col(adj):
    return adj.transpose()[1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("features", [5, 16, 47])
def test_row_sparse_gradient_matches_reference_and_is_reused(device, weighted, features):
    case, adj = case_and_adj(device, weighted)
    grad, live = row_sparse(adj.shape[0], features, 0.1, seed=features, device=device)
    first, scales = x_grad(adj, grad)
    second, _ = x_grad(adj, grad)
    ref = reference(case, adj, grad, scales)
    assert rel_error(first, ref) <= TOL and rel_error(second, ref) <= TOL
    stats = grad_rows.stats(transposed_col(adj))
    assert stats["builds"] == 1 and stats["hits"] == 1
    assert stats["live_rows"] == int(live.sum())


@pytest.mark.parametrize("device", DEVICES)
def test_same_as_full_product(device):
    case, adj = case_and_adj(device)
    grad, _ = row_sparse(adj.shape[0], 16, 0.1, seed=1, device=device)
    skipped, _ = x_grad(adj, grad)
    fgplugin.set_row_skipping(False)
    full, _ = x_grad(adj, grad)
    assert rel_error(skipped, full) <= TOL


@pytest.mark.parametrize("device", DEVICES)
def test_new_rows_rebuild_then_give_up(device):
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    for call in range(grad_rows.MAX_MISSES + 2):
        grad, _ = row_sparse(n, 8, 0.1, seed=100 + call, device=device)  # other rows every call
        out, scales = x_grad(adj, grad, norm=False)
        assert rel_error(out, reference(case, adj, grad, scales)) <= TOL
    stats = grad_rows.stats(transposed_col(adj))
    assert stats["builds"] == grad_rows.MAX_MISSES + 1  # the first set, then MAX_MISSES new ones
    assert stats["misses"] == grad_rows.MAX_MISSES


@pytest.mark.parametrize("device", DEVICES)
def test_layers_sharing_a_graph_keep_a_restriction_each(device):
    """Two backward products per step on one graph with different live rows (the last two layers
    of a 3-layer GCN: the loss rows, then their neighbours): each keeps its restriction, so after
    the first step every call is a hit instead of a rebuild that soon turns the skipping off; the
    least recently used goes once MAX_KEPT sets are kept."""
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    layer_grads = [row_sparse(n, width, 0.1, seed=200 + width, device=device)[0] for width in (8, 16)]
    for step in range(4):
        for grad in layer_grads:
            out, scales = x_grad(adj, grad, norm=False)
            assert rel_error(out, reference(case, adj, grad, scales)) <= TOL
    stats = grad_rows.stats(transposed_col(adj))
    # step 0 builds, step 1 matches on the host (settling both widths), steps 2-3 use them unchecked
    assert (stats["builds"], stats["hits"], stats["unchecked"], stats["misses"], stats["kept"]) == (2, 2, 4, 0, 2)
    others = [row_sparse(n, 8, 0.1, seed=300 + i, device=device)[0] for i in range(grad_rows.MAX_KEPT - 1)]
    for grad in others:  # fills the kept list; the first layer's set is now the oldest ...
        x_grad(adj, grad, norm=False)
    x_grad(adj, layer_grads[1], norm=False)  # (a hit: the second is younger)
    x_grad(adj, others[0], norm=False)
    assert grad_rows.stats(transposed_col(adj))["kept"] == grad_rows.MAX_KEPT
    builds = grad_rows.stats(transposed_col(adj))["builds"]
    x_grad(adj, layer_grads[0], norm=False)  # ... and was evicted: rebuilt
    assert grad_rows.stats(transposed_col(adj))["builds"] == builds + 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_restriction_unused_for_a_while_is_dropped(device):
    """The first step's first-layer gradient (before the input cache holds that layer's
    aggregation) is not seen again: its restriction goes after STALE_USES products without it."""
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    last_layer, first_layer = (row_sparse(n, width, 0.1, seed=400 + width, device=device)[0] for width in (8, 16))
    x_grad(adj, last_layer, norm=False)
    x_grad(adj, first_layer, norm=False)
    assert grad_rows.stats(transposed_col(adj))["kept"] == 2
    for _ in range(grad_rows.STALE_USES):
        x_grad(adj, last_layer, norm=False)
    stats = grad_rows.stats(transposed_col(adj))
    assert (stats["kept"], stats["builds"], stats["hits"] + stats["unchecked"]) == (1, 2, grad_rows.STALE_USES)


@pytest.mark.parametrize("device", DEVICES)
def test_edge_weights_changed_after_the_build_are_used(device):
    case, adj = case_and_adj(device, weighted=True)
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=2, device=device)
    x_grad(adj, grad, norm=False)
    new_weights = torch.rand(case.edge_index.shape[1], generator=torch.Generator().manual_seed(3)) + 0.5
    reweighted = adj.with_values(new_weights.to(device))
    out, _ = x_grad(reweighted, grad, norm=False)
    ref_case = type(case)(case.name, case.edge_index, case.num_nodes, case.size, new_weights)
    assert rel_error(out, reference(ref_case, reweighted, grad, None)) <= TOL
    assert grad_rows.stats(transposed_col(adj))["hits"] == 1  # the same rows: the structure was reused


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("live_fraction", [0.9, 1.0])
def test_dense_gradient_runs_the_full_product(device, live_fraction):
    case, adj = case_and_adj(device)
    grad, _ = row_sparse(adj.shape[0], 8, live_fraction, seed=4, device=device)
    out, scales = x_grad(adj, grad)
    assert rel_error(out, reference(case, adj, grad, scales)) <= TOL
    assert grad_rows.stats(transposed_col(adj))["builds"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_switched_off_runs_the_full_product(device):
    _, adj = case_and_adj(device)
    fgplugin.set_row_skipping(False)
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=5, device=device)
    x_grad(adj, grad)
    assert grad_rows.stats(transposed_col(adj))["builds"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_sees_every_row(device):
    """With create_graph=True the gradient of grad_x with respect to G's zero rows is needed too."""
    case, adj = case_and_adj(device)
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=6, device=device)
    grad.requires_grad_(True)
    gx, _ = x_grad(adj, grad, norm=False, create_graph=True)
    weights = torch.randn_like(gx)
    (gg,) = torch.autograd.grad(gx, grad, weights)
    ref = dense_spmm(case.dense(), weights.double())  # d<A^T G, W>/dG = A W on every row
    assert rel_error(gg, ref) <= TOL
    assert grad_rows.stats(transposed_col(adj))["builds"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_nan_rows_count_as_non_zero(device):
    """A NaN in an otherwise zero row reaches that row's neighbours, as in the full product.
    (The full product may spread it further: 0 * NaN in a dense tile, or in a dense reference.)"""
    case, adj = case_and_adj(device)
    grad, live = row_sparse(adj.shape[0], 8, 0.1, seed=7, device=device)
    dead = int((~live).nonzero()[0])
    grad[dead, 3] = float("nan")
    skipped, _ = x_grad(adj, grad, norm=False)
    fgplugin.set_row_skipping(False)
    full, _ = x_grad(adj, grad, norm=False)
    neighbours = case.dense()[dead] != 0  # grad_x[j] sums A[dead, j] * grad[dead]
    assert neighbours.any()
    assert skipped[neighbours.to(device), 3].isnan().all()
    assert not (skipped.isnan() & ~full.isnan()).any()


def test_structure_freed_frees_its_restriction():
    _, adj = case_and_adj("cpu")
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=8, device="cpu")
    x_grad(adj, grad)
    restriction = weakref.ref(grad_rows._restrictions[transposed_col(adj)])
    del adj
    gc.collect()
    assert restriction() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the nonzero_rows kernel is CUDA-only; no GPU here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("features", [1, 3, 8, 47, 48, 128])
def test_nonzero_rows_kernel(dtype, features):
    g = torch.Generator().manual_seed(features)
    x = torch.randn(3000, features, generator=g).to(dtype)
    x[torch.rand(3000, generator=g) < 0.8] = 0
    x[10] = -0.0  # a row of negative zeros is a zero row
    x[11, -1] = float("nan")
    x[12, 0] = float("-inf")
    x[13, -1] = torch.finfo(dtype).tiny  # the smallest normal number is not zero
    x = x.cuda()
    want = x.cpu().double().abs().amax(dim=1) != 0
    got = torch.ops.fgplugin.nonzero_rows.default(x)
    assert got.dtype == torch.bool and torch.equal(got.cpu(), want)
    assert not got[10] and got[11] and got[12] and got[13]
    strided = torch.ops.fgplugin.nonzero_rows.default(x[::2])  # a non-contiguous input
    assert torch.equal(strided.cpu(), want[::2])
    offset = torch.ops.fgplugin.nonzero_rows.default(x.view(-1)[1:1 + 2999 * features].view(2999, features))
    assert torch.equal(offset.cpu(), x.view(-1)[1:1 + 2999 * features].view(2999, features).cpu().double().abs()
                       .amax(dim=1) != 0)  # misaligned rows take the element-wise kernel


@pytest.mark.parametrize("device", DEVICES)
def test_dense_gradient_after_a_hit_of_the_same_width(device):
    """A gradient as wide as the kept one skips the sample; a dense one must still run in full."""
    case, adj = case_and_adj(device)
    sparse, _ = row_sparse(adj.shape[0], 8, 0.1, seed=9, device=device)
    x_grad(adj, sparse, norm=False)
    dense, _ = row_sparse(adj.shape[0], 8, 1.0, seed=10, device=device)
    out, _ = x_grad(adj, dense, norm=False)
    assert rel_error(out, reference(case, adj, dense, None)) <= TOL
    assert grad_rows.stats(transposed_col(adj))["builds"] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_small_products_run_in_full(device, monkeypatch):
    case, adj = case_and_adj(device)
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=13, device=device)
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": adj.nnz * 8 + 1, "cpu": adj.nnz * 8 + 1})
    out, _ = x_grad(adj, grad, norm=False)
    assert rel_error(out, reference(case, adj, grad, None)) <= TOL
    assert grad_rows.stats(transposed_col(adj))["builds"] == 0


def test_build_time_is_counted():
    _, adj = case_and_adj("cpu")
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=14, device="cpu")
    before = grad_rows.total_build_s()
    x_grad(adj, grad)
    spent = grad_rows.stats(transposed_col(adj))["build_s"]
    assert spent > 0 and grad_rows.total_build_s() == pytest.approx(before + spent)


@pytest.mark.parametrize("device", DEVICES)
def test_int64_indices(device):
    case = random_graph_case(15, avg_degree=12.0, weighted=True)
    adj = case.adjacency(index_dtype=torch.int64).to(device)
    assert adj.col.dtype == torch.int64
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=16, device=device)
    out, scales = x_grad(adj, grad)
    assert rel_error(out, reference(case, adj, grad, scales)) <= TOL
    assert grad_rows.stats(transposed_col(adj))["builds"] == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("features", [5, 47])
def test_spmm_skipping_zero_rows_is_the_forward_product(device, weighted, features):
    """``fgplugin.ops.spmm_skipping_zero_rows`` (the distributed backward's products): A x for an
    x with zero rows, deciding itself (live=None) or told the live rows, equals the float64
    product; the restriction is kept per structure and reused. Like a backward pass, it runs
    without autograd recording (with it, the product runs in full: its gradient needs every row)."""
    from fgplugin.ops import spmm_skipping_zero_rows

    case, adj = case_and_adj(device, weighted, seed=3)
    x, live = row_sparse(adj.shape[1], features, 0.1, seed=features, device=device)
    r, c, d = adj.norm("gcn")
    ref = dense_spmm(case.dense(), x.double(), r, c, d)
    spmm_skipping_zero_rows(adj, x, r, c, d)  # grad mode on: the full product
    assert grad_rows.stats(adj.col)["builds"] == 0
    with torch.no_grad():
        decided = spmm_skipping_zero_rows(adj, x, r, c, d)
        told = spmm_skipping_zero_rows(adj, x, r, c, d, live=live.to(device))
    assert decided.shape == told.shape == (adj.shape[0], features)
    assert rel_error(decided, ref) <= TOL and rel_error(told, ref) <= TOL
    stats = grad_rows.stats(adj.col)
    assert stats["builds"] == 1 and stats["hits"] == 1 and stats["live_rows"] == int(live.sum())
    # A dense x is multiplied in full (no restriction is built for it).
    dense_x = torch.randn_like(x)
    with torch.no_grad():
        full = spmm_skipping_zero_rows(adj, dense_x, r, c, d)
    assert rel_error(full, dense_spmm(case.dense(), dense_x.double(), r, c, d)) <= TOL
    assert grad_rows.stats(adj.col)["builds"] == 1


def test_skipping_applies_to_a_product_with_an_epilogue(monkeypatch):
    """A cut product with a bias (a layer's last aggregation) whose output gradient lives on a few
    rows: the backward runs the restricted product, with the gradient padded back to full width,
    and matches the float64 reference."""
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": 0, "cpu": 0})
    case = random_graph_case(31, n_src=300, avg_degree=5.0)
    adj = case.adjacency()
    r, c, d = adj.norm("gcn")
    restricted = counting_host_checks(monkeypatch)
    g = torch.Generator().manual_seed(32)
    x = torch.randn(300, 8, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    out = fgplugin.spmm(adj, x, r, c, d, bias=b, width=7)
    upstream = torch.zeros(300, 7, dtype=torch.float64)
    upstream[::20] = torch.randn(15, 7, generator=g, dtype=torch.float64)
    grad_x, grad_b = torch.autograd.grad(out, (x, b), upstream)
    assert restricted, "the zero-row skipping did not run"
    padded = torch.nn.functional.pad(upstream, (0, 1))
    assert rel_error(grad_x, dense_spmm(case.dense().t(), padded, c, r, d)) <= 1e-10
    assert rel_error(grad_b, upstream.sum(0)) <= 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_if_writes_the_product_only_when_its_flag_is_set(device, weighted):
    """The op of a captured product's fallback: the full product into ``out`` when the flag on
    the device holds, ``out`` untouched otherwise; bad flags and outputs are refused by name."""
    from fgplugin import ops
    case, adj = case_and_adj(device, weighted)
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    x = torch.randn(adj.shape[1], 24, device=device)
    rowptr, col, values = ops._adjacency_args(adj, torch.float32, False)[:3]
    untouched = torch.full((adj.shape[0], 24), 7.0, device=device)
    from fgplugin.reference import spmm_if_reference  # what runs without the compiled kernels
    for op in (torch.ops.fgplugin.spmm_if, spmm_if_reference):
        for flag in (False, True):
            out = untouched.clone()
            op(torch.tensor(flag, device=device), rowptr, col, values, x, r, c, d, out)
            if flag:
                assert rel_error(out, dense_spmm(case.dense(), x.double(), r, c, d)) <= TOL
            else:
                assert torch.equal(out, untouched)
    with pytest.raises(RuntimeError, match="flag must be one bool"):
        torch.ops.fgplugin.spmm_if(torch.tensor(1, device=device), rowptr, col, values, x, r, c, d, out)
    flag = torch.tensor(True, device=device)
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        torch.ops.fgplugin.spmm_if(flag, rowptr, col, values, x, r, c, d, out[:5])  # shape
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        torch.ops.fgplugin.spmm_if(flag, rowptr, col, values, x, r, c, d, out.t().contiguous().t())  # layout
    with pytest.raises(RuntimeError, match="out shares memory with x"):
        square = torch.randn(adj.shape[0], adj.shape[0], device=device)
        torch.ops.fgplugin.spmm_if(flag, rowptr, col, values, square, r, c, d, square)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="flag must be one bool on x's device"):
            torch.ops.fgplugin.spmm_if(torch.tensor(True), rowptr, col, values, x, r, c, d, out)


@pytest.mark.parametrize("device", DEVICES)
def test_a_captured_product_gets_the_warm_up_restriction_with_its_guard(device):
    """captured_restriction (called while graphed_step captures; here directly) hands out the
    restriction used at the gradient's width, held by the collection in progress, with a flag set
    when the gradient has a non-zero row outside it; none without a collection, at a width never
    restricted, or at a width recently seen with a dense gradient."""
    from fgplugin import capture_holds, ops
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    grad, live = row_sparse(n, 8, 0.1, seed=22, device=device)
    x_grad(adj, grad, norm=False)
    t_rowptr, t_col, t_values, t_plan = ops._adjacency_args(adj, torch.float32, True)[5:9]

    def captured(g):
        return grad_rows.captured_restriction(t_rowptr, t_col, t_values, g, t_plan is not None)

    with torch.no_grad():
        assert captured(grad) is None  # nothing would hold what the graph reads
        with capture_holds.collecting([]) as holds:
            found = captured(grad)
        assert found is not None and not bool(found[4])
        assert any(held.rowptr is found[0] for held in holds if isinstance(held, grad_rows._Kept))
        out = ops.csr_product(*found[:3], grad, None, None, None, found[3])
        assert rel_error(out, reference(case, adj, grad, None)) <= TOL
        with capture_holds.collecting([]):
            subset = grad.clone()
            subset[live.nonzero()[0]] = 0  # fewer live rows: still inside
            assert not bool(captured(subset)[4])
            outside = grad.clone()
            outside[(~live).nonzero()[0]] = 1.0
            assert bool(captured(outside)[4])
            assert captured(torch.zeros(n, 16, device=device)) is None  # no restriction at this width
    dense, _ = row_sparse(n, 8, 1.0, seed=23, device=device)
    x_grad(adj, dense, norm=False)  # a dense gradient of the same width: another layer may share it
    with torch.no_grad(), capture_holds.collecting([]):
        assert captured(grad) is None


@pytest.mark.parametrize("device", DEVICES)
def test_two_restrictions_of_one_width_are_not_handed_to_a_capture(device):
    """Two layers of one width whose gradients have different rows: which restriction is whose is
    not known while capturing, so neither is handed out."""
    from fgplugin import capture_holds, ops
    _, adj = case_and_adj(device)
    n = adj.shape[0]
    first, _ = row_sparse(n, 8, 0.1, seed=24, device=device)
    second, _ = row_sparse(n, 8, 0.1, seed=25, device=device)
    x_grad(adj, first, norm=False)
    x_grad(adj, second, norm=False)
    assert grad_rows.stats(transposed_col(adj))["kept"] == 2
    t_rowptr, t_col, t_values, t_plan = ops._adjacency_args(adj, torch.float32, True)[5:9]
    with torch.no_grad(), capture_holds.collecting([]):
        assert grad_rows.captured_restriction(t_rowptr, t_col, t_values, first, t_plan is not None) is None


def test_holds_go_to_this_threads_collection_and_nest():
    """Outside a CUDA graph capture a hold from another thread reaches no collection of this
    one; the same list may be collected into twice, nested."""
    import threading
    from fgplugin import capture_holds
    marker, inner = object(), object()
    with capture_holds.collecting([]) as held:
        thread = threading.Thread(target=capture_holds.hold, args=(marker,))
        thread.start()
        thread.join()
        with capture_holds.collecting(held):
            capture_holds.hold(inner)
        capture_holds.hold(inner)
    assert not any(h is marker for h in held) and sum(h is inner for h in held) == 2
    assert capture_holds.collection() is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_settled_width_skips_the_host_check(device, monkeypatch):
    """A gradient found with the same rows on two host checks in a row (the build and a match)
    settles its width: later products of that width use the restriction unchecked, with the
    reference's answer, counted as unchecked uses (not hits)."""
    case, adj = case_and_adj(device)
    grad, live = row_sparse(adj.shape[0], 8, 0.1, seed=40, device=device)
    host_checks = counting_host_checks(monkeypatch)
    for call in range(5):
        out, _ = x_grad(adj, grad, norm=False)
        assert rel_error(out, reference(case, adj, grad, None)) <= TOL
    assert len(host_checks) == 2  # the build, then the match that settles
    stats = grad_rows.stats(transposed_col(adj))
    assert (stats["builds"], stats["hits"], stats["unchecked"], stats["live_rows"]) == (1, 1, 3, int(live.sum()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("change", ["outside", "subset", "dense"])
def test_rows_changed_after_settling_give_the_full_answer_then_a_host_check(device, change, monkeypatch):
    """After the width settled, a gradient with other rows (some outside the restriction, only a
    subset of its rows, or all rows) is still multiplied right (rows outside: the full product
    too, by its device flag); the next call reads the late flag and looks on the host again,
    which rebuilds for the new rows (or, for a dense gradient, runs the full product)."""
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    settled, live = row_sparse(n, 8, 0.1, seed=41, device=device)
    for _ in range(3):
        x_grad(adj, settled, norm=False)
    if change == "outside":
        other, _ = row_sparse(n, 8, 0.1, seed=42, device=device)
    elif change == "subset":
        other = settled.clone()
        other[live.nonzero()[:3, 0].to(device)] = 0
    else:
        other, _ = row_sparse(n, 8, 1.0, seed=42, device=device)
    host_checks = counting_host_checks(monkeypatch)
    for call in range(3):
        out, _ = x_grad(adj, other, norm=False)
        assert rel_error(out, reference(case, adj, other, None)) <= TOL, call
    assert len(host_checks) >= 1  # the late flag sent a call to the host check
    stats = grad_rows.stats(transposed_col(adj))
    assert stats["builds"] == (1 if change == "dense" else 2)
    out, _ = x_grad(adj, settled, norm=False)  # the first rows again: right, whichever restriction runs
    assert rel_error(out, reference(case, adj, settled, None)) <= TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a host sync is a CUDA notion; no GPU here")
def test_a_settled_product_does_not_sync_the_host():
    """The settled path's backward product runs under torch.cuda.set_sync_debug_mode("error")."""
    case, adj = case_and_adj("cuda")
    grad, _ = row_sparse(adj.shape[0], 8, 0.1, seed=43, device="cuda")
    x = torch.randn(adj.shape[1], 8, device="cuda", requires_grad=True)
    for _ in range(3):
        out = fgplugin.spmm(adj, x)
        out.backward(grad)
    out = fgplugin.spmm(adj, x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out.backward(grad)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rel_error(x.grad / 4, reference(case, adj, grad, None)) <= TOL


@pytest.mark.parametrize("device", DEVICES)
def test_two_row_sets_taking_turns_at_one_width_get_a_restriction_each(device, monkeypatch):
    """After a width settled on rows A, rows B and A taking turns at that width (another
    row-sparse product appearing later) end with a restriction each, both host-checked, as
    before the settled path: B is not left to run restricted to A plus the full product."""
    case, adj = case_and_adj(device)
    n = adj.shape[0]
    a, _ = row_sparse(n, 8, 0.1, seed=46, device=device)
    b, _ = row_sparse(n, 8, 0.1, seed=47, device=device)
    for _ in range(3):
        x_grad(adj, a, norm=False)
    full_products = []
    spmm_if = torch.ops.fgplugin.spmm_if.default
    monkeypatch.setattr(torch.ops.fgplugin.spmm_if, "default",
                        lambda flag, *args: full_products.append(args[3].shape[1] > 0 and bool(flag)) or
                        spmm_if(flag, *args))  # (a call on no columns only checks the CSR: see _check_full_product)
    for _ in range(6):
        for grad in (b, a):
            out, _ = x_grad(adj, grad, norm=False)
            assert rel_error(out, reference(case, adj, grad, None)) <= TOL
    stats = grad_rows.stats(transposed_col(adj))
    assert stats["builds"] == 2 and stats["kept"] == 2
    assert sum(full_products) <= 2  # B ran in full at most until the late flag was read

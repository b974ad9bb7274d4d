"""fgplugin.sparse_input: a layer's constant, mostly-zero input kept as a sparse matrix gives the
stock layers' outputs and training, and is used only where it applies (and, on "auto", pays)."""
import threading

import pytest
import torch

pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402

import fgplugin  # noqa: E402
import fgplugin.pyg as fp  # noqa: E402
from fgplugin import autotune, input_cache, sparse_input  # noqa: E402
from fgplugin.reference import spmm_reference  # noqa: E402
from fgplugin.sparse_input import SparseInput  # noqa: E402
from fgplugin.testing import rel_error  # noqa: E402

TOL = 1e-5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def cache_on():
    previous = fgplugin.set_input_cache(True), fgplugin.set_sparse_input("auto")
    yield
    fgplugin.set_input_cache(previous[0])
    fgplugin.set_sparse_input(previous[1])


def bag_of_words(n, features, density, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, features, generator=g) < density
    return (mask * torch.rand(n, features, generator=g)).to(dtype)


def graph(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g)


MODELS = {
    "gcn": lambda lib, f: (lib.GCNConv(f, 16), lib.GCNConv(16, 5)),
    "sg": lambda lib, f: (lib.SGConv(f, 16, K=2), lib.SGConv(16, 5, K=2)),
    "sage": lambda lib, f: (lib.SAGEConv(f, 16), lib.SAGEConv(16, 5)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", MODELS)
def test_training_matches_stock(model, device, fresh_seed):
    """Forced on, the first layer keeps x as a SparseInput from its second call; six SGD steps
    give the stock layers' outputs and weights (SGD: Adam's normalized steps would amplify the
    float rounding in which the two orders of summation differ into the weights' low bits)."""
    fgplugin.set_sparse_input("1")
    n, features = 90, 120
    x, ei = bag_of_words(n, features, 0.03, fresh_seed).to(device), graph(n, 500, fresh_seed).to(device)
    torch.manual_seed(fresh_seed)
    stock = torch.nn.ModuleList(MODELS[model](pyg_nn, features)).to(device)
    ours = torch.nn.ModuleList(MODELS[model](fp, features)).to(device)
    ours.load_state_dict(stock.state_dict())
    target = torch.randn(n, 5, generator=torch.Generator().manual_seed(fresh_seed)).to(device)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (stock, ours)]
    for step in range(6):
        outs = [m[1](m[0](x, ei).relu(), ei) for m in (stock, ours)]
        assert rel_error(outs[1], outs[0]) < TOL, (step, fresh_seed)
        for opt, out in zip(optimizers, outs):
            opt.zero_grad()
            ((out - target) ** 2).mean().backward()
            opt.step()
    assert isinstance(input_cache.of(ours[0]).value, SparseInput)
    for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
        assert rel_error(p_o, p_s) < TOL, (name, fresh_seed)


def test_dgl_graph_conv_matches_stock():
    """DGL's GraphConv goes through the same aggregation: with x kept sparse (forced), six SGD
    steps of a two-layer model give stock DGL's outputs and weights."""
    from conftest import require_dgl

    dgl = require_dgl()
    import dgl.nn as dgl_nn
    import fgplugin.dgl as fd

    fgplugin.set_sparse_input("1")
    n, features = 80, 150
    x, (src, dst) = bag_of_words(n, features, 0.03, 5), graph(n, 400, 5)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))
    torch.manual_seed(5)
    stock = torch.nn.ModuleList([dgl_nn.GraphConv(features, 16), dgl_nn.GraphConv(16, 4)])
    ours = torch.nn.ModuleList([fd.GraphConv(features, 16), fd.GraphConv(16, 4)])
    ours.load_state_dict(stock.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (stock, ours)]
    for step in range(6):
        outs = [m[1](g, m[0](g, x).relu()) for m in (stock, ours)]
        assert rel_error(outs[1], outs[0]) < TOL, step
        for opt, out in zip(optimizers, outs):
            opt.zero_grad()
            out.square().mean().backward()
            opt.step()
    assert isinstance(input_cache.of(ours[0]).value, SparseInput)
    for p_s, p_o in zip(stock.parameters(), ours.parameters()):
        assert rel_error(p_o, p_s) < TOL


@pytest.mark.parametrize("library", ["pyg", "dgl"])
def test_sage_root_weight_uses_the_sparse_input(library, monkeypatch):
    """SAGE's root weight multiplies the same constant input: with it kept sparse, both of the
    layer's products with x run on the SpMM (two SparseInput products per call, no GEMM over x),
    and the outputs and gradients are the stock layer's."""
    fgplugin.set_sparse_input("1")
    n, features = 90, 140
    x, ei = bag_of_words(n, features, 0.03, 8), graph(n, 450, 8)
    torch.manual_seed(8)
    if library == "pyg":
        stock, ours = pyg_nn.SAGEConv(features, 8), fp.SAGEConv(features, 8)
        call = lambda layer: layer(x, ei)  # noqa: E731
    else:
        from conftest import require_dgl

        dgl = require_dgl()
        import dgl.nn as dgl_nn
        import fgplugin.dgl as fd

        g = dgl.graph((ei[0], ei[1]), num_nodes=n)
        stock, ours = dgl_nn.SAGEConv(features, 8, "mean"), fd.SAGEConv(features, 8, "mean")
        call = lambda layer: layer(g, x)  # noqa: E731
    ours.load_state_dict(stock.state_dict())
    products, matmul = [], SparseInput.__matmul__
    monkeypatch.setattr(SparseInput, "__matmul__", lambda self, w: products.append(w.shape) or matmul(self, w))
    for _ in range(2):
        call(ours)
    products.clear()
    out = call(ours)
    assert len(products) == 2 and isinstance(input_cache.of(ours).value, SparseInput)
    expected = call(stock)
    assert rel_error(out, expected) < TOL
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
        assert rel_error(p_o.grad, p_s.grad) < TOL, name


def test_compiled_sage_does_not_reuse_a_stale_sparse_form():
    """Under torch.compile the layers keep nothing (fgplugin.input_cache); SAGE's root weight must
    not read what eager calls kept either: after an in-place write to x, and once x needs a
    gradient, the compiled layer still gives the stock layer's output and x's gradient."""
    fgplugin.set_sparse_input("1")
    n, features = 80, 120
    x, ei = bag_of_words(n, features, 0.03, 9), graph(n, 400, 9)
    torch.manual_seed(9)
    stock, ours = pyg_nn.SAGEConv(features, 8), fp.SAGEConv(features, 8)
    ours.load_state_dict(stock.state_dict())
    for _ in range(3):
        ours(x, ei)
    assert isinstance(input_cache.of(ours).value, SparseInput)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="aot_eager")
    assert rel_error(compiled(x, ei), stock(x, ei)) < TOL
    with torch.no_grad():
        x.mul_(2.0)
        x[0, 0] = 5.0
    assert rel_error(compiled(x, ei), stock(x, ei)) < TOL
    x_ours, x_stock = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(x_ours, ei).square().sum().backward()
    stock(x_stock, ei).square().sum().backward()
    assert rel_error(x_ours.grad, x_stock.grad) < TOL
    torch._dynamo.reset()


def test_probe_times_the_dense_form_on_the_aggregated_shape(monkeypatch):
    """The dense form multiplies A^K x, one row per target node: on a bipartite graph with far more
    sources than targets the probe's GEMMs have the targets' row count, not x's."""
    n_src, n_dst, features = 400, 40, 300
    x = bag_of_words(n_src, features, 0.01, 10)
    g = torch.Generator().manual_seed(10)
    ei = torch.stack([torch.randint(0, n_src, (800,), generator=g), torch.randint(0, n_dst, (800,), generator=g)])
    aggregation = fp.SAGEConv((features, features), 8)._aggregation((x, None), ei, (n_src, n_dst))
    rows, matmul = [], torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: rows.append(a.shape[0]) or matmul(a, b))
    sparse_input._sparse_is_faster(aggregation, x, SparseInput.of(x), 8, 1)
    assert rows and set(rows) == {n_dst}  # (A x) W, whose backward is (A x)^T G


@pytest.mark.parametrize("device", DEVICES)
def test_product_and_gradient_against_float64(device, fresh_seed):
    """``SparseInput @ w`` is x @ w, and its gradient in w is x^T g (float64 reference)."""
    x = bag_of_words(70, 200, 0.05, fresh_seed).to(device)
    w = torch.randn(200, 12, generator=torch.Generator().manual_seed(fresh_seed)).to(device).requires_grad_()
    out = SparseInput.of(x) @ w
    g = torch.randn_like(out)
    out.backward(g)
    assert rel_error(out, x.double() @ w.detach().double()) < TOL
    assert rel_error(w.grad, x.double().t() @ g.double()) < TOL
    sparse = SparseInput.of(x)
    assert sparse.shape == (70, 200) and sparse.adj.nnz == int((x != 0).sum())
    ref = spmm_reference(sparse.adj.rowptr, sparse.adj.col, sparse.adj.values.double(), w.detach().double(), None,
                         None, None)
    assert rel_error(out, ref) < TOL


@pytest.mark.parametrize("mode", ["1", "auto"])
def test_bipartite_sage_matches_stock(mode):
    """A bipartite SAGEConv ((x_src, x_dst), more source than target nodes) keeps its constant
    source features sparse where that applies, and the probe times products of both shapes."""
    fgplugin.set_sparse_input(mode)
    n_src, n_dst, features = 300, 120, 500
    x_src, x_dst = bag_of_words(n_src, features, 0.005, 6), bag_of_words(n_dst, features, 0.005, 7)
    g = torch.Generator().manual_seed(6)
    ei = torch.stack([torch.randint(0, n_src, (900,), generator=g), torch.randint(0, n_dst, (900,), generator=g)])
    torch.manual_seed(6)
    stock = pyg_nn.SAGEConv((features, features), 8)
    ours = fp.SAGEConv((features, features), 8)
    ours.load_state_dict(stock.state_dict())
    for _ in range(3):
        out = ours((x_src, x_dst), ei)
    assert rel_error(out, stock((x_src, x_dst), ei)) < TOL
    if mode == "1":
        assert isinstance(input_cache.of(ours).value, SparseInput)


def test_not_used_where_it_does_not_apply():
    """Off, on dense inputs (auto: without a probe), on float64 or non-finite inputs, and for a
    layer without a weight of its own (LGConv), the dense A^K x is kept as before."""
    n, features = 80, 100
    ei = graph(n, 400, 0)
    cases = [("0", bag_of_words(n, features, 0.02, 0), fp.GCNConv(features, 8)),
             ("auto", torch.randn(n, features), fp.GCNConv(features, 8)),
             ("1", bag_of_words(n, features, 0.02, 0, torch.float64), fp.GCNConv(features, 8).double()),
             ("1", bag_of_words(n, features, 0.02, 0).index_fill_(0, torch.tensor([3]), float("nan")),
              fp.GCNConv(features, 8)),
             ("1", bag_of_words(n, features, 0.02, 0), fp.LGConv())]
    for mode, x, layer in cases:
        fgplugin.set_sparse_input(mode)
        for _ in range(3):
            layer(x, ei)
        kept = input_cache.of(layer).value
        assert isinstance(kept, torch.Tensor), (mode, x.dtype, type(layer).__name__)


def test_out_of_memory_while_building_keeps_the_dense_form(monkeypatch):
    """Running out of device memory while building or probing the sparse form keeps the dense
    form (which needs no more memory) instead of failing the user's forward pass."""
    def no_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(sparse_input, "_sparse_is_faster", no_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    n, features = 200, 400
    x, ei = bag_of_words(n, features, 0.01, 1), graph(n, 600, 1)
    layer = fp.GCNConv(features, 16)
    for _ in range(3):
        out = layer(x, ei)
    assert isinstance(input_cache.of(layer).value, torch.Tensor) and out.shape == (n, 16)


def test_auto_keeps_what_is_faster(monkeypatch):
    """On "auto" the timed probe decides; a very sparse wide input is kept sparse when it wins and
    dense when it loses."""
    n, features = 200, 400
    x, ei = bag_of_words(n, features, 0.01, 1), graph(n, 600, 1)
    for faster in (True, False):
        monkeypatch.setattr(sparse_input, "_sparse_is_faster", lambda *args, answer=faster: answer)
        layer = fp.GCNConv(features, 16)
        for _ in range(3):
            layer(x, ei)
        assert isinstance(input_cache.of(layer).value, SparseInput) == faster


@pytest.mark.parametrize("device", DEVICES)
def test_probe_times_both_ways(device):
    """The probe runs both forms' products (no mock), for an eager and for a captured step, and
    answers a bool; the captured-step setting holds in its block's thread only and is restored
    after it."""
    n, features = 150, 300
    x, ei = bag_of_words(n, features, 0.01, 2).to(device), graph(n, 500, 2).to(device)
    aggregation = fp.GCNConv(features, 8)._aggregation(n, ei, None, torch.float32)
    assert isinstance(sparse_input._sparse_is_faster(aggregation, x, SparseInput.of(x), 8, 1), bool)
    seen_elsewhere = []
    with autotune.for_captured_step():
        assert autotune._captured.get()
        assert isinstance(sparse_input._sparse_is_faster(aggregation, x, SparseInput.of(x), 8, 1), bool)
        other = threading.Thread(target=lambda: seen_elsewhere.append(autotune._captured.get()))
        other.start()
        other.join()
    assert not autotune._captured.get() and seen_elsewhere == [False]  # per thread


def test_autocast_bf16_against_float64():
    """Under bf16 autocast the sparse product aggregates 16-bit W with float32 accumulation."""
    fgplugin.set_sparse_input("1")
    n, features = 64, 96
    x, ei = bag_of_words(n, features, 0.05, 3), graph(n, 300, 3)
    layer = fp.GCNConv(features, 8)
    stock = pyg_nn.GCNConv(features, 8).double()
    stock.load_state_dict(layer.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            out = layer(x, ei)
    assert isinstance(input_cache.of(layer).value, SparseInput) and out.dtype == torch.bfloat16
    assert rel_error(out, stock(x.double(), ei)) < 2e-2


def test_set_sparse_input_checks_its_argument():
    assert fgplugin.set_sparse_input(True) == "auto"
    assert fgplugin.set_sparse_input(False) == "1"
    assert fgplugin.set_sparse_input("auto") == "0"
    assert fgplugin.set_sparse_input("off") == "auto" and fgplugin.set_sparse_input("On") == "0"
    with pytest.raises(ValueError, match="set_sparse_input takes"):
        fgplugin.set_sparse_input("sometimes")

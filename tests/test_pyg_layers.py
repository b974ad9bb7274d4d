"""fgplugin.pyg layers against the stock PyG layers: outputs and gradients, every input kind,
caching, errors, torch.compile, TorchScript, convert() and patch()."""
import gc
import re
import sys
import types

import pytest
import torch

pytest.importorskip("torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402
import torch_geometric.typing  # noqa: E402
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.typing import SparseTensor  # noqa: E402
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor, to_torch_csr_tensor  # noqa: E402

import fgplugin  # noqa: E402
import fgplugin.pyg as fp  # noqa: E402
from fgplugin.pyg import _graph  # noqa: E402
from fgplugin.aggregation import Aggregation  # noqa: E402
from fgplugin.pyg._layer import FgpluginLayer  # noqa: E402
from fgplugin.testing import record_spmm_widths  # noqa: E402
from conftest import FULLGRAPH, traced_whole  # noqa: E402
from torch._dynamo.testing import CompileCounter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Converting sparse tensor to CSR format")

TOL = 1e-5  # relative Frobenius error, fp32


def graph_case(name: str):
    """(edge_index, edge_weight, num_nodes) of a labelled, seeded graph case."""
    g = torch.Generator().manual_seed(7)
    n = 40
    if name == "empty":
        ei = torch.zeros(2, 0, dtype=torch.long)
    elif name == "path":
        ei = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        ei = torch.cat([ei, ei.flip(0)], 1)
    elif name == "hub":  # one node receives from everyone, plus a sparse random rest
        ei = torch.cat([torch.stack([torch.arange(1, n), torch.zeros(n - 1, dtype=torch.long)]),
                        torch.randint(0, n, (2, 30), generator=g)], 1)
        ei = ei[:, ei[0] != ei[1]]
    elif name == "messy":  # isolated nodes, self loops (one duplicated), duplicate edges
        ei = torch.randint(0, n - 5, (2, 120), generator=g)
        ei = torch.cat([ei, torch.tensor([[1, 1, 2, 7], [1, 1, 2, 7]]), ei[:, :10]], 1)
    else:
        raise KeyError(name)
    return ei, torch.rand(ei.shape[1], generator=g) + 0.1, n


CASES = ["empty", "path", "hub", "messy"]


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.fixture
def fgplugin_only(monkeypatch):
    """Makes a call fail if an fgplugin layer hands it to the stock code."""
    def refuse(self, *args):
        raise AssertionError(f"{type(self).__name__} took the stock code path")
    monkeypatch.setattr(FgpluginLayer, "_stock_forward", refuse)


# Input kinds: (name, builder(edge_index, weight, n) -> forward args, uses the weight)
def _ei(ei, w, n): return (ei,)
def _ei_w(ei, w, n): return (ei, w)
def _edge_index_cls(ei, w, n): return (EdgeIndex(ei, sparse_size=(n, n)), w)
def _coo(ei, w, n): return (to_torch_coo_tensor(ei, w.detach(), (n, n)).t(),)
def _csr(ei, w, n): return (to_torch_csr_tensor(ei.flip(0), w, (n, n)),)
def _csc_t(ei, w, n): return (to_torch_csc_tensor(ei, w, (n, n)).t(),)
def _csr_unweighted(ei, w, n): return (to_torch_csr_tensor(ei.flip(0), None, (n, n)),)


KINDS = [_ei, _ei_w, _edge_index_cls, _coo, _csr, _csc_t, _csr_unweighted]
LAYERS = {
    "gcn": lambda cls: cls(8, 6),
    "gcn-improved": lambda cls: cls(8, 6, improved=True),
    "gcn-no-loops": lambda cls: cls(8, 6, add_self_loops=False),
    "gcn-no-norm": lambda cls: cls(8, 6, normalize=False, add_self_loops=False, bias=False),
    "sg": lambda cls: cls(8, 6, K=3),
    "lg": lambda cls: cls(),
    "lg-no-norm": lambda cls: cls(normalize=False),
}
CLASS_OF = {"gcn": "GCNConv", "sg": "SGConv", "lg": "LGConv", "sage": "SAGEConv"}


def make_pair(config: str, make):
    name = CLASS_OF[config.split("-")[0]]
    torch.manual_seed(0)
    stock = make(getattr(pyg_nn, name))
    ours = make(getattr(fp, name))
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def assert_same(stock, ours, x, args_stock, args_ours, weights=()):
    """Outputs and gradients (x, parameters, edge weights) within TOL."""
    x_s, x_o = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_s, out_o = stock(x_s, *args_stock), ours(x_o, *args_ours)
    assert out_o.shape == out_s.shape
    assert rel_err(out_o, out_s) < TOL
    grad = torch.randn_like(out_s)
    out_s.backward(grad)
    out_o.backward(grad)
    assert rel_err(x_o.grad, x_s.grad) < TOL
    for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
        assert rel_err(p_o.grad, p_s.grad) < TOL, name
    for w_s, w_o in weights:
        assert (w_s.grad is None) == (w_o.grad is None)
        if w_s.grad is not None:
            assert rel_err(w_o.grad, w_s.grad) < TOL


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__.strip("_"))
@pytest.mark.parametrize("config", LAYERS)
def test_matches_stock(config, kind, case, fgplugin_only):
    ei, w, n = graph_case(case)
    stock, ours = make_pair(config, LAYERS[config])
    w_s, w_o = w.clone().requires_grad_(kind is not _coo), w.clone().requires_grad_(kind is not _coo)
    x = torch.randn(n, 8)
    assert_same(stock, ours, x, kind(ei, w_s, n), kind(ei, w_o, n), [(w_s, w_o)])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("config", LAYERS)
def test_tiled_adjacency_gives_what_stock_gives_for_edge_index(config, case, weighted, fgplugin_only):
    """A TiledAdjacency holds an edge list, so a layer given one computes what the stock layer
    computes for that edge_index: existing self loops (a duplicated one in "messy") and
    improved=True included, and the gradients of the edge weights."""
    ei, w, n = graph_case(case)
    stock, ours = make_pair(config, LAYERS[config])
    w_s, w_o = w.clone().requires_grad_(), w.clone().requires_grad_()
    adj = fgplugin.TiledAdjacency.from_edge_index(ei, n, w_o if weighted else None)
    x = torch.randn(n, 8)
    assert_same(stock, ours, x, (ei, w_s) if weighted else (ei,), (adj,), [(w_s, w_o)] if weighted else [])


@pytest.mark.parametrize("config", ["gcn", "gcn-improved", "sg", "lg"])
@pytest.mark.parametrize("kind", [_ei, _ei_w, _csr], ids=lambda k: k.__name__.strip("_"))
def test_float64_gets_float64_accuracy(config, kind, fgplugin_only):
    """Float64 features are aggregated with float64 scales: stock and fgplugin agree to ~1e-15."""
    ei, w, n = graph_case("messy")
    stock, ours = make_pair(config, LAYERS[config])
    stock, ours = stock.double(), ours.double()
    x = torch.randn(n, 8, dtype=torch.float64)
    out_s, out_o = stock(x, *kind(ei, w.double(), n)), ours(x, *kind(ei, w.double(), n))
    assert rel_err(out_o, out_s) < 1e-13


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", [_ei, _edge_index_cls, _coo, _csr, _csr_unweighted],
                         ids=lambda k: k.__name__.strip("_"))
@pytest.mark.parametrize("options", [{}, {"project": True, "normalize": True}, {"root_weight": False}])
def test_sage_matches_stock(options, kind, case, fgplugin_only):
    ei, w, n = graph_case(case)
    stock, ours = make_pair("sage", lambda cls: cls(8, 6, **options))
    args = kind(ei, w, n)[:1]  # SAGEConv takes no edge weights
    assert_same(stock, ours, torch.randn(n, 8), args, args)


def test_sage_bipartite_matches_stock(fgplugin_only):
    ei = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 2]])
    x_src, x_dst = torch.randn(4, 8), torch.randn(3, 16)
    stock, ours = make_pair("sage", lambda cls: cls((8, 16), 6))
    assert rel_err(ours((x_src, x_dst), ei), stock((x_src, x_dst), ei)) < TOL
    assert rel_err(ours((x_src, None), ei, (4, 3)), stock((x_src, None), ei, (4, 3))) < TOL
    adj_t = to_torch_csc_tensor(ei, size=(4, 3)).t()
    assert rel_err(ours((x_src, x_dst), adj_t), stock((x_src, x_dst), ei)) < TOL


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", [_ei_w, _csr], ids=lambda k: k.__name__.strip("_"))
def test_gcn_pads_the_weight_not_the_features(kind, bias, monkeypatch, fgplugin_only):
    """Where the kernel wants wider rows (on CUDA 6 -> 8 columns at fp32), W gets the zero
    rows, so the SpMM runs on X W as it comes; forced here on the CPU: the SpMM sees 8 columns,
    and outputs and gradients (x, W, bias, edge weights) match stock, the output contiguous."""
    from fgplugin import aggregation

    monkeypatch.setattr(aggregation, "padded_width", lambda features, dtype, device, nnz=None: features + -features % 4)
    widths = record_spmm_widths(monkeypatch)
    ei, w, n = graph_case("messy")
    stock, ours = make_pair("gcn", lambda cls: cls(8, 6, bias=bias))
    w_s, w_o = w.clone().requires_grad_(), w.clone().requires_grad_()
    x = torch.randn(n, 8)
    assert_same(stock, ours, x, kind(ei, w_s, n), kind(ei, w_o, n), [(w_s, w_o)])
    assert len(widths) >= 2 and set(widths) == {8}  # forward and backward products, padded through W
    assert ours(x, *kind(ei, w_o, n)).is_contiguous()


@pytest.mark.parametrize("name", ["cora", "citeseer", "chameleon"])
def test_real_graphs_match_stock(name, fgplugin_only):
    from conftest import require_data_dir
    from fgplugin.datasets import load_npz

    require_data_dir()
    data = load_npz(name, features=None)
    ei, n = data.edge_index, data.num_nodes
    w = torch.rand(ei.shape[1], generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, 8)
    for config in ("gcn", "sg", "lg"):
        stock, ours = make_pair(config, LAYERS[config])
        assert_same(stock, ours, x, (ei, w), (ei, w))
    stock, ours = make_pair("sage", lambda cls: cls(8, 6))
    assert_same(stock, ours, x, (ei,), (ei,))


def test_other_inputs_match_stock(fgplugin_only):
    ei, w, n = graph_case("path")
    stock, ours = make_pair("gcn", LAYERS["gcn"])
    # PyG's static graphs: [batch, nodes, features]
    x = torch.randn(3, n, 8)
    assert rel_err(ours(x, ei), stock(x, ei)) < TOL
    # sparse node features
    xs = torch.randn(n, 8).relu().to_sparse()
    assert rel_err(ours(xs, ei), stock(xs, ei)) < TOL
    # reversed flow and int32 ids
    stock.flow = ours.flow = "target_to_source"
    assert rel_err(ours(x[0], ei.int(), w), stock(x[0], ei.int(), w)) < TOL
    # a TiledAdjacency
    ours.flow = "source_to_target"
    stock.flow = "source_to_target"
    adj = fgplugin.TiledAdjacency.from_edge_index(ei, n)
    assert rel_err(ours(x[0], adj), stock(x[0], ei)) < TOL
    assert rel_err(ours(x[0], adj, w), stock(x[0], ei, w)) < TOL


def test_sparse_tensor_inputs(fgplugin_only):
    """torch_sparse.SparseTensor: stock semantics (fill_diag replaces existing self loops)."""
    ei, w, n = graph_case("messy")
    adj_t = _sparse_tensor(ei.flip(0), w, n)
    x = torch.randn(n, 8)
    conv = fp.GCNConv(8, 6, improved=True)
    fill = torch.zeros(n, n).index_put_((ei[1], ei[0]), w, accumulate=True).fill_diagonal_(2.0)
    d = fill.sum(1).rsqrt()
    expected = (d[:, None] * fill * d[None, :]) @ conv.lin(x) + conv.bias
    assert rel_err(conv(x, adj_t), expected) < TOL
    if torch_geometric.typing.WITH_TORCH_SPARSE:  # the real one: also against the stock layer on it
        stock = pyg_nn.GCNConv(8, 6, improved=True)
        stock.load_state_dict(conv.state_dict())
        assert rel_err(conv(x, adj_t), stock(x, adj_t)) < TOL
    sage_stock, sage = make_pair("sage", lambda cls: cls(8, 6))
    assert rel_err(sage(x, adj_t), sage_stock(x, ei)) < TOL  # the mean ignores the values
    conv.cached = True
    conv(x, adj_t)
    assert isinstance(conv._cached_adj_t, Aggregation) and conv._cached_edge_index is None


def _sparse_tensor(index, value, n):
    """A torch_sparse.SparseTensor, or a stand-in with the methods fgplugin uses without it."""
    import torch_geometric.typing

    if torch_geometric.typing.WITH_TORCH_SPARSE:
        return SparseTensor(row=index[0], col=index[1], value=value, sparse_sizes=(n, n))

    class StandIn(SparseTensor):
        def __init__(self):
            pass

        @property
        def storage(self):
            return types.SimpleNamespace(value=lambda: value)

        def coo(self):
            return index[0], index[1], value

        def sparse_sizes(self):
            return (n, n)

    return StandIn()


def test_structure_cache(monkeypatch, fgplugin_only):
    builds = []
    original = fgplugin.TiledAdjacency.from_edge_index.__func__
    monkeypatch.setattr(fgplugin.TiledAdjacency, "from_edge_index",
                        classmethod(lambda cls, *a, **k: builds.append(1) or original(cls, *a, **k)))
    ei, w, n = graph_case("hub")
    ei = ei.clone()
    x = torch.randn(n, 8)
    convs = [fp.GCNConv(8, 6), fp.GCNConv(8, 6), fp.SAGEConv(8, 6)]
    for conv in convs * 2:
        conv(x, ei)
    convs[0](x, ei, w)
    assert len(builds) == 1  # one structure for every layer, call and weighting
    stock = pyg_nn.GCNConv(8, 6)
    stock.load_state_dict(convs[0].state_dict())
    ei[1, 0] = 5  # an in-place edit is a new graph
    assert rel_err(convs[0](x, ei), stock(x, ei)) < TOL and len(builds) == 2
    key = id(ei)
    del ei
    gc.collect()
    assert key not in _graph._cache  # the entry dies with its edge_index


@pytest.mark.parametrize("config", ["gcn", "sg"])
def test_tiled_values_written_in_place(config, fgplugin_only):
    """A weighted TiledAdjacency whose values are written in place aggregates with the new values:
    its GCN scales are kept with the values' version, and so is a layer's kept aggregation of a
    constant input (filled by the first two calls)."""
    ei, w, n = graph_case("hub")
    adj = fgplugin.TiledAdjacency.from_edge_index(ei, n).with_values(w.clone())
    x = torch.randn(n, 8)
    stock, ours = make_pair(config, lambda cls: cls(8, 6))
    for _ in range(2):
        assert rel_err(ours(x, adj), stock(x, ei, w)) < TOL
    with torch.no_grad():
        adj.values.mul_(3.0)
    assert rel_err(ours(x, adj), stock(x, ei, w * 3.0)) < TOL


@pytest.mark.parametrize("config", ["gcn", "gcn-weighted", "sage", "sg"])
def test_a_first_call_in_inference_mode_leaves_training_working(config, fgplugin_only):
    """What a layer builds for a graph is kept: built in inference mode (PyTorch Lightning's sanity
    check evaluates before training) it must not be inference tensors, which autograd refuses to
    save in the training step that follows."""
    ei, w, n = graph_case("hub")
    make = {"sage": lambda cls: cls(8, 6), "sg": lambda cls: cls(8, 6, K=2)}.get(config, lambda cls: cls(8, 6))
    stock, ours = make_pair(config.split("-")[0], make)
    args = (ei, w) if config == "gcn-weighted" else (ei,)
    x = torch.randn(n, 8)
    with torch.inference_mode():
        evaluated = ours(x, *args)
    assert rel_err(evaluated, stock(x, *args)) < TOL
    x_train = x.clone().requires_grad_()
    ours(x_train, *args).sum().backward()
    assert x_train.grad is not None and all(p.grad is not None for p in ours.parameters())


def test_a_compiled_layer_first_called_in_inference_mode_trains():
    """Under torch.compile the graph of an edge_index is built eagerly behind a graph break; built
    in inference mode, it too must hold normal tensors for the training step after."""
    ei, _, n = graph_case("hub")
    _, ours = make_pair("gcn", lambda cls: cls(8, 6))
    compiled = torch.compile(ours, backend="eager")
    x = torch.randn(n, 8)
    with torch.inference_mode():
        compiled(x, ei)
    compiled(x.clone().requires_grad_(), ei).sum().backward()
    assert all(p.grad is not None for p in ours.parameters())


def test_an_edge_index_made_in_inference_mode_is_served(fgplugin_only):
    """Such a tensor has no version counter to key the graph cache on: its graph is built for the
    call and not kept."""
    ei, _, n = graph_case("hub")
    stock, ours = make_pair("gcn", lambda cls: cls(8, 6))
    x = torch.randn(n, 8)
    with torch.inference_mode():
        made_there = ei.clone()
        assert rel_err(ours(x, made_there), stock(x, ei)) < TOL


def test_cached_semantics(fgplugin_only):
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)
    stock, ours = make_pair("gcn", lambda cls: cls(8, 6, cached=True))
    other = graph_case("hub")[0]
    for conv in (stock, ours):
        conv(x, ei)
    assert isinstance(ours._cached_edge_index, Aggregation)
    # like stock, a cached layer ignores the graphs of later calls ...
    assert rel_err(ours(x, other), stock(x, other)) < TOL
    assert rel_err(ours(x, other), ours(x, ei)) < TOL
    # ... until its cache is reset
    ours._cached_edge_index = None
    stock._cached_edge_index = None
    assert rel_err(ours(x, other), stock(x, other)) < TOL
    assert rel_err(ours(x, other), ours(x, ei)) < TOL  # and caches the new graph
    ours.reset_parameters()
    assert ours._cached_edge_index is None
    uncached = fp.GCNConv(8, 6)
    assert rel_err(uncached(x, other), uncached(x, ei)) > 1e-3  # cached=False honours each graph
    sg_stock, sg = make_pair("sg", lambda cls: cls(8, 6, K=2, cached=True))
    for conv in (sg_stock, sg):
        conv(x, ei)
    assert rel_err(sg(x + 1, other), sg_stock(x + 1, other)) < TOL
    # with K = 0 there is nothing propagated to cache: each call reads its own x, as stock
    sg_stock, sg = make_pair("sg", lambda cls: cls(8, 6, K=0, cached=True))
    for conv in (sg_stock, sg):
        conv(x, ei)
    assert rel_err(sg(x + 1, other), sg_stock(x + 1, other)) < TOL
    assert sg._cached_x is None


def test_cached_stock_norm_is_adopted(fgplugin_only):
    """A layer converted after the stock code cached its norm goes on with fgplugin."""
    ei, w, n = graph_case("messy")
    x = torch.randn(n, 8)
    for flow in ("source_to_target", "target_to_source"):
        model = pyg_nn.GCNConv(8, 6, cached=True, flow=flow)
        expected = model(x, ei, w)
        fp.convert(model)
        assert rel_err(model(x, ei), expected) < TOL  # the cached (weighted) graph still rules
        assert isinstance(model._cached_edge_index, Aggregation)


@pytest.mark.parametrize("make, args", [
    (lambda cls: cls(8, 6), lambda ei, n: (ei.float(),)),                      # float ids
    (lambda cls: cls(8, 6), lambda ei, n: (torch.tensor([[0, 99], [1, 0]]),)),  # id out of range
    (lambda cls: cls(8, 6), lambda ei, n: (ei[0],)),                            # 1-D
    (lambda cls: cls(8, 6, flow="target_to_source"), lambda ei, n: (to_torch_csr_tensor(ei, size=(n, n)),)),
    (lambda cls: cls(8, 6), lambda ei, n: (to_torch_csr_tensor(ei, size=(n + 1, n + 1)),)),  # wrong size
])
def test_rejected_inputs_raise_as_stock(make, args):
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)
    with pytest.raises(Exception) as stock_error:
        make(pyg_nn.GCNConv)(x, *args(ei, n))
    with pytest.raises(stock_error.type):
        make(fp.GCNConv)(x, *args(ei, n))
    with pytest.raises(ValueError, match="tuple"):
        fp.GCNConv(8, 6)((x, x), ei)


@pytest.mark.parametrize("config, make", [("gcn", lambda cls: cls(8, 6)), ("sg", lambda cls: cls(8, 6, K=2)),
                                          ("lg", lambda cls: cls()), ("sage", lambda cls: cls(8, 6))])
def test_an_edge_index_sized_for_other_features_raises_as_stock(config, make, monkeypatch):
    """An ``EdgeIndex``'s ``sparse_size`` counts the graph's nodes: features for fewer (the last
    nodes isolated, so every id is in range) are refused as by the stock layer, not aggregated into
    an output with the wrong number of rows; other sizes do what stock does with them; a size left
    unknown is served."""
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)
    stock, ours = make_pair(config, make)
    with pytest.raises(ValueError) as stock_error:
        stock(x, EdgeIndex(ei, sparse_size=(n + 5, n + 5)))
    with pytest.raises(ValueError, match=re.escape(str(stock_error.value))):
        ours(x, EdgeIndex(ei, sparse_size=(n + 5, n + 5)))
    for size in ((n, n + 5), (n + 5, n)):
        try:
            want = stock(x, EdgeIndex(ei, sparse_size=size))
        except ValueError as err:
            with pytest.raises(ValueError, match=re.escape(str(err))):
                ours(x, EdgeIndex(ei, sparse_size=size))
        else:
            assert rel_err(ours(x, EdgeIndex(ei, sparse_size=size)), want) < TOL
    monkeypatch.setattr(FgpluginLayer, "_stock_forward", lambda *args: pytest.fail("took the stock path"))
    for size in ((n, None), (None, n)):
        assert rel_err(ours(x, EdgeIndex(ei, sparse_size=size)), stock(x, EdgeIndex(ei, sparse_size=size))) < TOL


def test_an_edge_index_resized_in_place_is_seen_by_a_repeated_call():
    """``EdgeIndex.sparse_resize_`` changes the size, not the version: a GCNConv's repeated call
    (fgplugin.layer_calls) must not run what it decided for the old size."""
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)
    stock, ours = make_pair("gcn", lambda cls: cls(8, 6))
    graph = EdgeIndex(ei, sparse_size=(n, n))
    for _ in range(2):  # decided, then repeated
        assert rel_err(ours(x, graph), stock(x, graph)) < TOL
    graph.sparse_resize_(n + 5, n + 5)
    with pytest.raises(ValueError) as stock_error:
        stock(x, graph)
    with pytest.raises(ValueError, match=re.escape(str(stock_error.value))):
        ours(x, graph)


def test_a_bipartite_sage_with_the_flow_reversed_reads_an_edge_index_sized_that_way(fgplugin_only):
    """With ``flow="target_to_source"`` ``edge_index[1]`` holds the sources, so an ``EdgeIndex``
    sized ``(targets, sources)`` fits ``(x_src, x_dst)`` and is served as the plain
    ``edge_index`` is (stock PyG compares its sizes in one order whatever the flow, and refuses
    both); sized the other way round it does not fit, and the stock code raises."""
    ei = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 2, 3, 3]])  # [targets; sources]
    x_src, x_dst = torch.randn(4, 8), torch.randn(3, 8)
    conv = fp.SAGEConv(8, 6, flow="target_to_source")
    want = conv((x_src, x_dst), ei)
    assert want.shape == (3, 6)
    assert rel_err(conv((x_src, x_dst), EdgeIndex(ei, sparse_size=(3, 4))), want) < TOL
    mean = torch.stack([x_src[ei[1][ei[0] == t]].mean(0) for t in range(3)])  # the flipped edges' mean
    assert rel_err(want, conv.lin_l(mean) + conv.lin_r(x_dst)) < TOL
    with pytest.raises(AssertionError, match="took the stock code path"):  # where the stock code raises
        conv((x_src, x_dst), EdgeIndex(ei, sparse_size=(4, 3)))


def test_nan_weights_propagate_as_in_stock():
    ei, w, n = graph_case("path")
    w[3] = float("nan")  # fgplugin refuses NaN weights; the stock layer propagates them
    stock, ours = make_pair("gcn", LAYERS["gcn"])
    x = torch.randn(n, 8)
    assert torch.equal(ours(x, ei, w).isnan(), stock(x, ei, w).isnan())


def test_message_hooks_keep_the_stock_path():
    ei, w, n = graph_case("path")
    conv = fp.GCNConv(8, 6)
    seen = []
    conv.register_message_forward_hook(lambda module, inputs, out: seen.append(out.shape))
    stock = pyg_nn.GCNConv(8, 6)
    stock.load_state_dict(conv.state_dict())
    x = torch.randn(n, 8)
    assert rel_err(conv(x, ei), stock(x, ei)) < TOL and seen


def test_a_cached_layer_falling_back_to_stock_keeps_its_first_graph():
    """A hook registered after the first call sends a cached layer down the stock code, which
    must read the graph kept then, not the call's, as the stock layer does: whether the cache
    holds the layer's own aggregation or one adopted from a stock cache."""
    ei, w, n = graph_case("messy")
    other = graph_case("hub")[0]
    other = other[:, other.max(0).values < n]
    x = torch.randn(n, 8)
    for adopted, flow in ((False, "source_to_target"), (False, "target_to_source"), (True, "source_to_target")):
        stock, ours = make_pair("gcn", lambda cls: cls(8, 6, cached=True, flow=flow))
        if adopted:
            ours.__class__ = pyg_nn.GCNConv
            ours(x, ei, w)
            fp.convert(ours)
            ours(x, other)  # adopts the stock cache
        else:
            ours(x, ei, w)
        stock(x, ei, w)
        ours.register_propagate_forward_hook(lambda module, inputs, out: None)
        assert rel_err(ours(x, other), stock(x, other)) < TOL, (adopted, flow)
        assert rel_err(ours(x, ei), stock(x, ei)) < TOL, (adopted, flow)


def test_a_subclass_with_its_own_message_passing_runs_the_stock_code():
    """A subclass of a drop-in (as one defined after patch() is) that overrides a step of
    message passing gets it: fgplugin's kernel would skip it."""
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)

    def scaled(base):
        class Scaled(base):
            def message(self, x_j, edge_weight):
                return 2 * super().message(x_j, edge_weight)
        return Scaled

    torch.manual_seed(0)
    stock = scaled(pyg_nn.GCNConv)(8, 6)
    ours = scaled(fp.GCNConv)(8, 6)
    ours.load_state_dict(stock.state_dict())
    assert rel_err(ours(x, ei), stock(x, ei)) < TOL
    plain = fp.GCNConv(8, 6)
    plain.load_state_dict(stock.state_dict())
    assert rel_err(plain(x, ei), stock(x, ei)) > 0.1  # the scaling is real


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit itself is deprecated
def test_torchscript_scripts_the_stock_layer():
    ei, w, n = graph_case("path")
    x = torch.randn(n, 8)
    for conv in (fp.GCNConv(8, 6, cached=True), fp.SAGEConv(8, 6), fp.SGConv(8, 6), fp.LGConv()):
        expected = conv(x, ei)
        scripted = torch.jit.script(conv)
        assert rel_err(scripted(x, ei), expected) < TOL
        assert type(conv).__module__.startswith("fgplugin")  # the layer itself is untouched


def test_torch_compile_has_no_graph_breaks():
    torch._dynamo.reset()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = fp.GCNConv(8, 16), fp.GCNConv(16, 4)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    ei, w, n = graph_case("messy")
    model, x = Net(), torch.randn(n, 8)
    expected = model(x, ei)  # eager: the structure is built and cached
    assert traced_whole(torch._dynamo.explain(model)(x, ei).graph_break_count)
    compiled = torch.compile(model, fullgraph=FULLGRAPH)
    out = compiled(x, ei)
    assert rel_err(out, expected) < TOL
    out.sum().backward()
    torch._dynamo.reset()
    # A TiledAdjacency (what BlockReorder attaches) needs no eager warm-up: zero breaks cold.
    adj = fgplugin.TiledAdjacency.from_edge_index(ei, n)
    assert traced_whole(torch._dynamo.explain(Net())(x, adj).graph_break_count)
    torch._dynamo.reset()


COMPILE_CASES = {
    "gcn": lambda: fp.GCNConv(8, 6), "gcn-improved": lambda: fp.GCNConv(8, 6, improved=True),
    "gcn-cached": lambda: fp.GCNConv(8, 6, cached=True), "gcn-raw": lambda: fp.GCNConv(8, 6, normalize=False),
    "sage": lambda: fp.SAGEConv(8, 6), "sg": lambda: fp.SGConv(8, 6, K=2), "lg": lambda: fp.LGConv(),
}


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("layer", list(COMPILE_CASES))
def test_torch_compile_cold_edge_index_has_no_graph_breaks(layer, weighted, monkeypatch):
    """A model compiled before it has seen its edge_index: no graph breaks, the same outputs and
    input gradients as eager, fgplugin's kernel, the structure built once per edge_index object
    (when the compiled graph first runs), and no recompilation for a new edge_index object."""
    if weighted and layer == "sage":
        pytest.skip("SAGEConv takes no edge weights")
    torch._dynamo.reset()
    builds = []
    build = _graph._build
    monkeypatch.setattr(_graph, "_build", lambda *args: builds.append(1) or build(*args))
    ei, w, n = graph_case("messy")
    conv = COMPILE_CASES[layer]()
    eager = COMPILE_CASES[layer]()
    eager.load_state_dict(conv.state_dict())
    extra = (w,) if weighted else ()
    cold = ei.clone()
    explanation = torch._dynamo.explain(COMPILE_CASES[layer]())(torch.randn(n, 8), cold.clone(), *extra)
    assert traced_whole(explanation.graph_break_count)
    counter = CompileCounter()
    compiled = torch.compile(conv, backend=counter, fullgraph=FULLGRAPH)
    builds.clear()
    for _ in range(3):
        x = torch.randn(n, 8, requires_grad=True)
        with torch.profiler.profile() as prof:
            out = compiled(x, cold, *extra)
        assert "fgplugin::spmm" in {e.key for e in prof.key_averages()}
        x_ref = x.detach().requires_grad_()
        expected = eager(x_ref, cold, *extra)
        assert rel_err(out, expected) < TOL
        grad = torch.randn_like(out)
        assert rel_err(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(expected, x_ref, grad)[0]) < TOL
    assert len(builds) == 1  # built when first run, then found in the cache
    # A new edge_index object: built, not recompiled. (A cached layer ignores it, as the stock one
    # does; filling its cache changes the module, so dynamo recompiles it, as it does the stock one.)
    compiled(torch.randn(n, 8, requires_grad=True), ei.clone(), *extra)
    cached = getattr(conv, "cached", False)
    assert len(builds) == (1 if cached else 2)
    assert cached or counter.frame_count == 1 or not FULLGRAPH  # frames around the break otherwise
    torch._dynamo.reset()


@pytest.mark.parametrize("layer", ["gcn", "gcn-improved", "sg", "lg"])
def test_torch_compile_cold_graph_with_learned_edge_weights(layer):
    """Edge weights that require grad: no graph breaks either; the weights' gradient (through the
    normalization's degrees) and the input's gradient equal eager."""
    torch._dynamo.reset()
    ei, w, n = graph_case("messy")
    conv = COMPILE_CASES[layer]()
    x = torch.randn(n, 8, requires_grad=True)
    cold = ei.clone()
    weight = w.clone().requires_grad_()
    assert traced_whole(torch._dynamo.explain(COMPILE_CASES[layer]())(x, ei.clone(), weight).graph_break_count)
    out = torch.compile(conv, fullgraph=FULLGRAPH)(x, cold, weight)
    x_ref, expected_weight = x.detach().requires_grad_(), w.clone().requires_grad_()
    expected = conv(x_ref, ei, expected_weight)
    assert rel_err(out, expected) < TOL
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, [weight, x], grad),
                         torch.autograd.grad(expected, [expected_weight, x_ref], grad)):
        assert rel_err(got, want) < TOL
    torch._dynamo.reset()


def test_torch_compile_cached_layer_keeps_its_first_graph():
    torch._dynamo.reset()
    ei, w, n = graph_case("messy")
    conv, x = fp.GCNConv(8, 6, cached=True), torch.randn(n, 8)
    compiled = torch.compile(conv, fullgraph=FULLGRAPH)
    first = compiled(x, ei.clone())
    other = torch.randint(0, n, (2, 50), generator=torch.Generator().manual_seed(3))
    # as the stock layer: later graphs are ignored (bit for bit where the layer is traced; run
    # eagerly, its second call reads the kept A x, another rounding)
    later = compiled(x, other)
    assert torch.equal(later, first) if FULLGRAPH else rel_err(later, first) < TOL
    fresh = fp.GCNConv(8, 6)
    fresh.load_state_dict(conv.state_dict())
    assert rel_err(first, fresh(x, ei)) < TOL
    torch._dynamo.reset()


def test_convert_keeps_weights_and_returns_the_model():
    ei, w, n = graph_case("path")
    model = torch.nn.Sequential()
    model.gcn, model.sage, model.lg = pyg_nn.GCNConv(8, 8), pyg_nn.SAGEConv(8, 8, aggr="max"), pyg_nn.LGConv()

    class Custom(pyg_nn.GCNConv):
        pass

    model.custom = Custom(8, 8)
    x = torch.randn(n, 8)
    expected = [m(x, ei) for m in model]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert fp.convert(model) is model
    assert [type(m) for m in model] == [fp.GCNConv, fp.SAGEConv, fp.LGConv, Custom]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(rel_err(m(x, ei), e) < TOL for m, e in zip(model, expected))
    assert type(fp.convert(pyg_nn.SGConv(8, 8))) is fp.SGConv


def test_patch_reaches_bound_names_and_unpatch_restores():
    import torch_geometric.nn.conv.gcn_conv as gcn_module
    import torch_geometric.nn.models.basic_gnn as basic_gnn

    user = types.ModuleType("user_script")
    user.GCNConv = pyg_nn.GCNConv  # `from torch_geometric.nn import GCNConv` before patch()
    sys.modules[user.__name__] = user
    try:
        fp.patch()
        fp.patch()  # idempotent
        assert pyg_nn.GCNConv is fp.GCNConv and pyg_nn.conv.SAGEConv is fp.SAGEConv
        assert basic_gnn.GCNConv is fp.GCNConv and user.GCNConv is fp.GCNConv
        assert gcn_module.GCNConv is not fp.GCNConv  # the defining module keeps the stock class
        model = pyg_nn.models.GCN(8, 16, num_layers=2, out_channels=4)
        assert all(type(conv) is fp.GCNConv for conv in model.convs)
    finally:
        fp.unpatch()
        del sys.modules[user.__name__]
    assert pyg_nn.GCNConv is gcn_module.GCNConv and basic_gnn.GCNConv is gcn_module.GCNConv
    assert user.GCNConv is gcn_module.GCNConv


def test_convert_swaps_torch_dropout_unless_told_not_to_and_patch_only_when_asked():
    """convert(model) swaps the model's own torch.nn.Dropout modules (dropout=False keeps them);
    patch() leaves torch.nn.Dropout alone unless called with dropout=True."""
    stock = torch.nn.modules.dropout.Dropout

    class MyDropout(stock):  # a subclass may override forward: left alone
        pass

    model = torch.nn.Sequential(stock(0.3), torch.nn.Dropout1d(0.2), MyDropout(0.1))
    assert fp.convert(model, dropout=False) is model and type(model[0]) is stock
    fp.convert(model)
    assert [type(m) for m in model] == [fgplugin.Dropout, torch.nn.Dropout1d, MyDropout] and model[0].p == 0.3
    try:
        fp.patch()
        assert torch.nn.Dropout is stock and pyg_nn.GCNConv is fp.GCNConv
        assert type(pyg_nn.models.GCN(8, 16, num_layers=2, dropout=0.5).dropout) is stock
        fp.patch(dropout=True)
        assert torch.nn.Dropout is fgplugin.Dropout
        gnn = pyg_nn.models.GCN(8, 16, num_layers=2, dropout=0.5)  # builds torch.nn.Dropout(p=dropout)
        assert type(gnn.dropout) is fgplugin.Dropout and all(type(c) is fp.GCNConv for c in gnn.convs)
    finally:
        fp.unpatch()
    assert torch.nn.Dropout is stock and pyg_nn.GCNConv is not fp.GCNConv
    gnn = pyg_nn.models.GCN(8, 16, num_layers=2, dropout=0.5)
    assert type(fp.convert(gnn).dropout) is fgplugin.Dropout

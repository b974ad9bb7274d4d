"""Bad input and damaged files: a clear error naming the problem and the fix, or the right answer;
never a crash, a hang or a silently wrong result. (The malformed-argument fuzz of the ops is
test_fuzz.py; saved adjacencies that were damaged, test_tiling.py.)"""
import warnings

import pytest
import torch

import fgplugin
from fgplugin import TiledAdjacency
from fgplugin.cache import CacheWarning

from conftest import require_dgl

EDGES = torch.tensor([[0, 1, 2, 3, 3], [1, 2, 3, 0, 3]])


@pytest.mark.parametrize("field, value, match", [
    ("col", 50_000_000, "refers to source node 50000000 but x has 4 rows"),
    ("col", -1, "negative node id"),
    ("rowptr", 9, "rowptr is not a row pointer"),
])
def test_an_adjacency_edited_after_loading_is_refused_before_a_kernel_reads_it(tmp_path, field, value, match):
    path = tmp_path / "adj.pt"
    torch.save(TiledAdjacency.from_edge_index(EDGES, 4), path)
    adj = torch.load(path, weights_only=True)
    x = torch.randn(4, 3)
    fgplugin.spmm(adj, x)  # checked and remembered
    getattr(adj, field)[2] = value  # an in-place write: the next product checks again
    with pytest.raises(RuntimeError, match=match):
        fgplugin.spmm(adj, x)


def test_second_derivatives_through_edge_weights_match_dense_autograd():
    """The gradient of ||dL/dw||^2 with respect to x and to w (double backward through the
    sddmm that gives dL/dw) equals dense float64 autograd's, never silently zero."""
    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]])
    w0, x0 = torch.rand(5, dtype=torch.float64) + 0.5, torch.randn(4, 3, dtype=torch.float64)
    adj = TiledAdjacency.from_edge_index(ei, 4)

    def grads(product):
        w, x = w0.clone().requires_grad_(), x0.clone().requires_grad_()
        loss = product(w, x).square().sum()
        (gw,) = torch.autograd.grad(loss, w, create_graph=True)
        return torch.autograd.grad(gw.square().sum(), (x, w))

    def dense(w, x):
        a = torch.zeros(4, 4, dtype=torch.float64).index_put((ei[1], ei[0]), w, accumulate=True)
        return a @ x

    ours, want = grads(lambda w, x: fgplugin.spmm(adj.with_values(w), x)), grads(dense)
    for got, ref in zip(ours, want):
        assert ref.abs().max() > 0 and torch.allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["gcn", "both", "right", "left", "mean"])
def test_float64_features_get_float64_accuracy_from_default_scales(kind):
    """``spmm(adj, x, *adj.norm(kind))`` with float64 ``x`` is exact to float64 rounding (the
    default scales are float64), where float32 scales would be off by about 1e-7."""
    g = torch.Generator().manual_seed(5)
    edges = torch.randint(0, 30, (2, 120), generator=g)
    adj = TiledAdjacency.from_edge_index(edges, 30)
    x = torch.randn(30, 4, generator=g, dtype=torch.float64)
    a = torch.zeros(30, 30, dtype=torch.float64).index_put((edges[1], edges[0]), torch.ones(120, dtype=torch.float64),
                                                           accumulate=True)
    in_deg, out_deg = a.sum(1), a.sum(0)
    if kind == "gcn":
        a = a + torch.diag((a.diagonal() == 0).double())
        ref = a.sum(1).rsqrt()[:, None] * a * a.sum(1).rsqrt()[None, :] @ x
    elif kind in ("right", "mean"):
        ref = (a / in_deg.clamp(min=1)[:, None]) @ x
    elif kind == "left":
        ref = (a / out_deg.clamp(min=1)[None, :]) @ x
    else:
        ref = in_deg.clamp(min=1).rsqrt()[:, None] * a * out_deg.clamp(min=1).rsqrt()[None, :] @ x
    out = fgplugin.spmm(adj, x, *adj.norm(kind))
    assert ((out - ref).norm() / ref.norm()).item() < 1e-13


@pytest.mark.parametrize("num_nodes, error, match", [
    (5.7, TypeError, "whole number of nodes"),
    (True, TypeError, "whole number of nodes"),
    (torch.tensor(4.0), TypeError, "whole number of nodes"),
    (-1, ValueError, ">= 0"),
    (2, ValueError, "pass num_nodes >= 4"),
])
def test_node_counts_are_whole_and_large_enough(num_nodes, error, match):
    with pytest.raises(error, match=match):
        TiledAdjacency.from_edge_index(EDGES, num_nodes)


def test_huge_ids_without_num_nodes_are_refused_at_once():
    """Ids from a larger graph and no num_nodes: a clear error, not a 17 GB allocation."""
    with pytest.raises(ValueError, match="(?i)pass num_nodes if the graph really has that many nodes, or relabel"):
        TiledAdjacency.from_edge_index(torch.tensor([[0, 3_000_000_000], [1, 2]]))


def test_pyg_layers_name_a_feature_count_that_does_not_fit_the_graph():
    import fgplugin.pyg as fp

    adj = TiledAdjacency.from_edge_index(EDGES, 4)
    for conv in (fp.GCNConv(3, 2), fp.SAGEConv(3, 2), fp.SGConv(3, 2), fp.LGConv()):
        with pytest.raises(ValueError, match="x has 6 nodes .* but the TiledAdjacency has 4 nodes"):
            conv(torch.randn(6, 3), adj)
    with pytest.raises(ValueError, match="refers to source node 3, but the features have only 3"):
        fp.GCNConv(3, 2)(torch.randn(3, 3), EDGES)


def test_pyg_layers_name_why_a_tiled_adjacency_takes_no_edge_weight():
    """Weights that a TiledAdjacency cannot map onto its edges (built without their order) get the
    adjacency's error, not the stock layer's, which cannot read a TiledAdjacency; one built with
    weights (BlockReorder's data.adj_t) also says it carries them."""
    import fgplugin.pyg as fp

    weights = torch.rand(EDGES.shape[1])
    plain = TiledAdjacency.from_edge_index(EDGES, 4, keep_edge_order=False)
    weighted = TiledAdjacency.from_edge_index(EDGES, 4, weights, keep_edge_order=False)
    for conv in (fp.GCNConv(3, 2), fp.SGConv(3, 2), fp.LGConv()):
        with pytest.raises(ValueError, match="keep_edge_order=True") as refused:
            conv(torch.randn(4, 3), plain, weights)
        assert "already carries edge weights" not in str(refused.value)
        with pytest.raises(ValueError, match="already carries edge weights .*: pass it without edge_weight"):
            conv(torch.randn(4, 3), weighted, weights)


def test_cached_layer_keeps_its_first_graph_like_stock():
    """A cached=True layer keeps the graph of its first call: another graph's features are an
    error that says so (stock PyG uses the kept graph too, and fails or computes with it), and the
    first graph still works afterwards."""
    import fgplugin.pyg as fp

    conv = fp.GCNConv(3, 2, cached=True)
    x = torch.randn(4, 3)
    first = conv(x, EDGES)
    with pytest.raises(ValueError, match="kept from its first call has 4 nodes"):
        conv(torch.randn(7, 3), torch.tensor([[0, 6], [6, 0]]))
    assert torch.allclose(conv(x, EDGES), first, atol=1e-6)
    assert torch.allclose(conv(x, torch.tensor([[0], [1]])), first, atol=1e-6)  # as stock: this graph is ignored


def test_dgl_layers_take_a_graph_without_nodes():
    """DGL's HeteroGraphConv hands empty node types to its layers: stock returns empty results."""
    dgl = require_dgl()
    import fgplugin.dgl as fd
    empty = dgl.graph((torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)), num_nodes=0)
    layers = [lambda m: m.GraphConv(5, 3, allow_zero_in_degree=True), lambda m: m.SAGEConv(5, 3, "mean"),
              lambda m: m.SGConv(5, 3, allow_zero_in_degree=True)]
    for make in layers:
        stock, ours = make(dgl.nn), make(fd)
        ours.load_state_dict(stock.state_dict())
        assert ours(empty, torch.randn(0, 5)).shape == stock(empty, torch.randn(0, 5)).shape == (0, 3)
    hetero = dgl.heterograph({("user", "follows", "user"): (torch.tensor([0, 1]), torch.tensor([1, 2])),
                              ("item", "bought_by", "user"): (torch.zeros(0, dtype=torch.long),
                                                               torch.zeros(0, dtype=torch.long))},
                             num_nodes_dict={"user": 3, "item": 0})
    conv = dgl.nn.HeteroGraphConv({"follows": fd.GraphConv(5, 3, allow_zero_in_degree=True),
                                   "bought_by": fd.GraphConv(5, 3, allow_zero_in_degree=True)})
    out = conv(hetero, {"user": torch.randn(3, 5), "item": torch.randn(0, 5)})
    assert out["user"].shape == (3, 3)


def test_a_read_only_cache_folder_costs_the_cache_not_the_result(tmp_path, monkeypatch):
    from fgplugin import cache
    from fgplugin.preprocess import reorder_graph

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "save_entry", refuse)
    edge_index = torch.randint(0, 50, (2, 300), generator=torch.Generator().manual_seed(3))
    with pytest.warns(CacheWarning, match="could not write its cache entry"):
        adj = reorder_graph(edge_index, 50, cache=tmp_path)
    assert torch.equal(adj.perm, reorder_graph(edge_index, 50).perm)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.undo()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adj = reorder_graph(edge_index, 50, cache=blocked)  # the cache folder is a file
    assert adj.shape == (50, 50) and any(issubclass(w.category, CacheWarning) for w in caught)


def test_an_in_place_write_to_edge_index_is_seen():
    """The layers build a graph's structure once per edge_index tensor and again after an in-place
    write that torch counts (a write in place through .numpy() or .data is not seen: docs/design.md)."""
    import fgplugin.pyg as fp

    conv = fp.GCNConv(3, 2)
    edge_index = EDGES.clone()
    x = torch.randn(4, 3)
    before = conv(x, edge_index)
    edge_index[0, 0] = 2
    assert not torch.allclose(conv(x, edge_index), before)
    assert torch.allclose(conv(x, edge_index), conv(x, edge_index.clone()))


@pytest.mark.parametrize("constant", [False, True], ids=["hidden", "first"])
def test_graphs_and_weights_given_new_data_are_seen(constant):
    """``edge_index.data = other`` and ``edge_weight.data = other`` leave the version counters as
    they were; a layer's cached structure, weighted copy, kept call and kept input must not serve
    the old graph or weights."""
    import torch_geometric.nn as pyg_nn

    import fgplugin.pyg as fp
    from fgplugin.testing import random_graph_case, rel_error

    stock = pyg_nn.GCNConv(8, 4)
    ours = fp.GCNConv(8, 4)
    ours.load_state_dict(stock.state_dict())
    edge_index = random_graph_case(0, n_src=40).edge_index
    weights = torch.rand(edge_index.shape[1])
    x = torch.randn(40, 8, requires_grad=not constant)
    for change, given in (("edges", None), ("weights", weights)):  # unweighted: the layer keeps its call
        for _ in range(3):
            ours(x, edge_index, given)
        if change == "edges":
            edge_index.data = random_graph_case(1, n_src=40).edge_index[:, :edge_index.shape[1]].clone()
        else:
            weights.data = torch.rand_like(weights)
        for _ in range(2):
            assert rel_error(ours(x, edge_index, given), stock(x, edge_index, given)) <= 1e-5, change


@pytest.mark.parametrize("what", ["features", "edges", "weights"])
def test_two_assignments_to_data_in_a_row_are_seen(what):
    """Two ``.data`` assignments between calls could put the new data at the address the caches
    keyed (the allocator reusing the block the first one freed): the caches pin what they key."""
    import torch_geometric.nn as pyg_nn

    import fgplugin.pyg as fp
    from fgplugin.testing import random_graph_case, rel_error

    stock = pyg_nn.GCNConv(16, 8)
    ours = fp.GCNConv(16, 8)
    ours.load_state_dict(stock.state_dict())
    edge_index = random_graph_case(0, n_src=100).edge_index
    weights = torch.rand(edge_index.shape[1]) if what == "weights" else None
    x = torch.randn(100, 16)
    changed = {"features": x, "edges": edge_index, "weights": weights}[what]
    with torch.no_grad():
        for _ in range(20):
            for _ in range(2):  # the second call keeps what the caches keep
                ours(x, edge_index, weights)
            changed.data = changed.data.flip(-1)
            changed.data = changed.data.clone()
            assert rel_error(ours(x, edge_index, weights), stock(x, edge_index, weights)) <= 1e-5


def test_a_functorch_wrapped_graph_is_not_cached():
    """A graph wrapped by a functorch transform has no data of its own to key a cache on: vmap
    over a batch of edge_index runs as stock."""
    import torch_geometric.nn as pyg_nn

    import fgplugin.pyg as fp

    x = torch.randn(20, 8)
    stock = pyg_nn.GCNConv(8, 4, add_self_loops=False, normalize=False)
    ours = fp.GCNConv(8, 4, add_self_loops=False, normalize=False)
    ours.load_state_dict(stock.state_dict())
    batch = torch.stack([torch.randint(0, 20, (2, 60), generator=torch.Generator().manual_seed(s)) for s in (0, 1)])
    assert torch.allclose(torch.func.vmap(lambda e: ours(x, e))(batch),
                          torch.func.vmap(lambda e: stock(x, e))(batch), atol=1e-5)


@pytest.mark.parametrize("built", ["from_edge_index", "with_values"])
def test_an_adjacency_built_once_from_learnable_weights_names_the_fix_on_its_second_backward(built):
    # its values are indexed out of the weights once, and the first backward pass frees that
    # indexing: the second backward must say so and how to fix it, not fail inside autograd with
    # torch's message alone
    torch.manual_seed(0)
    n = 40
    edge_index = torch.randint(0, n, (2, 200))
    weight = torch.rand(200, requires_grad=True)
    x = torch.randn(n, 8, requires_grad=True)
    if built == "from_edge_index":
        adj = TiledAdjacency.from_edge_index(edge_index, n, weight)
    else:
        adj = TiledAdjacency.from_edge_index(edge_index, n).with_values(weight.sigmoid())

    def product():
        return fgplugin.spmm(adj, x, *adj.norm("gcn"))

    product().sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"earlier backward pass.*adj\.with_values\(edge_weight\)"):
        product().sum().backward()
    # what reaches no weight still works: an evaluation forward, a gradient for x alone
    x.grad = None
    out = product()
    (grad_x,) = torch.autograd.grad(out.sum(), [x])
    product().sum().backward(inputs=[x])
    assert torch.allclose(x.grad, grad_x)
    with torch.no_grad():
        assert torch.isfinite(product()).all()


def test_learnable_weights_given_each_step_and_retained_graphs_keep_working():
    torch.manual_seed(0)
    n = 40
    edge_index = torch.randint(0, n, (2, 200))
    weight = torch.rand(200, requires_grad=True)
    x = torch.randn(n, 8)
    structure = TiledAdjacency.from_edge_index(edge_index, n)
    grads = []
    for _ in range(3):
        adj = structure.with_values(weight)
        fgplugin.spmm(adj, x, *adj.norm("gcn")).sum().backward()
        grads.append(weight.grad.clone())
        weight.grad = None
    assert all(torch.equal(grads[0], g) for g in grads[1:])
    # built once and backed through with retain_graph: the history stays, and gradients add up
    adj = TiledAdjacency.from_edge_index(edge_index, n, weight)
    fgplugin.spmm(adj, x).sum().backward(retain_graph=True)
    once = weight.grad.clone()
    fgplugin.spmm(adj, x).sum().backward(retain_graph=True)
    assert once.abs().sum() > 0 and torch.allclose(weight.grad, 2 * once)


def test_an_adjacency_with_learnable_weights_saves_without_warnings(tmp_path):
    weight = torch.rand(6, requires_grad=True)
    adj = TiledAdjacency.from_edge_index(torch.tensor([[0, 1, 2, 3, 1, 0], [1, 2, 3, 0, 3, 2]]), 4, weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "backward hook ... will not be serialized"
        torch.save(adj, tmp_path / "adj.pt")
    loaded = torch.load(tmp_path / "adj.pt", weights_only=False)
    assert torch.equal(loaded.values.detach(), adj.values.detach())

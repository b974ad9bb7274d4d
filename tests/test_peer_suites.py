"""What the peer libraries' own unit tests check for these layers, pointed at fgplugin's.

Adapted (not copied) from PyG's test/nn/conv/test_{gcn,sage,sg,lg}_conv.py and DGL's
tests/python/pytorch/nn/test_nn.py (GraphConv, SAGEConv, SGConv): the same inputs, the same
assertions, run against ``fgplugin.pyg`` / ``fgplugin.dgl``. Where upstream uses torch_sparse's
``SparseTensor`` and it is not installed, the check is skipped as upstream skips it.
"""
import copy
import io
import os

import pytest
import torch

# ---------------------------------------------------------------------------------------- PyG
pytest.importorskip("torch_geometric")
import torch_geometric.typing  # noqa: E402
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor  # noqa: E402

from fgplugin.pyg import GCNConv, LGConv, SAGEConv, SGConv  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Converting sparse tensor to CSR format", "ignore::DeprecationWarning")
WITH_TORCH_SPARSE = torch_geometric.typing.WITH_TORCH_SPARSE
SparseTensor = torch_geometric.typing.SparseTensor
EDGE_INDEX = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])


def test_pyg_gcn_conv():
    x, edge_index = torch.randn(4, 16), EDGE_INDEX
    value = torch.rand(edge_index.size(1))
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    adj2 = to_torch_csc_tensor(edge_index, value, size=(4, 4))
    conv = GCNConv(16, 32)
    assert str(conv) == "GCNConv(16, 32)"
    out1 = conv(x, edge_index)
    assert out1.size() == (4, 32)
    assert torch.allclose(conv(x, adj1.t()), out1, atol=1e-6)
    out2 = conv(x, edge_index, value)
    assert out2.size() == (4, 32)
    assert torch.allclose(conv(x, adj2.t()), out2, atol=1e-6)
    if WITH_TORCH_SPARSE:
        adj3 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
        adj4 = SparseTensor.from_edge_index(edge_index, value, (4, 4))
        assert torch.allclose(conv(x, adj3.t()), out1, atol=1e-6)
        assert torch.allclose(conv(x, adj4.t()), out2, atol=1e-6)
    jit = torch.jit.script(conv)
    assert torch.allclose(jit(x, edge_index), out1, atol=1e-6)
    assert torch.allclose(jit(x, edge_index, value), out2, atol=1e-6)
    conv.cached = True
    conv(x, edge_index)
    assert conv._cached_edge_index is not None
    assert torch.allclose(conv(x, edge_index), out1, atol=1e-6)
    assert torch.allclose(conv(x, adj1.t()), out1, atol=1e-6)
    if WITH_TORCH_SPARSE:
        conv(x, adj3.t())
        assert conv._cached_adj_t is not None
        assert torch.allclose(conv(x, adj3.t()), out1, atol=1e-6)


def test_pyg_gcn_conv_with_decomposed_layers():
    x, edge_index = torch.randn(4, 16), EDGE_INDEX

    def hook(module, inputs):
        assert inputs[0]["x_j"].size() == (10, 32 // module.decomposed_layers)

    conv = GCNConv(16, 32)
    conv.register_message_forward_pre_hook(hook)
    out1 = conv(x, edge_index)
    conv.decomposed_layers = 2
    assert conv.propagate.__module__.endswith("message_passing")
    assert torch.allclose(out1, conv(x, edge_index), atol=1e-6)
    torch.jit.script(conv)
    conv.decomposed_layers = 1
    assert conv.propagate.__module__.endswith("GCNConv_propagate")


def test_pyg_gcn_conv_sparse_features_static_graph_flow_and_error():
    sparse_x = torch.sparse_coo_tensor(torch.tensor([[0, 0], [0, 1]]), torch.tensor([1.0, 1.0]), (4, 16))
    assert GCNConv(16, 32)(sparse_x, EDGE_INDEX).size() == (4, 32)
    assert GCNConv(16, 32)(torch.randn(3, 4, 16), EDGE_INDEX).size() == (3, 4, 32)
    with pytest.raises(ValueError, match="does not support adding self-loops"):
        GCNConv(16, 32, normalize=False, add_self_loops=True)
    x, edge_index = torch.randn(4, 16), torch.tensor([[0, 0, 0], [1, 2, 3]])
    conv = GCNConv(16, 32, flow="source_to_target")
    out1 = conv(x, edge_index)
    conv.flow = "target_to_source"
    assert torch.allclose(out1, conv(x, edge_index.flip(0)), atol=1e-6)


@pytest.mark.parametrize("project", [False, True])
@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_pyg_sage_conv(project, aggr):
    x1, x2 = torch.randn(4, 8), torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    adj2 = to_torch_csc_tensor(edge_index, size=(4, 4))
    conv = SAGEConv(8, 32, project=project, aggr=aggr)
    assert str(conv) == f"SAGEConv(8, 32, aggr={aggr})"
    out = conv(x1, edge_index)
    assert out.size() == (4, 32)
    assert torch.allclose(conv(x1, edge_index, size=(4, 4)), out, atol=1e-6)
    assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)
    jit = torch.jit.script(conv)
    assert torch.allclose(jit(x1, edge_index), out, atol=1e-6)

    adj2 = to_torch_csc_tensor(edge_index, size=(4, 2))
    conv = SAGEConv((8, 16), 32, project=project, aggr=aggr)
    assert str(conv) == f"SAGEConv((8, 16), 32, aggr={aggr})"
    out1 = conv((x1, x2), edge_index)
    out2 = conv((x1, None), edge_index, (4, 2))
    assert out1.size() == (2, 32) and out2.size() == (2, 32)
    assert torch.allclose(conv((x1, x2), edge_index, (4, 2)), out1, atol=1e-6)
    assert torch.allclose(conv((x1, x2), adj2.t()), out1, atol=1e-6)
    assert torch.allclose(conv((x1, None), adj2.t()), out2, atol=1e-6)


def test_pyg_sage_conv_lstm_and_multi_aggr():
    x, edge_index = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    conv = SAGEConv(8, 32, aggr="lstm")
    assert str(conv) == "SAGEConv(8, 32, aggr=lstm)"
    assert conv(x, edge_index).size() == (4, 32)
    with pytest.raises(ValueError, match="'index' tensor is not sorted"):
        conv(x, torch.tensor([[0, 1, 2, 3], [1, 0, 1, 0]]))
    conv = SAGEConv(8, 32, aggr=["mean", "max", "sum"], aggr_kwargs=dict(mode="cat"))
    assert conv(x, edge_index).size() == (4, 32)


def test_pyg_sg_conv():
    x, edge_index = torch.randn(4, 16), EDGE_INDEX
    value = torch.rand(edge_index.size(1))
    adj3 = to_torch_coo_tensor(edge_index, size=(4, 4))
    adj4 = to_torch_coo_tensor(edge_index, value, size=(4, 4))
    conv = SGConv(16, 32, K=10)
    assert str(conv) == "SGConv(16, 32, K=10)"
    out1 = conv(x, edge_index)
    assert out1.size() == (4, 32)
    assert torch.allclose(conv(x, adj3.t()), out1, atol=1e-6)
    out2 = conv(x, edge_index, value)
    assert torch.allclose(conv(x, adj4.t()), out2, atol=1e-6)
    jit = torch.jit.script(conv)
    assert torch.allclose(jit(x, edge_index), out1, atol=1e-6)
    conv.cached = True
    conv(x, edge_index)
    assert conv._cached_x is not None
    assert torch.allclose(conv(x, edge_index), out1, atol=1e-6)
    assert torch.allclose(conv(x, adj3.t()), out1, atol=1e-6)


def test_pyg_lg_conv():
    x, edge_index = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    value = torch.rand(edge_index.size(1))
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    adj2 = to_torch_csc_tensor(edge_index, value, size=(4, 4))
    conv = LGConv()
    assert str(conv) == "LGConv()"
    out1 = conv(x, edge_index)
    assert out1.size() == (4, 8)
    assert torch.allclose(conv(x, adj1.t()), out1)
    out2 = conv(x, edge_index, value)
    assert torch.allclose(conv(x, adj2.t()), out2)
    jit = torch.jit.script(conv)
    assert torch.allclose(jit(x, edge_index), out1)
    assert torch.allclose(jit(x, edge_index, value), out2)


# ---------------------------------------------------------------------------------------- DGL
@pytest.fixture(scope="module")
def dgl_env():
    """(dgl, dgl.nn stock module, fgplugin.dgl) or a skip; in CI a missing DGL fails."""
    try:
        import fgplugin.dgl as fd
    except ImportError as err:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            raise
        pytest.skip(f"DGL is not usable here: {err}")
    dgl = fd.import_dgl()
    import dgl.nn.pytorch as stock_nn

    return dgl, stock_nn, fd


def dgl_cases(dgl, kinds):
    """Graphs like DGL's utils.graph_cases for the kinds asked, none with zero in-degree nodes."""
    g = torch.Generator().manual_seed(0)
    out = []
    if "homo" in kinds:
        out.append(dgl.graph(([0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2])))
        src, dst = torch.randint(0, 10, (2, 30), generator=g)
        out.append(dgl.add_self_loop(dgl.graph((src, dst), num_nodes=10)))
    if "bipartite" in kinds:
        src, dst = torch.randint(0, 6, (20,), generator=g), torch.cat([torch.arange(4), torch.randint(0, 4, (16,))])
        out.append(dgl.heterograph({("_U", "_E", "_V"): (src, dst)}, {"_U": 6, "_V": 4}))
    if "block" in kinds:
        src = torch.randint(0, 8, (12,), generator=g)
        out.append(dgl.create_block((src, torch.cat([torch.arange(4), torch.randint(0, 4, (8,))])), 8, 4))
    for graph in out:
        graph.edata["scalar_w"] = torch.rand(graph.num_edges(), generator=g) + 0.1
    return out


def _axwb(adj, x, w, b):
    x = torch.matmul(x, w)
    return torch.matmul(adj, x.view(x.shape[0], -1)).view_as(x) + b


@pytest.mark.parametrize("out_dim", [1, 2])
def test_dgl_graph_conv0(dgl_env, out_dim):
    dgl, _, fd = dgl_env
    g = dgl.graph(([0, 1, 1, 2], [1, 0, 2, 1]))  # networkx.path_graph(3)
    adj = g.adj_external(transpose=True).to_dense()
    conv = fd.GraphConv(5, out_dim, norm="none", bias=True)
    torch.save(conv, io.BytesIO())
    for h0 in (torch.ones(3, 5), torch.ones(3, 5, 5)):
        h1 = conv(g, h0)
        assert len(g.ndata) == 0 and len(g.edata) == 0
        assert torch.allclose(h1, _axwb(adj, h0, conv.weight, conv.bias))
    conv = fd.GraphConv(5, out_dim)
    for h0 in (torch.ones(3, 5), torch.ones(3, 5, 5)):
        conv(g, h0)
        assert len(g.ndata) == 0 and len(g.edata) == 0
    old_weight = copy.deepcopy(conv.weight.data)
    conv.reset_parameters()
    assert not torch.allclose(old_weight, conv.weight.data)


@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("norm", ["none", "both", "right", "left"])
@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_dgl_graph_conv(dgl_env, idtype, norm, weight, bias):
    dgl, stock_nn, fd = dgl_env
    for g in dgl_cases(dgl, ["homo", "bipartite"]):
        g = g.astype(idtype)
        for out_dim in (1, 2):
            conv = fd.GraphConv(5, out_dim, norm=norm, weight=weight, bias=bias)
            torch.save(conv, io.BytesIO())
            ext_w = torch.randn(5, out_dim)
            h = torch.randn(g.num_src_nodes(), 5)
            h_dst = torch.randn(g.num_dst_nodes(), out_dim)
            kwargs = {} if weight else {"weight": ext_w}
            assert conv(g, h, **kwargs).shape == (g.num_dst_nodes(), out_dim)
            assert conv(g, (h, h_dst), **kwargs).shape == (g.num_dst_nodes(), out_dim)
            if norm != "left":  # e_weight and e_weight_norm
                e_w = g.edata["scalar_w"]
                assert conv(g, h, edge_weight=e_w, **kwargs).shape == (g.num_dst_nodes(), out_dim)
                norm_w = stock_nn.EdgeWeightNorm(norm=norm)(g, e_w)
                assert conv(g, h, edge_weight=norm_w, **kwargs).shape == (g.num_dst_nodes(), out_dim)


@pytest.mark.parametrize("norm_type", ["both", "right", "none"])
def test_dgl_dense_graph_conv(dgl_env, norm_type):
    dgl, stock_nn, fd = dgl_env
    for g in dgl_cases(dgl, ["homo", "bipartite"]):
        for out_dim in (1, 2):
            adj = g.adj_external(transpose=True).to_dense()
            conv = fd.GraphConv(5, out_dim, norm=norm_type, bias=True)
            dense_conv = stock_nn.DenseGraphConv(5, out_dim, norm=norm_type, bias=True)
            dense_conv.weight.data = conv.weight.data
            dense_conv.bias.data = conv.bias.data
            feat = torch.randn(g.num_src_nodes(), 5)
            assert torch.allclose(conv(g, feat), dense_conv(adj, feat), atol=1e-6)


@pytest.mark.parametrize("aggre_type", ["mean", "pool", "gcn", "lstm"])
def test_dgl_sage_conv(dgl_env, aggre_type):
    dgl, _, fd = dgl_env
    for g in dgl_cases(dgl, ["homo", "block"]):
        sage = fd.SAGEConv(5, 10, aggre_type)
        torch.save(sage, io.BytesIO())
        assert sage(g, torch.randn(g.num_src_nodes(), 5)).shape[-1] == 10
    for g in dgl_cases(dgl, ["bipartite"]):
        for out_dim in (1, 2):
            dst_dim = 5 if aggre_type != "gcn" else 10
            sage = fd.SAGEConv((10, dst_dim), out_dim, aggre_type)
            h = sage(g, (torch.randn(g.num_src_nodes(), 10), torch.randn(g.num_dst_nodes(), dst_dim)))
            assert h.shape == (g.num_dst_nodes(), out_dim)


@pytest.mark.parametrize("out_dim", [1, 2])
def test_dgl_sage_conv2(dgl_env, out_dim):
    dgl, _, fd = dgl_env
    g = dgl.heterograph({("_U", "_E", "_V"): ([], [])}, {"_U": 5, "_V": 3})  # no edges
    h = fd.SAGEConv((3, 3), out_dim, "gcn")(g, (torch.randn(5, 3), torch.randn(3, 3)))
    assert h.shape == (3, out_dim)
    for aggre_type in ("mean", "pool", "lstm"):
        h = fd.SAGEConv((3, 1), out_dim, aggre_type)(g, (torch.randn(5, 3), torch.randn(3, 1)))
        assert h.shape == (3, out_dim)


@pytest.mark.parametrize("out_dim", [1, 2])
def test_dgl_sgc_conv(dgl_env, out_dim):
    dgl, _, fd = dgl_env
    for g in dgl_cases(dgl, ["homo"]):
        sgc = fd.SGConv(5, out_dim, 3)
        torch.save(sgc, io.BytesIO())
        feat = torch.randn(g.num_nodes(), 5)
        assert sgc(g, feat).shape[-1] == out_dim
        sgc = fd.SGConv(5, out_dim, 3, True)
        h_0 = sgc(g, feat)
        assert torch.allclose(h_0, sgc(g, feat + 1)) and h_0.shape[-1] == out_dim
        assert fd.SGConv(5, 5, 3)(g, feat, edge_weight=torch.ones(g.num_edges())).shape[-1] == 5

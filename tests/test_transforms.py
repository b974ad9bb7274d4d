"""The PyG and DGL BlockReorder transforms: what they permute, keep, record and refuse."""
import pytest
import torch

import fgplugin
from fgplugin.testing import rel_error
from conftest import require_dgl

torch_geometric = pytest.importorskip("torch_geometric", reason="the PyG transform needs torch_geometric")
from torch_geometric.data import Data, HeteroData, InMemoryDataset  # noqa: E402
import torch_geometric.transforms as T  # noqa: E402

from fgplugin.pyg import BlockReorder  # noqa: E402


def _data(n=120, e=900, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    return Data(x=torch.randn(n, 5, generator=g), y=torch.randint(0, 3, (n,), generator=g),
                train_mask=torch.rand(n, generator=g) < 0.5, pos=torch.randn(n, 3, generator=g),
                node_id=torch.arange(n), edge_index=edge_index, edge_attr=torch.randn(e, 2, generator=g),
                edge_weight=torch.rand(e, generator=g) + 0.5, num_nodes=n)


def test_node_attributes_permuted_edges_kept():
    data = _data()
    out = BlockReorder(method="degsort")(data)
    perm = out.perm
    assert sorted(perm.tolist()) == list(range(data.num_nodes))
    for key in ("x", "y", "train_mask", "pos", "node_id"):
        assert torch.equal(out[key], data[key][perm]), key
    assert torch.equal(out.inv_perm[perm], torch.arange(data.num_nodes))
    assert torch.equal(perm[out.edge_index], data.edge_index)  # same edges, same order, new ids
    assert torch.equal(out.edge_attr, data.edge_attr) and torch.equal(out.edge_weight, data.edge_weight)
    assert isinstance(out.adj_t, fgplugin.TiledAdjacency) and out.adj_t.values is not None


def test_gcn_on_reordered_graph_maps_back_to_original():
    data = _data()
    out = BlockReorder(method="community", parts=2)(data)
    original = fgplugin.TiledAdjacency.from_edge_index(data.edge_index, data.num_nodes, data.edge_weight)
    reference = fgplugin.spmm(original, data.x, *original.norm("gcn"))
    reordered = fgplugin.spmm(out.adj_t, out.x, *out.adj_t.norm("gcn"))
    assert rel_error(reordered[out.inv_perm], reference) <= 1e-5


def test_applied_twice_composes_permutations():
    data = _data()
    twice = T.Compose([BlockReorder(method="degsort"), BlockReorder(method="rcm")])(data)
    assert torch.equal(twice.node_id, twice.perm)  # node_id records the original ids
    assert torch.equal(twice.x, data.x[twice.perm])


def test_heterodata_is_refused():
    hetero = HeteroData()
    hetero["paper"].x = torch.randn(3, 2)
    hetero["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="HeteroData"):
        BlockReorder()(hetero)


def test_pre_transform_saved_and_reloaded(tmp_path):
    class OneGraph(InMemoryDataset):
        def __init__(self, root, pre_transform):
            super().__init__(root, pre_transform=pre_transform)
            self.load(self.processed_paths[0])

        @property
        def raw_file_names(self):
            return []

        @property
        def processed_file_names(self):
            return ["data.pt"]

        def process(self):
            self.save([self.pre_transform(_data())], self.processed_paths[0])

    first = OneGraph(str(tmp_path), BlockReorder(method="degsort"))[0]
    again = OneGraph(str(tmp_path), BlockReorder(method="degsort"))[0]  # loads data.pt (weights_only)
    assert isinstance(again.adj_t, fgplugin.TiledAdjacency)
    assert torch.equal(again.perm, first.perm) and torch.equal(again.x, first.x)
    x = torch.randn(again.num_nodes, 4)
    assert torch.equal(fgplugin.spmm(again.adj_t, x), fgplugin.spmm(first.adj_t, x))
    assert again.to("cpu").adj_t.device.type == "cpu"


def test_attributes_holding_node_ids_are_renumbered():
    """PyG's node-id attributes (``*index`` keys, ``face``) get the new ids, in their order."""
    data = _data(n=30, e=120)
    data.face = torch.randint(0, 30, (3, 12))
    data.edge_label_index = torch.randint(0, 30, (2, 7))
    out = BlockReorder(method="degsort")(data)
    for key in ("face", "edge_label_index"):
        assert torch.equal(out.perm[out[key]], data[key]), key
        assert torch.equal(out.pos[out[key]], data.pos[data[key]]), key  # the same nodes
    bad = _data(n=30, e=120)
    bad.edge_label_index = torch.tensor([[0, 30], [1, 2]])
    with pytest.raises(ValueError, match="edge_label_index.*outside"):
        BlockReorder()(bad)
    bad.edge_label_index = torch.tensor([[0.0, 1.0], [1.0, 2.0]])
    with pytest.raises(TypeError, match="edge_label_index.*dtype"):
        BlockReorder()(bad)


def test_as_many_nodes_as_edges_keeps_edge_weights_with_their_edges():
    """With as many nodes as edges PyG tells edge attributes by name: the weights' key is never
    permuted as a node attribute, and the keys ruled by name are named in a warning."""
    n = 6
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 4], [1, 2, 3, 2, 3, 5]])
    data = Data(x=torch.randn(n, 2), edge_index=edge_index, w=torch.arange(1.0, 7.0), score=torch.arange(6.0),
                num_nodes=n)
    with pytest.warns(UserWarning, match=r"\['score'\]"):
        out = BlockReorder(method="degsort", edge_weight_key="w")(data)
    assert torch.equal(out.w, data.w) and torch.equal(out.score, data.score[out.perm])
    rebuilt = fgplugin.TiledAdjacency.from_edge_index(out.edge_index, n, out.w)
    x = torch.randn(n, 3)
    assert torch.equal(fgplugin.spmm(out.adj_t, x), fgplugin.spmm(rebuilt, x))


def test_lists_and_arrays_per_node_are_permuted():
    np = pytest.importorskip("numpy")
    data = _data(n=40, e=200)
    data.raw_texts = [f"node {i}" for i in range(40)]
    data.feat_np = np.arange(40) * 10
    out = BlockReorder(method="degsort")(data)
    assert out.raw_texts == [f"node {i}" for i in out.perm.tolist()]
    assert (out.feat_np == out.perm.numpy() * 10).all()


def test_batches_and_a_missing_weight_key_are_refused():
    from torch_geometric.data import Batch
    batch = Batch.from_data_list([_data(n=20, e=60, seed=s) for s in range(3)])
    with pytest.raises(ValueError, match="not a batch"):
        BlockReorder()(batch)
    with pytest.raises(KeyError, match="edge_weight_key='weights'"):
        BlockReorder(edge_weight_key="weights")(_data())
    del_weight = _data()
    del del_weight.edge_weight
    assert BlockReorder()(del_weight).adj_t.values is None  # the default key may be absent: unit weights


def test_cache_option_is_checked_and_learnable_weights_keep_their_gradient(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="cache= takes"):
        BlockReorder(cache=1)
    assert BlockReorder(cache=None).cache is False
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    data = _data(n=50, e=300)
    BlockReorder(method="degsort", cache="~/fgcache")(data)
    assert len(list((tmp_path / "fgcache").glob("*.pt"))) == 1 and not (tmp_path / "~").exists()
    x = torch.randn(50, 3)
    grads = []
    for cache in (False, tmp_path / "learnable", tmp_path / "learnable"):  # built, then read from the cache
        w = data.edge_weight.clone().requires_grad_()
        adj = fgplugin.preprocess.reorder_graph(data.edge_index, 50, w, method="degsort", cache=cache)
        fgplugin.spmm(adj, x[adj.perm]).sum().backward()
        grads.append(w.grad)
    assert all(g is not None and torch.allclose(g, grads[0]) for g in grads)
    assert len(list((tmp_path / "learnable").glob("*.pt"))) == 1


def test_dgl_transform_keeps_the_id_type_and_refuses_batches():
    dgl = require_dgl()
    import fgplugin.dgl as fd
    from fgplugin.dgl.convs import edges_by_id

    data = _data(n=40, e=200)
    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=40, idtype=torch.int32)
    g.ndata["x"], g.edata["w"] = data.x, data.edge_weight
    out = fd.BlockReorder(method="degsort")(g)
    perm = out.ndata["perm"]
    assert out.idtype == torch.int32 and torch.equal(out.ndata["x"], data.x[perm])
    src, dst = out.edges(order="eid")
    assert torch.equal(perm[src.long()], data.edge_index[0]) and torch.equal(out.edata["w"], data.edge_weight)
    with pytest.raises(ValueError, match="not a batch of 2"):
        fd.BlockReorder()(dgl.batch([g, g]))
    from fgplugin.reorder import reorder
    ordered = fd.BlockReorder(method="slashburn", method_options=dict(k=1))(g)
    assert torch.equal(ordered.ndata["perm"], reorder(data.edge_index, "slashburn", num_nodes=40, k=1))
    for formats in ("csc", "csr"):  # restricted formats (no COO): the same edges, in their order
        out = fd.BlockReorder(method="degsort")(g.formats(formats))
        src, dst = edges_by_id(out)
        assert torch.equal(out.ndata["perm"][src.long()], data.edge_index[0]), formats
        assert torch.equal(out.ndata["perm"][dst.long()], data.edge_index[1]), formats
        assert sum(out.formats().values(), []) == [formats]  # the restriction kept


@pytest.mark.parametrize("layer,args", [("GraphConv", (5, 4)), ("SAGEConv", (5, 4, "mean")), ("SGConv", (5, 4, 2))])
def test_dgl_layers_serve_edge_weights_on_a_reordered_graph(monkeypatch, layer, args):
    """DGL's layers take edge weights per call, in the graph's edge order: on a graph from
    BlockReorder fgplugin serves them (the stock code is not run) and matches stock on the input."""
    dgl = require_dgl()
    import fgplugin.dgl as fd
    from dgl.nn.pytorch import conv as dgl_conv

    data = _data(n=40, e=200)
    g = dgl.add_self_loop(dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=40))
    g.edata["w"] = torch.rand(g.num_edges()) + 0.5
    out = fd.BlockReorder(method="degsort")(g)
    torch.manual_seed(0)
    stock = getattr(dgl_conv, layer)(*args)
    ours = getattr(fd, layer)(*args)
    ours.load_state_dict(stock.state_dict())
    expected = stock(g, data.x, edge_weight=g.edata["w"])

    def refused(*args, **kwargs):
        raise AssertionError(f"the stock {layer} ran")

    monkeypatch.setattr(getattr(dgl_conv, layer), "forward", refused)
    got = ours(out, data.x[out.ndata["perm"]], edge_weight=out.edata["w"])
    assert torch.allclose(got, expected[out.ndata["perm"]], rtol=1e-5, atol=1e-6)

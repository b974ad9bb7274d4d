"""The PyG and DGL BlockReorder transforms: what they permute, keep, record and refuse."""
import pytest
import torch

import fgplugin
from fgplugin.testing import rel_error

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

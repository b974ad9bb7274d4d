"""A DGL model of fgplugin.dgl layers on a graph sharded by fgplugin.distributed.shard_dgl + DDP, on
CPUs with gloo: on 2 and 4 ranks (1D and 1.5D) the outputs, gradients and losses of stock DGL's
layers trained in one process on the whole graph, in float64 to rounding."""
import pytest
import torch
import torch.nn.functional as F

from conftest import require_dgl
from test_distributed import _launch, _ok
from test_distributed_models import _train, check_ranks_match, error_of

N, FEATURES, CLASSES = 150, 12, 4
# (layer, options): every normalization of GraphConv, SAGEConv mean, SGConv
MODELS = ("graphconv-both", "graphconv-right", "graphconv-left", "graphconv-none", "sage", "sg")


def _graph():
    """A directed random graph with duplicate edges and self loops added (as DGL's GCN example
    does), features, labels and a training mask: the same on every rank (seeded)."""
    dgl = require_dgl()
    g = torch.Generator().manual_seed(12)
    src, dst = torch.randint(0, N, (2, 900), generator=g)
    graph = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=N))
    graph.ndata["feat"] = torch.randn(N, FEATURES, generator=g, dtype=torch.float64)
    graph.ndata["label"] = torch.randint(0, CLASSES, (N,), generator=g)
    graph.ndata["train_mask"] = torch.rand(N, generator=g) < 0.3
    return graph


class _Net(torch.nn.Module):
    def __init__(self, kind, nn):
        super().__init__()
        if kind.startswith("graphconv"):
            norm = kind.split("-")[1]
            self.convs = torch.nn.ModuleList([nn.GraphConv(FEATURES, 16, norm=norm), nn.GraphConv(16, CLASSES, norm=norm)])
        elif kind == "sage":
            self.convs = torch.nn.ModuleList([nn.SAGEConv(FEATURES, 16, "mean"), nn.SAGEConv(16, CLASSES, "mean")])
        else:
            self.convs = torch.nn.ModuleList([nn.SGConv(FEATURES, CLASSES, k=2)])

    def forward(self, x, graph):  # the PyG test's calling convention, so that its training loop serves
        for i, conv in enumerate(self.convs):
            x = conv(graph, x)
            if i + 1 < len(self.convs):
                x = x.relu()
        return x


def _model(kind, nn):
    torch.manual_seed(3)
    return _Net(kind, nn).double()


def _stock(kind):
    """Stock DGL's layers on the whole graph in one process."""
    dgl = require_dgl()
    graph = _graph()
    mask = graph.ndata["train_mask"]
    return _train(_model(kind, dgl.nn), graph.ndata["feat"], graph, graph.ndata["label"], mask,
                  lambda o, y, m: (F.cross_entropy(o[m], y[m]), float(F.cross_entropy(o[m], y[m]).detach())))


def _ranks(rank, world, replication, formats):
    import fgplugin.dgl as fd
    from fgplugin.distributed import (ShardingContext, gather_rows, global_mean, masked_loss, replicate,
                                      shard_dgl)

    ctx = ShardingContext(replication)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(5))
    adj, ndata = shard_dgl(_graph().formats(formats), ctx, perm=perm)
    results = {}
    for kind in MODELS:
        model = replicate(_model(kind, fd), ctx)

        def loss_of(o, y, m):
            return masked_loss(o, y, m, ctx), global_mean(F.cross_entropy(o[m], y[m], reduction="sum"), m.sum())

        out, grads, losses = _train(model, ndata["feat"], adj, ndata["label"], ndata["train_mask"], loss_of)
        results[kind] = (gather_rows(out, adj.global_ids(), N).numpy(), [g.numpy() for g in grads], losses)
    return results


@pytest.fixture(scope="module")
def references():
    return {kind: _stock(kind) for kind in MODELS}


# the 1.5D case on a graph restricted to CSC (DGL's memory saving; no COO to read the edges from)
@pytest.mark.parametrize("world, replication, formats", [(2, 1, ["coo", "csr", "csc"]), (4, 2, ["csc"])])
def test_dgl_models_on_a_sharded_graph_match_stock_dgl_in_one_process(world, replication, formats, references):
    check_ranks_match(_ok(_launch(world, _ranks, replication, formats, deadline_s=300), world), references)


def _bad_input(rank, world):
    dgl = require_dgl()
    import fgplugin.dgl as fd
    from fgplugin.distributed import ShardingContext, replicate, shard_dgl

    ctx = ShardingContext(1)
    graph = _graph()
    adj, ndata = shard_dgl(graph, ctx)
    x = ndata["feat"].float()
    errors = {}

    def refusal(fn):
        return error_of(fn, (ValueError, dgl.DGLError))

    errors["gat"] = refusal(lambda: replicate(torch.nn.Sequential(dgl.nn.GATConv(FEATURES, 4, 1)), ctx))
    errors["stock-graphconv"] = refusal(lambda: replicate(torch.nn.Sequential(dgl.nn.GraphConv(FEATURES, 4)), ctx))
    errors["sage-pool"] = refusal(lambda: replicate(torch.nn.Sequential(fd.SAGEConv(FEATURES, 4, "pool")), ctx))
    errors["sage-pool-call"] = refusal(lambda: fd.SAGEConv(FEATURES, 4, "pool")(adj, x))
    errors["weights"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(adj, x, edge_weight=torch.ones(graph.num_edges())))
    errors["whole-x"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(adj, graph.ndata["feat"].float()[:-1]))
    errors["x-elsewhere"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(adj, x.to("meta")))
    errors["no-context"] = error_of(lambda: shard_dgl(graph, None), (TypeError,))
    errors["other-dtype"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(adj, x.double() if rank == 1 else x))
    whole = graph.ndata["feat"].float()
    errors["one-rank-whole-x"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(adj, whole if rank == 1 else x))
    bare = dgl.graph(graph.edges(), num_nodes=N + 3)  # three nodes without in-edges
    bare_adj, bare_data = shard_dgl(bare, ctx)
    feats = torch.randn(bare_adj.num_rows, FEATURES)
    errors["zero-in-degree"] = refusal(lambda: fd.GraphConv(FEATURES, 4)(bare_adj, feats))
    errors["zero-in-degree-allowed"] = refusal(lambda: fd.GraphConv(FEATURES, 4, allow_zero_in_degree=True)(bare_adj, feats))
    errors["sg-zero-in-degree"] = refusal(lambda: fd.SGConv(FEATURES, 4, allow_zero_in_degree=True)(bare_adj, feats))
    hetero = dgl.heterograph({("a", "r", "b"): (torch.tensor([0]), torch.tensor([0]))})
    errors["hetero"] = refusal(lambda: shard_dgl(hetero, ctx))
    return errors


def test_what_cannot_be_sharded_is_refused_by_name():
    ranks = _ok(_launch(2, _bad_input, deadline_s=120), 2)
    for rank, errors in ranks.items():
        assert "'0' (GATConv) cannot run on a sharded graph" in errors["gat"], errors
        assert "'0' (GraphConv) cannot run on a sharded graph" in errors["stock-graphconv"], errors
        assert "convert(model)" in errors["stock-graphconv"], errors
        assert "'pool'" in errors["sage-pool"] and "only the mean" in errors["sage-pool"], errors
        assert "'pool'" in errors["sage-pool-call"] and "sharded graph" in errors["sage-pool-call"], errors
        assert "takes no edge weights" in errors["weights"], errors
        assert "this rank's" in errors["whole-x"], errors
        assert "on meta" in errors["x-elsewhere"] and "on cpu" in errors["x-elsewhere"], errors
        assert "takes this run's ShardingContext" in errors["no-context"], errors
        assert "here GraphConv" in errors["other-dtype"] and "features' dtype" in errors["other-dtype"], errors
        assert "x holds this rank's rows (dim 0): rank 0=1, rank 1=0" in errors["one-rank-whole-x"], errors
        assert "0-in-degree" in errors["zero-in-degree"] and "allow_zero_in_degree" in errors["zero-in-degree"], errors
        assert errors["zero-in-degree-allowed"] is None, errors
        assert "add self loops" in errors["sg-zero-in-degree"], errors
        assert "one node and one edge type" in errors["hetero"], errors

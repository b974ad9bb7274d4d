"""fgplugin as a drop-in for DGL: one ``patch()``, then an unmodified 2-layer GraphConv network.

    python examples/dgl_drop_in.py                              # a generated community graph
    python examples/dgl_drop_in.py cora.npz      # a real graph in fgplugin's .npz format
    python examples/dgl_drop_in.py --stock                      # the same script on stock DGL

``fgplugin.dgl.convert(model)`` does the same for a model that already exists. DGL is imported
through ``fgplugin.dgl.import_dgl()``, which makes PyPI's DGL 2.1 importable under newer torch.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import fgplugin.dgl
from fgplugin.datasets import community_graph, load_npz

dgl = fgplugin.dgl.import_dgl()


def build_model(in_feats, num_classes):
    from dgl.nn import GraphConv  # resolved when called: fgplugin's after patch()

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GraphConv(in_feats, 16, activation=F.relu)
            self.conv2 = GraphConv(16, num_classes)
            self.dropout = torch.nn.Dropout(0.5)

        def forward(self, g, x):
            return self.conv2(g, self.dropout(self.conv1(g, self.dropout(x))))

    return GCN()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", help=".npz graph with x, y and masks (default: a generated graph)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--stock", action="store_true", help="run stock DGL (no patch())")
    args = parser.parse_args()
    if not args.stock:
        fgplugin.dgl.patch()  # from here dgl.nn.GraphConv is fgplugin.dgl.GraphConv

    data = load_npz(args.data, features="dense") if args.data else community_graph("tiny", seed=0)
    graph = dgl.add_self_loop(dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes))
    torch.manual_seed(0)
    model = build_model(data.x.shape[1], data.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    labelled = data.train_mask & (data.y >= 0)

    start = time.perf_counter()
    for _ in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(graph, data.x)[labelled], data.y[labelled]).backward()
        optimizer.step()
    ms_per_epoch = 1000 * (time.perf_counter() - start) / max(args.epochs, 1)

    model.eval()
    with torch.no_grad():
        pred = model(graph, data.x).argmax(dim=1)
    test = data.test_mask & (data.y >= 0)
    accuracy = float((pred[test] == data.y[test]).float().mean())
    layer = type(model.conv1)
    print(f"{data.name}: {layer.__module__}.{layer.__name__}, test accuracy {accuracy:.1%}, "
          f"{ms_per_epoch:.1f} ms/epoch (DGL {dgl.__version__}, CPU)")


if __name__ == "__main__":
    main()

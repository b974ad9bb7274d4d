"""fgplugin as a drop-in for PyTorch Geometric: one ``patch()``, then an unmodified 2-layer GCN.

    python examples/pyg_drop_in.py                              # a generated community graph
    python examples/pyg_drop_in.py cora.npz      # a real graph in fgplugin's .npz format
    python examples/pyg_drop_in.py --stock                      # the same script on stock PyG

``fgplugin.pyg.convert(model)`` does the same for a model that already exists.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import fgplugin.pyg
from fgplugin.datasets import community_graph, load_npz


def build_model(in_channels, num_classes):
    from torch_geometric.nn import GCNConv  # resolved when called: fgplugin's after patch()

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(in_channels, 16, cached=True)
            self.conv2 = GCNConv(16, num_classes, cached=True)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.5, training=self.training)
            x = F.relu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    return GCN()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", help=".npz graph with x, y and masks (default: a generated graph)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--stock", action="store_true", help="run stock PyG (no patch())")
    args = parser.parse_args()
    if not args.stock:
        fgplugin.pyg.patch()  # from here torch_geometric.nn.GCNConv is fgplugin.pyg.GCNConv

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = (load_npz(args.data, features="dense") if args.data else community_graph("tiny", seed=0)).to(device)
    torch.manual_seed(0)
    model = build_model(data.x.shape[1], data.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    labelled = data.train_mask & (data.y >= 0)

    start = time.perf_counter()
    for _ in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(data.x, data.edge_index)[labelled], data.y[labelled]).backward()
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    ms_per_epoch = 1000 * (time.perf_counter() - start) / max(args.epochs, 1)

    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(dim=1)
    test = data.test_mask & (data.y >= 0)
    accuracy = float((pred[test] == data.y[test]).float().mean())
    layer = type(model.conv1)
    print(f"{data.name}: {layer.__module__}.{layer.__name__}, test accuracy {accuracy:.1%}, "
          f"{ms_per_epoch:.1f} ms/epoch on {device}")


if __name__ == "__main__":
    main()

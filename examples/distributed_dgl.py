"""Your own DGL model, full-batch, on several GPUs or CPU processes: fgplugin.distributed.shard_dgl
gives each rank its rows of the graph, the model (of fgplugin.dgl layers) is the one you train in
one process, DDP averages the gradients.

    # CPU only (gloo), on a fresh clone: a generated community graph of 20,000 nodes
    torchrun --standalone --nproc_per_node=2 examples/distributed_dgl.py --backend gloo
    torchrun --standalone --nproc_per_node=2 examples/distributed_dgl.py --backend gloo --model sage
    # 4 GPUs of one machine (NCCL); --replication 2 for 1.5D, --wire bf16 to exchange rows in bf16
    torchrun --standalone --nproc_per_node=4 examples/distributed_dgl.py --graph products-like

``--model gcn`` is DGL's GCN example (GraphConv, dropout between the layers, self loops added to
the graph), ``--model sage`` a 2-layer GraphSAGE (mean). ``--graph`` is a synthetic preset or an
``.npz`` graph (a path, or a name in ``$FGPLUGIN_DATA_DIR``).
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fgplugin.datasets as datasets
import fgplugin.dgl as fgdgl
from fgplugin.distributed import (ShardingContext, block_order, global_mean, init_distributed, masked_accuracy,
                                  masked_loss, replicate, shard_dgl)

dgl = fgdgl.import_dgl()  # through fgplugin's import shim (see the README's install notes)


class GCN(torch.nn.Module):
    """DGL's examples/pytorch/gcn model, with fgplugin's layers."""

    def __init__(self, in_size, hidden, out_size):
        super().__init__()
        self.layers = torch.nn.ModuleList([fgdgl.GraphConv(in_size, hidden, activation=F.relu),
                                           fgdgl.GraphConv(hidden, out_size)])
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, g, features):
        h = features
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(g, h)
        return h


class SAGE(torch.nn.Module):
    def __init__(self, in_size, hidden, out_size):
        super().__init__()
        self.conv1 = fgdgl.SAGEConv(in_size, hidden, "mean")
        self.conv2 = fgdgl.SAGEConv(hidden, out_size, "mean")

    def forward(self, g, features):
        h = F.dropout(self.conv1(g, features).relu(), p=0.5, training=self.training)
        return self.conv2(g, h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="small")
    ap.add_argument("--model", choices=("gcn", "sage"), default="gcn")
    ap.add_argument("--replication", type=int, default=1, help="1 = 1D; r > 1 = 1.5D (needs r*r <= ranks)")
    ap.add_argument("--reorder", default="community", help="fgplugin.reorder method, or 'none'")
    ap.add_argument("--wire", choices=("same", "bf16"), default="same",
                    help="dtype of the exchanged feature rows: as computed, or bf16 (half the traffic; the "
                         "received rows are multiplied in bf16)")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--backend", default=None, help="nccl (default with GPUs) or gloo")
    args = ap.parse_args()

    device = init_distributed(args.backend)
    ctx = ShardingContext(args.replication, comm_dtype=torch.bfloat16 if args.wire == "bf16" else None)
    g = datasets.load_graph(args.graph, device)
    graph = dgl.graph((g.edge_index[0], g.edge_index[1]), num_nodes=g.num_nodes, device=device)
    if args.model == "gcn":
        graph = dgl.add_self_loop(dgl.remove_self_loop(graph))  # as DGL's GCN example
    graph.ndata.update({"feat": g.x.to(device), "label": g.y.to(device), "train_mask": g.train_mask.to(device),
                        "test_mask": g.test_mask.to(device)})

    # Algorithm 2: one part per row block, computed once and broadcast
    perm = None if args.reorder == "none" else block_order(g.edge_index, g.num_nodes, ctx, args.reorder)
    adj, ndata = shard_dgl(graph, ctx, perm=perm)
    num_classes = int(g.num_classes)
    del g, graph

    model = (GCN if args.model == "gcn" else SAGE)(ndata["feat"].shape[1], args.hidden, num_classes).to(device)
    model = replicate(model, ctx)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    x, y, train, test = ndata["feat"], ndata["label"], ndata["train_mask"], ndata["test_mask"]
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        masked_loss(model(adj, x), y, train, ctx).backward()
        optimizer.step()
        if epoch == 1:  # the first epoch also builds the kernel plans: timed apart
            if device.type == "cuda":
                torch.cuda.synchronize()
            first, start = time.perf_counter() - start, time.perf_counter()
        if epoch % 10 == 0 or epoch == args.epochs:
            model.eval()
            with torch.no_grad():
                out = model(adj, x)
            loss = global_mean(F.cross_entropy(out[train], y[train], reduction="sum"), train.sum())
            accuracy = masked_accuracy(out, y, test)
            if ctx.rank == 0:
                print(f"epoch {epoch:4d}  train loss {loss:.4f}  test accuracy {accuracy:.3f}", flush=True)
    if ctx.rank == 0:
        per_epoch = (time.perf_counter() - start) * 1e3 / max(1, args.epochs - 1)
        print(f"{args.epochs} epochs of {args.model} on {ctx.world_size} ranks (r={ctx.replication}, wire {ctx.comm_dtype or 'as computed'}): the first "
              f"{first:.2f} s, then {per_epoch:.2f} ms per epoch (evaluation every 10th included)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Your own PyG model, full-batch, on several GPUs or CPU processes: fgplugin.distributed.shard
gives each rank its rows of the graph, the model is the one you train in one process, DDP
averages the gradients.

    # CPU only (gloo), on a fresh clone: a generated community graph of 20,000 nodes
    torchrun --standalone --nproc_per_node=2 examples/distributed_pyg.py --backend gloo
    torchrun --standalone --nproc_per_node=2 examples/distributed_pyg.py --backend gloo --model sage
    # 4 GPUs of one machine (NCCL); --replication 2 for 1.5D, --wire bf16 to exchange rows in bf16
    torchrun --standalone --nproc_per_node=4 examples/distributed_pyg.py --graph products-like
    # 2 machines of 4 GPUs: the same command on each
    torchrun --nnodes 2 --nproc_per_node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 examples/distributed_pyg.py

``--model gcn`` is PyG's ``examples/gcn.py`` model (dropout on the input and between the layers),
``--model sage`` a 2-layer GraphSAGE (mean). ``--graph`` is a synthetic preset or an ``.npz``
graph (a path, or a name in ``$FGPLUGIN_DATA_DIR``).
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch_geometric.data import Data

import fgplugin.datasets as datasets
import fgplugin.pyg as fg
from fgplugin.distributed import (ShardingContext, block_order, global_mean, init_distributed, masked_accuracy,
                                  masked_loss, replicate, shard)


class GCN(torch.nn.Module):
    """PyG's examples/gcn.py, with fgplugin's layers."""

    def __init__(self, in_channels, hidden, out_channels):
        super().__init__()
        self.conv1 = fg.GCNConv(in_channels, hidden, cached=True)
        self.conv2 = fg.GCNConv(hidden, out_channels, cached=True)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden, out_channels):
        super().__init__()
        self.conv1 = fg.SAGEConv(in_channels, hidden)
        self.conv2 = fg.SAGEConv(hidden, out_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


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
    data = Data(x=g.x, y=g.y, edge_index=g.edge_index, train_mask=g.train_mask, test_mask=g.test_mask,
                num_nodes=g.num_nodes)

    # Algorithm 2: one part per row block, computed once and broadcast
    perm = None if args.reorder == "none" else block_order(data.edge_index, data.num_nodes, ctx, args.reorder)
    local = shard(data, ctx, perm=perm)
    num_classes = int(g.num_classes)
    del g, data

    model = (GCN if args.model == "gcn" else SAGE)(local.x.shape[1], args.hidden, num_classes).to(device)
    model = replicate(model, ctx)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        out = model(local.x, local.adj_t)
        masked_loss(out, local.y, local.train_mask, ctx).backward()
        optimizer.step()
        if epoch == 1:  # the first epoch also builds the kernel plans: timed apart
            if device.type == "cuda":
                torch.cuda.synchronize()
            first, start = time.perf_counter() - start, time.perf_counter()
        if epoch % 10 == 0 or epoch == args.epochs:
            model.eval()
            with torch.no_grad():
                out = model(local.x, local.adj_t)
            loss = global_mean(F.cross_entropy(out[local.train_mask], local.y[local.train_mask], reduction="sum"),
                               local.train_mask.sum())
            test = masked_accuracy(out, local.y, local.test_mask)
            if ctx.rank == 0:
                print(f"epoch {epoch:4d}  train loss {loss:.4f}  test accuracy {test:.3f}", flush=True)
    if ctx.rank == 0:
        per_epoch = (time.perf_counter() - start) * 1e3 / max(1, args.epochs - 1)
        print(f"{args.epochs} epochs of {args.model} on {ctx.world_size} ranks (r={ctx.replication}, wire {ctx.comm_dtype or 'as computed'}): the first "
              f"{first:.2f} s, then {per_epoch:.2f} ms per epoch (evaluation every 10th included)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

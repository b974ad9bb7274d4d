"""Full-batch multi-GPU training with 1D and 1.5D row-wise sharding over torch.distributed.

Run under ``torchrun`` (NCCL on GPUs, gloo on CPU)::

    device = init_distributed()                          # timeouts: FGPLUGIN_DIST_TIMEOUT
    ctx = ShardingContext(replication=1)                 # 1D; replication=2 for 1.5D
    perm = block_order(edge_index, n, ctx)               # Algorithm 2, on rank 0, broadcast
    graph = ShardedGraph.from_edge_index(ctx, edge_index, n, perm=perm)
    x, y, train = graph.rows(x), graph.rows(y), graph.rows(train_mask)
    model = DistGCN((x.shape[1], 64, num_classes)).to(device)
    trainer = DistributedTrainer(model, graph, x, y, train, torch.optim.Adam(model.parameters(), lr=0.01))
    for epoch in range(200):
        trainer.step()

See examples/distributed_gcn.py and docs/design.md ("Distributed").
"""
from .context import DEFAULT_TIMEOUT_S, BlockLayout, RankFailureError, ShardingContext, init_distributed
from .ddp import gather_rows, global_mean, masked_accuracy, masked_loss, replicate
from .profile import Profiler
from .sharded_data import ShardedAdjacency, block_order, shard, shard_dgl
from .sharding import ColumnBlock, ShardedGraph, dist_spmm
from .train import DistGCN, DistributedTrainer, relative_error

__all__ = [
    "init_distributed", "ShardingContext", "BlockLayout", "RankFailureError", "DEFAULT_TIMEOUT_S",
    "ShardedGraph", "ColumnBlock", "dist_spmm", "DistGCN", "DistributedTrainer", "Profiler",
    "relative_error", "shard", "shard_dgl", "block_order", "ShardedAdjacency", "replicate", "masked_loss",
    "masked_accuracy", "global_mean", "gather_rows",
]

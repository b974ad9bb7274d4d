"""Full-batch GCN on several GPUs (or CPU processes) with fgplugin.distributed.

    # CPU only (gloo), e.g. on a laptop: a generated community graph of 20,000 nodes
    torchrun --standalone --nproc_per_node=2 examples/distributed_gcn.py --backend gloo
    # GPUs (NCCL), 1D and 1.5D
    torchrun --standalone --nproc_per_node=4 examples/distributed_gcn.py --graph products-like
    torchrun --standalone --nproc_per_node=4 examples/distributed_gcn.py --graph products-like --replication 2

``--graph`` is a synthetic preset (``small`` by default, ``products-like``, ...; generated on each
rank's device, same seed = same graph) or a real graph in the ``.npz`` format: a path, or a name
in ``$FGPLUGIN_DATA_DIR``. Every rank reads the whole edge list once and keeps its row block;
rank 0 computes the ordering (block-wise, one part per row block: Algorithm 2) and broadcasts it.
``--checkpoint ckpt.pt`` saves every ``--save-every`` epochs and at the end, and resumes from the
file when it exists (training then runs up to ``--epochs`` in all).
"""
import argparse
import time

import torch
import torch.distributed as dist

import fgplugin.datasets as datasets
from fgplugin.distributed import (DistGCN, DistributedTrainer, ShardedGraph, ShardingContext, block_order,
                                  init_distributed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="small")
    ap.add_argument("--replication", type=int, default=1, help="1 = 1D; r > 1 = 1.5D (needs r*r <= ranks)")
    ap.add_argument("--comm", choices=("auto", "sparse", "broadcast"), default="auto",
                    help="feature exchange; auto: sparse when ranks read at most half of the others' rows")
    ap.add_argument("--wire", choices=("same", "bf16"), default="same",
                    help="dtype of the exchanged feature rows: as computed, or bf16 (half the traffic; the "
                         "received rows are multiplied in bf16)")
    ap.add_argument("--reorder", default="community", help="fgplugin.reorder method, or 'none'")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--backend", default=None, help="nccl (default with GPUs) or gloo")
    ap.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--save-every", type=int, default=50)
    args = ap.parse_args()

    device = init_distributed(args.backend, timeout=args.timeout)
    ctx = ShardingContext(args.replication, comm=args.comm,
                          comm_dtype=torch.bfloat16 if args.wire == "bf16" else None)
    rank = ctx.rank
    data = datasets.load_graph(args.graph, device)
    n = data.num_nodes

    perm = None
    if args.reorder != "none":
        t = time.perf_counter()
        perm = block_order(data.edge_index, n, ctx, args.reorder)
        if rank == 0:
            print(f"reorder {args.reorder} (parts={ctx.num_blocks}): {time.perf_counter() - t:.2f} s", flush=True)

    graph = ShardedGraph.from_edge_index(ctx, data.edge_index, n, perm=perm,
                                         extra_fingerprint=(data.num_features, data.num_classes))
    x, y = graph.rows(data.x), graph.rows(data.y)
    masks = {k: graph.rows(getattr(data, k)) for k in ("train_mask", "val_mask", "test_mask")
             if getattr(data, k) is not None}
    num_classes = data.num_classes
    del data
    print(f"[rank {rank}] {graph}", flush=True)

    model = DistGCN((x.shape[1], args.hidden, num_classes)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    trainer = DistributedTrainer(model, graph, x, y, masks["train_mask"], opt, val_mask=masks.get("val_mask"),
                                 test_mask=masks.get("test_mask"))
    # rank 0's file decides for every rank (the others may have no copy: another machine)
    if args.checkpoint and trainer.load_checkpoint(args.checkpoint, missing_ok=True) is not None:
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {trainer.epoch}", flush=True)
    first_epoch = trainer.epoch

    t0 = time.perf_counter()
    while trainer.epoch < args.epochs:
        stats = trainer.step()
        if trainer.epoch % 10 == 0 or trainer.epoch == args.epochs:
            acc = trainer.evaluate()
            if rank == 0:
                print(f"epoch {trainer.epoch:4d}  loss {stats['loss']:.4f}  " +
                      "  ".join(f"{k} {v:.3f}" for k, v in acc.items()), flush=True)
        if args.checkpoint and (trainer.epoch % args.save_every == 0 or trainer.epoch == args.epochs):
            trainer.save_checkpoint(args.checkpoint)
    if rank == 0:
        print(f"epochs {first_epoch + 1}-{trainer.epoch} ({trainer.epoch - first_epoch} run here) in "
              f"{time.perf_counter() - t0:.2f} s on {ctx.world_size} ranks ({ctx.scheme}, r={ctx.replication}, "
              f"comm={graph.comm})", flush=True)
        exchange = graph.live_rows.stats()  # the backward sending only the gradient's non-zero rows
        if exchange["builds"]:
            print(f"backward exchange: {exchange['live_rows']} live rows of {n}, built {exchange['builds']}x, "
                  f"reused {exchange['hits']}x", flush=True)
    dist.barrier()  # every rank done with the group before any tears it down (gloo aborted at exit without)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Where a training step's GPU time goes: torch.profiler over a few epochs of one benchmark impl.

    python benchmarks/profile_epoch.py --graph reddit-like --order community --impl fgplugin
    python benchmarks/profile_epoch.py --graph reddit-like --order original --impl dgl-path --steps 5

Prints the kernels (and ops) by total CUDA time per step, so an epoch time can be split into SpMM,
dense GEMMs and the rest. Diagnostic only: it writes no result file.
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from fgplugin.bench import baselines, epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="reddit-like")
    ap.add_argument("--order", default="community", help="original or a fgplugin.reorder method")
    ap.add_argument("--impl", default="fgplugin")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    problem = epoch.load(args.graph, device)
    if args.order != "original":
        problem = epoch.reordered(problem, args.order)
    hidden = args.hidden or epoch.HIDDEN.get(args.graph, 64)
    weights = baselines.reference_weights(problem.num_features, hidden, problem.num_classes, 0, device)
    adj = problem.adj if args.impl == "fgplugin" else None
    model, graph, _ = baselines.build(args.impl, weights, problem.edge_index, problem.num_nodes, adj=adj)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        epoch.train_step(model, graph, problem, optimizer)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(args.steps):
            epoch.train_step(model, graph, problem, optimizer)
        sync()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) / args.steps / 1e3
    print(f"{args.impl} on {args.graph} ({args.order}): {total:.2f} ms of {device.type} time per step")
    print(events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=args.rows,
                       max_name_column_width=70))


if __name__ == "__main__":
    main()

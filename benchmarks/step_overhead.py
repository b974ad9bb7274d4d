#!/usr/bin/env python
"""Per-step overhead on a small graph: a 2-layer GCN (hidden 64) on cora, stock PyG ``GCNConv``
against fgplugin's, both ``cached=True``, forward + backward + Adam, mean of 200 steps after 20.

    python benchmarks/step_overhead.py --device cuda --out benchmarks/results/h100

On a graph this small every step is launches and Python, so this measures the per-call cost of
each layer (the issue behind fgplugin.ops._SpmmFunction). Writes ``<out>/step_overhead.json``.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--graph", default="cora")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=None, help="folder for step_overhead.json (default: print only)")
    args = ap.parse_args()

    from torch_geometric.nn import GCNConv

    from fgplugin.datasets import load_npz
    from fgplugin.pyg import GCNConv as FgGCNConv

    g = load_npz(args.graph, features="dense")
    dev = torch.device(args.device)
    x, edge_index, y = g.x.to(dev), g.edge_index.to(dev), g.y.to(dev)
    classes = int(y.max()) + 1

    def model(conv):
        c1, c2 = conv(x.shape[1], 64, cached=True), conv(64, classes, cached=True)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2 = c1, c2

            def forward(self, x, ei):
                return self.c2(torch.nn.functional.dropout(self.c1(x, ei).relu(), 0.5, self.training), ei)

        return Net().to(dev)

    def ms_per_step(m):
        opt = torch.optim.Adam(m.parameters())

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x, edge_index), y).backward()
            opt.step()

        for _ in range(20):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return 1e3 * (time.perf_counter() - start) / args.steps

    rows = []
    for impl, conv in (("pyg-cached", GCNConv), ("fgplugin-cached", FgGCNConv)):
        ms = ms_per_step(model(conv))
        print(f"{impl} {ms:.3f} ms/step", flush=True)
        rows.append({"graph": args.graph, "impl": impl, "op": "epoch", "ms_mean": round(ms, 4)})
    if args.out:
        res = {"suite": "step_overhead", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "torch": torch.__version__, "command": " ".join(["python"] + sys.argv), "rows": rows}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "step_overhead.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

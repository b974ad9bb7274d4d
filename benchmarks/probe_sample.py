#!/usr/bin/env python
"""The threshold probe's cost and choice per graph and order (H100). At 2eb867b (reverted) it also
probed a row sample of each graph: the 'sample' rows of benchmarks/results/h100/probe_sample.json.

    python benchmarks/probe_sample.py reddit-like,proteins-like,products-like,archaea-like original,community

Writes $OUT/probe_sample.json when OUT is set.
"""
import json
import os
import sys
import time
from pathlib import Path

import torch

from fgplugin import TiledAdjacency
from fgplugin.autotune import probe_thresholds
from fgplugin.bench import epoch as E


def timed_probe(adj, **options):
    torch.cuda.synchronize()
    start = time.perf_counter()
    times = probe_thresholds(adj, **options)
    torch.cuda.synchronize()
    return times, time.perf_counter() - start


def main():
    rows = []
    for name in sys.argv[1].split(","):
        base = E.load(name, "cuda")
        for order in sys.argv[2].split(","):
            p = base if order == "original" else E.reordered(base, order)
            adj = p.adj if p.adj is not None else TiledAdjacency.from_edge_index(p.edge_index, p.num_nodes)
            for kind, options in (("whole", {}),):
                times, seconds = timed_probe(adj, **options)
                best = min(times, key=lambda t: (times[t], -t))
                rows.append(dict(graph=name, order=order, probe=kind, seconds=seconds, choice=best, ms=times))
                print(f"{name} {order} {kind}: {seconds:.2f} s, choice {best}, "
                      + " ".join(f"{k}:{v:.3f}" for k, v in times.items()), flush=True)
            del p, adj
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "probe_sample.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""fgplugin's training step per fixed density threshold, and the threshold probe's table at F=128,
the hidden width and the (padded) class count; community order, H100 (the epoch suite's model).

    python benchmarks/threshold_epoch.py products-like,reddit-like,proteins-like,archaea-like 0.05,0.075,0.1,0.15,1.0

Prints the probe tables and one line per threshold; the check behind ``threshold="auto"`` in the
epoch suite (benchmarks/results/h100/threshold_epoch.json): does the F=128 probe pick the
threshold of the fastest training step?
"""
import sys
from dataclasses import replace

import torch

from fgplugin.autotune import probe_thresholds
from fgplugin.bench import epoch as E


def main():
    graphs = sys.argv[1].split(",")
    thresholds = [float(t) for t in sys.argv[2].split(",")]
    for name in graphs:
        p = E.reordered(E.load(name, "cuda"), "community")
        h = E.HIDDEN.get(name, 64)
        print(f"== {name} F={p.num_features} hidden={h} classes={p.num_classes}", flush=True)
        for F in (128, h, p.num_classes + (-p.num_classes % 4)):
            t = probe_thresholds(p.adj, F=F)
            print(f"probe F={F}: " + " ".join(f"{k}:{v:.3f}" for k, v in t.items()), flush=True)
        for thr in thresholds:
            q = replace(p, adj=p.adj.with_tiles(threshold=thr))
            rows = E.run_one(q, "fgplugin", 20, h)
            print(f"thr {thr}: epoch {rows[0]['ms_median']:.3f} ms (min {rows[0]['ms_min']:.3f})", flush=True)
        del p, q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

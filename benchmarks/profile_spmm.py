#!/usr/bin/env python
"""Run the block-adaptive forward SpMM twice per (graph, threshold), as a target for Nsight Compute.

    ncu --clock-control none --target-processes all --kernel-name regex:ba_ --launch-count 3 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \\
        python benchmarks/profile_spmm.py reddit-like:0.02,0.1 products-like:0.05

Each argument is ``graph:thresholds`` (a synthetic preset, community order, F = 128, fp32 with TF32
off, GCN scales). It prints the plan's sizes; the profiler does the measuring.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run  # noqa: E402


def main():
    from fgplugin.kernel_plan import plan_for, plan_stats

    torch.backends.cuda.matmul.allow_tf32 = False
    op = torch.ops.fgplugin.spmm.default
    for spec in sys.argv[1:]:
        name, thresholds = spec.split(":")
        run = community_run(name)
        x = torch.randn(run.n, 128, device="cuda")
        for thr in map(float, thresholds.split(",")):
            plan = plan_for(run.adj, threshold=thr, weighted=False)
            print(name, thr, plan_stats(plan), flush=True)
            for _ in range(2):
                op(run.adj.rowptr, run.adj.col, None, x, run.r, run.c, run.d, None, None, None, plan, [])
            torch.cuda.synchronize()
        del run, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

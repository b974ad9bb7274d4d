#!/usr/bin/env python
"""Per-kernel CUDA time of the forward block-adaptive SpMM (community order, F=128), fp32 and bf16.

    python benchmarks/kernel_times.py proteins-like:0.075 reddit-like:0.075 products-like:0.05

One ``graph:threshold`` per argument; prints one line per (graph, dtype, kernel) with its mean time
per call (torch.profiler, 10 calls after 3 warm-up calls). Used for the A/B of dense-kernel
variants (benchmarks/results/h100/dense16_frag.json): the SpMM's kernels are timed apart, so a
change to one of them is not hidden in the whole product's time.
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run  # noqa: E402


def main():
    from fgplugin.kernel_plan import plan_for

    torch.backends.cuda.matmul.allow_tf32 = False
    op = torch.ops.fgplugin.spmm.default
    for spec in sys.argv[1:]:
        name, thr = spec.split(":")
        run = community_run(name)
        plan = plan_for(run.adj, threshold=float(thr), weighted=False)
        x32 = torch.randn(run.n, 128, device="cuda")
        for x in (x32, x32.bfloat16()):
            def product(x=x):
                return op(run.adj.rowptr, run.adj.col, None, x, run.r, run.c, run.d, None, None, None, plan, [])
            for _ in range(3):
                product()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    product()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if t > 0:
                    print(f"{name} thr {thr} {x.dtype} {e.key[:70]:70s} {t / 10 / 1000:.3f} ms/call", flush=True)
        del run, plan, x32
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

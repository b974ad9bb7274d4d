#!/usr/bin/env python
"""A/B of the two dense-tile kernels (issue 3) on a Hopper GPU: the wgmma kernel
(csrc/cuda/dense_tiles_sm90.cu) against the mma.sync one (ba_dense_kernel), same process.

    python benchmarks/wgmma_ab.py --graphs reddit-like proteins-like archaea-like products-like \\
        --thresholds 0.02 0.05 0.075 0.1 1.0 --out $OUT/wgmma_ab.json

For each graph (community order) and threshold, and each dtype: the forward GCN-normalized SpMM
(F=128, CUDA events, median of --reps) with FGPLUGIN_NO_WGMMA=0 and =1, interleaved twice (A, B,
A, B) so drift shows; the dense kernel's own time per call (torch.profiler, 10 calls); the
relative difference between the two kernels' outputs and each one's error against a float64
reference on 2,000 sampled rows; and cuSPARSE on the same order, for the ratio the issue names.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run, sample_reference, time_fn  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
KERNELS = {"wgmma": "0", "mma": "1"}  # FGPLUGIN_NO_WGMMA


def dense_kernel_ms(product) -> float:
    """Mean CUDA time per call of the dense-tile kernel (either one) over 10 calls."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            product()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        if "ba_dense" in e.key:
            total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    return total / 10 / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", nargs="+", default=["reddit-like", "proteins-like", "archaea-like", "products-like"])
    ap.add_argument("--thresholds", nargs="+", type=float, default=[0.02, 0.05, 0.075, 0.1, 1.0])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--F", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from fgplugin.kernel_plan import plan_for, plan_stats
    from fgplugin.testing import rel_error

    torch.backends.cuda.matmul.allow_tf32 = False
    op = torch.ops.fgplugin.spmm.default
    arch = {}
    for name, flag in KERNELS.items():
        os.environ["FGPLUGIN_NO_WGMMA"] = flag
        arch[name] = int(torch.ops.fgplugin.dense_tile_arch(torch.cuda.current_device()))
    rows = []
    for name in args.graphs:
        run = community_run(name)
        gen = torch.Generator(device="cuda").manual_seed(0)
        x32 = [torch.randn(run.n, args.F, device="cuda", generator=gen) for _ in range(2)]
        sample = torch.randperm(run.n, device="cuda")[:2000]
        fwd, _ = run.cusparse()
        cusparse_ms = time_fn(lambda x: torch.sparse.mm(fwd, x), x32, args.reps)[0]  # fp32 only
        for thr in args.thresholds:
            plan = plan_for(run.adj, threshold=thr, weighted=False)
            stats = plan_stats(plan)
            for dt in args.dtypes:
                xs = [x.to(DTYPES[dt]) for x in x32]

                def product(x=xs[0]):
                    return op(run.adj.rowptr, run.adj.col, None, x, run.r, run.c, run.d, None, None, None, plan, [])

                ref = sample_reference(run.adj.rowptr, run.adj.col, xs[0], run.r, run.c, run.d, sample)
                outs, times, dense = {}, {k: [] for k in KERNELS}, {}
                for rep in range(2):
                    for kern, flag in KERNELS.items():
                        os.environ["FGPLUGIN_NO_WGMMA"] = flag
                        times[kern].append(time_fn(product, xs, args.reps)[0])
                        if rep == 0:
                            outs[kern] = product()
                            dense[kern] = dense_kernel_ms(product)
                row = {"graph": name, "order": "community", "F": args.F, "precision": dt, "threshold": thr,
                       "dense_tiles": stats.get("dense_tiles"), "dense_nnz": stats.get("dense_nnz"),
                       "rem_nnz": stats.get("rem_nnz"), "nnz": run.nnz, "cusparse_ms": cusparse_ms if dt == "fp32" else None,
                       "diff_wgmma_vs_mma": rel_error(outs["wgmma"].double(), outs["mma"].double())}
                for kern in KERNELS:
                    row[f"{kern}_ms"] = min(times[kern])
                    row[f"{kern}_ms_runs"] = times[kern]
                    row[f"{kern}_dense_kernel_ms"] = dense[kern]
                    row[f"{kern}_rel_err"] = rel_error(outs[kern][sample].double(), ref)
                row["speedup"] = row["mma_ms"] / row["wgmma_ms"]
                rows.append(row)
                print(f"{name:14s} thr {thr:<5} {dt}: wgmma {row['wgmma_ms']:.3f} ms (dense {dense['wgmma']:.3f}) "
                      f"mma {row['mma_ms']:.3f} ms (dense {dense['mma']:.3f}) x{row['speedup']:.3f} "
                      f"diff {row['diff_wgmma_vs_mma']:.1e} err {row['wgmma_rel_err']:.1e}/{row['mma_rel_err']:.1e}"
                      + (f" cusparse {cusparse_ms:.3f}" if dt == "fp32" else ""), flush=True)
            del plan
        del run, x32, fwd
        torch.cuda.empty_cache()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"suite": "wgmma_ab", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "commit": commit or None, "command": "python benchmarks/wgmma_ab.py " + " ".join(sys.argv[1:]),
           "dense_tile_arch": arch, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""A/B of the community order with and without grouped communities (issue 3), on the GPU.

    python benchmarks/grouping_ab.py --graphs products-like:1.0 reddit-like:0.075 --out $OUT/grouping.json

One ``graph:threshold`` per argument. For each graph, the ``community`` order with its default
``group_size`` and with ``group_size=None`` (communities in label order, before grouping), and
for each dtype: the forward GCN-normalized SpMM (F=128) of fgplugin at that threshold and of
cusparse-cached on the same order (CUDA events, median of --reps runs), the reordering's time and
the share of non-zeros within 2K and 16K ids of their row (what keeps gathered rows in L2).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import GraphRun, sample_reference, time_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", nargs="+", default=["products-like:1.0", "archaea-like:1.0", "reddit-like:0.075",
                                                    "proteins-like:0.075"])
    ap.add_argument("--F", type=int, default=128)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from fgplugin.datasets import community_graph
    from fgplugin.kernel_plan import plan_for
    from fgplugin.reorder import inverse_permutation, reorder
    from fgplugin.testing import rel_error

    torch.backends.cuda.matmul.allow_tf32 = False
    op = torch.ops.fgplugin.spmm.default
    rows_out = []
    for spec in args.graphs:
        name, thr = spec.split(":")
        g = community_graph(name, device="cuda", num_features=0)
        n, ei = g.num_nodes, g.edge_index
        del g
        for grouped in (False, True):
            torch.cuda.synchronize()
            t0 = time.time()
            perm = reorder(ei, "community", num_nodes=n, **({} if grouped else {"group_size": None}))
            torch.cuda.synchronize()
            reorder_s = time.time() - t0
            run = GraphRun(name, "community" if grouped else "community-ungrouped", inverse_permutation(perm)[ei], n)
            del perm
            adj = run.adj
            rows = torch.repeat_interleave(torch.arange(n, device="cuda"), adj.rowptr.diff().long())
            dist = (adj.col.long() - rows).abs()
            near = {f"within_{w}": round(float((dist < w).float().mean()), 4) for w in (2048, 16384)}
            del rows, dist
            plan = plan_for(adj, threshold=float(thr), weighted=False)
            cs_fwd, _ = run.cusparse()
            gen = torch.Generator(device="cuda").manual_seed(0)
            sample = torch.randint(0, n, (2000,), device="cuda", generator=gen)
            for dt in args.dtypes:
                dtype = torch.float32 if dt == "fp32" else torch.bfloat16
                x = torch.randn(n, args.F, device="cuda", generator=gen).to(dtype)
                cs = cs_fwd if dtype == torch.float32 else cs_fwd.to(dtype)
                ms_cs = time_fn(lambda x: torch.sparse.mm(cs, x), [x], args.reps)[0]

                def product(x):
                    return op(adj.rowptr, adj.col, None, x, run.r, run.c, run.d, None, None, None, plan, [])

                ms, lo, hi, _ = time_fn(product, [x], args.reps)
                ref = sample_reference(adj.rowptr, adj.col, x, run.r, run.c, run.d, sample)
                row = {"graph": name, "order": run.order, "reorder_s": round(reorder_s, 3), **near,
                       "threshold": float(thr), "dtype": dt, "F": args.F, "nnz": run.nnz,
                       "ms_median": round(ms, 4), "ms_min": round(lo, 4), "ms_max": round(hi, 4),
                       "cusparse_ms": round(ms_cs, 4), "vs_cusparse": round(ms_cs / ms, 3),
                       "rel_err": float(rel_error(product(x)[sample].double(), ref))}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
                del x, cs
            del run, adj, plan, cs_fwd
            torch.cuda.empty_cache()
        del ei
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"suite": "grouping_ab", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": commit, "command": "python benchmarks/grouping_ab.py " + " ".join(sys.argv[1:]),
              "rows": rows_out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

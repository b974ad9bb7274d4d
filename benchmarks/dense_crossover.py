#!/usr/bin/env python
"""Where fp32 dense tiles should leave the tensor cores for FFMA (issue 3), on the GPU.

    python benchmarks/dense_crossover.py [--graphs reddit-like,products-like] [--out DIR]

For each synthetic graph in community order and each density threshold, times the fp32-accurate
forward and backward GCN SpMM (TF32 off, F=128) for a sweep of ``FGPLUGIN_DENSE_FFMA_MAX`` (dense
tiles with at most that many non-zeros run on FFMA, the rest on split-TF32 MMAs; read by the
kernel per launch), next to cuSPARSE on the same order and on the original order. Each row keeps
its error against a float64 reference on 512 sampled rows. Writes ``dense_crossover.json`` to
--out (default $OUT) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import GraphRun, log, sample_reference, time_fn  # noqa: E402

FFMA_MAX = (0, 48, 96, 128, 160, 224, 320, 1024)
THRESHOLDS = (0.02, 0.05, 0.10)


def tile_nnz_quantiles(plan) -> dict:
    if not plan or plan[4].numel() == 0:
        return {}
    words = plan[4].view(-1, 32)
    table = torch.tensor([bin(i).count("1") for i in range(256)], device=words.device)
    nnz = table[words.contiguous().view(torch.uint8).long()].view(words.shape[0], -1).sum(1).float()
    return {f"q{int(q * 100)}": float(torch.quantile(nnz, q)) for q in (0.1, 0.5, 0.9)}


def main():
    from fgplugin.datasets import community_graph
    from fgplugin.kernel_plan import plan_for, plan_stats
    from fgplugin.reorder import reorder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="reddit-like,products-like")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    op = torch.ops.fgplugin.spmm.default
    rows = []
    for name in args.graphs.split(","):
        g = community_graph(name, device="cuda", num_features=0)
        n, ei = g.num_nodes, g.edge_index
        gen = torch.Generator(device="cuda").manual_seed(0)
        sample = torch.randperm(n, device="cuda", generator=gen)[:512]
        x = [torch.randn(n, 128, device="cuda", generator=gen)]
        original = GraphRun(name, "original", ei, n)
        ms = time_fn(lambda v: torch.sparse.mm(original.cusparse()[0], v), x, args.reps)[0]
        rows.append({"graph": name, "order": "original", "impl": "cusparse-cached", "op": "spmm_fwd", "ms": ms})
        del original
        perm = reorder(ei, "community", num_nodes=n)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n, device=perm.device)
        run = GraphRun(name, "community", inv[ei], n)
        del g, ei, perm, inv
        torch.cuda.empty_cache()
        ms = time_fn(lambda v: torch.sparse.mm(run.cusparse()[0], v), x, args.reps)[0]
        rows.append({"graph": name, "order": "community", "impl": "cusparse-cached", "op": "spmm_fwd", "ms": ms})
        run._cusparse = None
        refs = {"spmm_fwd": sample_reference(run.adj.rowptr, run.adj.col, x[0], run.r, run.c, run.d, sample),
                "spmm_bwd": sample_reference(run.t_rowptr, run.t_col, x[0], run.c, run.r, run.d, sample)}
        for thr in THRESHOLDS:
            p = plan_for(run.adj, threshold=thr, weighted=False)
            tp = plan_for(run.adj, threshold=thr, weighted=False, transpose=True)
            stats = {**plan_stats(p), **tile_nnz_quantiles(p)}
            calls = {"spmm_fwd": lambda v: op(run.adj.rowptr, run.adj.col, None, v, run.r, run.c, run.d,
                                              None, None, None, p, []),
                     "spmm_bwd": lambda v: op(run.t_rowptr, run.t_col, None, v, run.c, run.r, run.d,
                                              None, None, None, tp, [])}
            for ffma_max in FFMA_MAX:
                os.environ["FGPLUGIN_DENSE_FFMA_MAX"] = str(ffma_max)
                for which, fn in calls.items():
                    got = fn(x[0])[sample].double()
                    err = float((got - refs[which]).norm() / refs[which].norm())
                    ms = time_fn(fn, x, args.reps)[0]
                    rows.append({"graph": name, "order": "community", "impl": "fgplugin", "op": which,
                                 "threshold": thr, "ffma_max": ffma_max, "ms": ms, "rel_err": err,
                                 "dense_share": round(stats["dense_nnz"] / run.nnz, 4), **stats})
                    log(f"{name:<14}thr {thr:<5} ffma<={ffma_max:<5}{which:<9}{ms:8.3f} ms  err {err:.1e}  "
                        f"dense {stats['dense_nnz'] / run.nnz:.0%} tiles {stats['dense_tiles']:,} "
                        f"median tile nnz {stats.get('q50')}")
            os.environ.pop("FGPLUGIN_DENSE_FFMA_MAX")
            for key in [k for k in run.adj._shared if isinstance(k, tuple) and k and k[0] == "kernel_plan"]:
                del run.adj._shared[key]
            del p, tp, calls
            torch.cuda.empty_cache()
        for r in rows:
            if r["graph"] == name and r["impl"] == "cusparse-cached":
                log(f"{name:<14}cuSPARSE {r['order']:<10} fwd {r['ms']:.3f} ms")
        del run, x
        torch.cuda.empty_cache()
    head = {"suite": "dense_crossover", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": " ".join([Path(sys.executable).name] + sys.argv), "time": time.strftime("%Y-%m-%d %H:%M")}
    out = Path(args.out) / "dense_crossover.json"
    out.write_text(json.dumps({**head, "rows": rows}, indent=1))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()

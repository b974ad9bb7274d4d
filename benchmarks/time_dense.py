#!/usr/bin/env python
"""Forward SpMM per threshold and precision on community order, next to cuSPARSE (issue 3 A/B runs).

    python benchmarks/time_dense.py reddit-like,products-like 0.02,0.05,0.1 [128,64]   # writes $OUT/time_dense.json

Used to compare dense-kernel variants built from the working tree (the rows record plan sizes and
the error against float64 on 512 sampled rows).
"""
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run, sample_reference, time_fn  # noqa: E402


def main():
    from fgplugin.kernel_plan import plan_for, plan_stats

    op = torch.ops.fgplugin.spmm.default
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    features = [int(f) for f in sys.argv[3].split(",")] if len(sys.argv) > 3 else [128]
    for name in sys.argv[1].split(","):
        run = community_run(name)
        n = run.n
        gen = torch.Generator(device="cuda").manual_seed(0)
        sample = torch.randperm(n, device="cuda", generator=gen)[:512]
        x32 = torch.randn(n, 128, device="cuda", generator=gen)
        ref = sample_reference(run.adj.rowptr, run.adj.col, x32, run.r, run.c, run.d, sample)
        ms = time_fn(lambda v: torch.sparse.mm(run.cusparse()[0], v), [x32], 20)[0]
        print(f"{name} cusparse community fp32 {ms:.3f} ms", flush=True)
        rows.append(dict(graph=name, impl="cusparse-cached", prec="fp32", ms=ms))
        run._cusparse = None
        for thr in (float(t) for t in sys.argv[2].split(",")):
            t0 = time.time()
            plan = plan_for(run.adj, threshold=thr, weighted=False)
            stats = plan_stats(plan)
            for f, prec in ((f, prec) for f in features for prec in ("fp32", "bf16")):
                x = x32[:, :f].contiguous()
                x = x.bfloat16() if prec == "bf16" else x
                fn = lambda v: op(run.adj.rowptr, run.adj.col, None, v, run.r, run.c, run.d,  # noqa: E731
                                  None, None, None, plan, [])
                got = fn(x)[sample].double()
                err = float((got - ref[:, :f]).norm() / ref[:, :f].norm())
                ms = time_fn(fn, [x], 20)[0]
                print(f"{name} thr {thr} F {f} {prec} {ms:.3f} ms err {err:.2e} plan {time.time() - t0:.2f}s {stats}",
                      flush=True)
                rows.append(dict(graph=name, impl="fgplugin", prec=prec, F=f, threshold=thr, ms=ms, rel_err=err,
                                 **stats))
            for key in [k for k in run.adj._shared if isinstance(k, tuple) and k and k[0] == "kernel_plan"]:
                del run.adj._shared[key]
            del plan
            torch.cuda.empty_cache()
        del run
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", ".")) / "time_dense.json"
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

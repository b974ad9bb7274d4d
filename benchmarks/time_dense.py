#!/usr/bin/env python
"""Forward SpMM per threshold and precision on community order, next to cuSPARSE (issue 3 A/B runs).

    python benchmarks/time_dense.py reddit-like,products-like 0.02,0.05,0.1 [CHUNKS [FEATURES]]
                                                    # writes $OUT/time_dense.json

Used to compare kernel variants built from the working tree (the rows record plan sizes and the
error against float64 on 512 sampled rows). CHUNKS: values of FGPLUGIN_SPARSE_CHUNK to run each
case under (default 0 = the kernel's own choice; -1 = no feature chunks); FEATURES: widths of x
(default 128; 44 stands for 41, which fgplugin.spmm pads to 44).
"""
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import GraphRun, sample_reference, time_fn  # noqa: E402


def main():
    from fgplugin.datasets import community_graph
    from fgplugin.kernel_plan import plan_for, plan_stats
    from fgplugin.reorder import inverse_permutation, reorder

    op = torch.ops.fgplugin.spmm.default
    torch.backends.cuda.matmul.allow_tf32 = False
    chunks = sys.argv[3].split(",") if len(sys.argv) > 3 else ["0"]
    widths = [int(f) for f in sys.argv[4].split(",")] if len(sys.argv) > 4 else [128]
    rows = []
    for name in sys.argv[1].split(","):
        g = community_graph(name, device="cuda", num_features=0)
        n, ei = g.num_nodes, g.edge_index
        gen = torch.Generator(device="cuda").manual_seed(0)
        sample = torch.randperm(n, device="cuda", generator=gen)[:512]
        x_full = torch.randn(n, max(widths), device="cuda", generator=gen)
        run = GraphRun(name, "community", inverse_permutation(reorder(ei, "community", num_nodes=n))[ei], n)
        del g, ei
        refs = {F: sample_reference(run.adj.rowptr, run.adj.col, x_full[:, :F], run.r, run.c, run.d, sample)
                for F in widths}
        for F in widths:
            ms = time_fn(lambda v: torch.sparse.mm(run.cusparse()[0], v), [x_full[:, :F].contiguous()], 20)[0]
            print(f"{name} cusparse community fp32 F={F} {ms:.3f} ms", flush=True)
            rows.append(dict(graph=name, impl="cusparse-cached", prec="fp32", F=F, ms=ms))
        run._cusparse = None
        for thr in (float(t) for t in sys.argv[2].split(",")):
            t0 = time.time()
            plan = plan_for(run.adj, threshold=thr, weighted=False)
            stats = plan_stats(plan)
            for chunk, F, (prec, x) in itertools.product(chunks, widths, (("fp32", x_full), ("bf16", x_full.bfloat16()))):
                os.environ["FGPLUGIN_SPARSE_CHUNK"] = chunk  # read by the extension at each call
                x = x[:, :F].contiguous()
                fn = lambda v: op(run.adj.rowptr, run.adj.col, None, v, run.r, run.c, run.d,  # noqa: E731
                                  None, None, None, plan, [])
                got = fn(x)[sample].double()
                err = float((got - refs[F]).norm() / refs[F].norm())
                ms = time_fn(fn, [x], 20)[0]
                print(f"{name} thr {thr} chunk {chunk} F={F} {prec} {ms:.3f} ms err {err:.2e} "
                      f"plan {time.time() - t0:.2f}s {stats}", flush=True)
                rows.append(dict(graph=name, impl="fgplugin", prec=prec, threshold=thr, sparse_chunk=int(chunk), F=F,
                                 ms=ms, rel_err=err, **stats))
            os.environ.pop("FGPLUGIN_SPARSE_CHUNK", None)
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

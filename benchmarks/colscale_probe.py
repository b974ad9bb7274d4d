#!/usr/bin/env python
"""What the remainder pass's column-scale gather costs: forward SpMM with and without the column
scale (GCN scales otherwise), community order, F=128, fp32 and bf16 (issue 3 probe).

    python benchmarks/colscale_probe.py reddit-like:0.05,products-like:1.0   # writes $OUT/colscale_probe.json

The remainder pass loads ``cs[j]`` for every entry, a random 4-byte read (one 32-byte L2 sector)
next to the 512 (fp32) or 256 (bf16) bytes of the row it gathers. Without the column scale the
product is a different function; the timing difference bounds what precomputed per-entry
weights could save.
"""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run, time_fn  # noqa: E402


def main():
    from fgplugin.kernel_plan import plan_for, plan_stats

    op = torch.ops.fgplugin.spmm.default
    rows = []
    for spec in sys.argv[1].split(","):
        name, thr = spec.split(":")
        run = community_run(name)
        plan = plan_for(run.adj, threshold=float(thr), weighted=False)
        x32 = torch.randn(run.n, 128, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
        for prec in ("fp32", "bf16"):
            x = x32.bfloat16() if prec == "bf16" else x32
            times = {}
            for label, c in (("with_cs", run.c), ("without_cs", None), ("with_cs_again", run.c)):
                fn = lambda v, c=c: op(run.adj.rowptr, run.adj.col, None, v, run.r, c, run.d,  # noqa: E731
                                       None, None, None, plan, [])
                times[label] = time_fn(fn, [x], 20)[0]
            print(name, thr, prec, times, flush=True)
            rows.append(dict(graph=name, threshold=float(thr), prec=prec, F=128, **{f"{k}_ms": v for k, v in times.items()},
                             **plan_stats(plan)))
        del run, plan
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", ".")) / "colscale_probe.json"
    out.write_text(json.dumps(dict(suite="colscale_probe", device=torch.cuda.get_device_name(), torch=torch.__version__,
                                   command="python benchmarks/colscale_probe.py " + sys.argv[1], rows=rows), indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""A/B of fgplugin.grad_rows: the backward product of a GCN output layer with and without
skipping the zero rows of its gradient, and what the skipping path is made of.

    python benchmarks/grad_rows_ab.py [--graphs products-like,reddit-like] [--live 0.05,0.1,0.3] [--features F] [--out DIR]

On a machine without a GPU it times on the CPU (``perf_counter``).

Per graph (community order, the epoch suite's plan and threshold) and live fraction: the layer's
output width F (classes, padded as fgplugin pads them), a gradient with that fraction of non-zero
rows, and medians of 20 CUDA-event timings of

- ``full_ms``: ``torch.autograd.grad`` of ``fgplugin.spmm`` with skipping off (the full ``A^T G``);
- ``skip_ms``: the same with skipping on, the restriction already built (a hit: finding the
  non-zero rows, comparing them with the kept set, the restricted product);
- ``nonzero_rows_ms`` / ``torch_any_ms``: finding the non-zero rows as fgplugin.grad_rows does
  (the extension's kernel on CUDA) and with torch's ``any(dim=1)``;
- ``restricted_ms``: the restricted product alone;
- ``build_ms``: building the restriction and its plan (once per set of rows).

Writes ``grad_rows_ab.json`` to --out (default $OUT).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def median_ms(fn, reps=20):
    """Median milliseconds of ``fn``: CUDA events on a GPU, ``perf_counter`` on the CPU."""
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main() -> int:
    import fgplugin
    from fgplugin import grad_rows
    from fgplugin.bench.epoch import load, reordered
    from fgplugin.kernel_plan import prepare_plans
    from fgplugin.ops import _op_inputs, csr_product, padded_width

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="products-like,reddit-like")
    ap.add_argument("--live", default="0.05,0.1,0.3")
    ap.add_argument("--features", type=int, default=None, help="gradient width (default: the classes, padded)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name in args.graphs.split(","):
        problem = reordered(load(name, device), "community")
        adj = problem.adj
        threshold = prepare_plans(adj)
        F = args.features or padded_width(problem.num_classes, torch.float32, device)
        scales = adj.norm("gcn")
        n = adj.shape[0]
        x = torch.randn(n, F, device=device, requires_grad=True)
        out = fgplugin.spmm(adj, x, *scales)
        for live_fraction in (float(v) for v in args.live.split(",")):
            g = torch.Generator(device=device).manual_seed(0)
            grad = torch.randn(n, F, device=device, generator=g)
            grad[torch.rand(n, device=device, generator=g) >= live_fraction] = 0

            def backward():
                return torch.autograd.grad(out, x, grad, retain_graph=True)[0]

            grad_rows.set_row_skipping(False)
            full = backward()
            full_ms = median_ms(backward)
            grad_rows.set_row_skipping(True)
            t_col = adj.transpose()[1]
            grad_rows._restrictions.pop(t_col, None)  # a fresh restriction for this set of rows
            skipped = backward()  # builds it
            stats = grad_rows.stats(t_col)
            skip_ms = median_ms(backward)
            used = grad_rows.stats(t_col)["hits"] > 0
            inputs, _, _ = _op_inputs(adj, x.detach(), *scales, with_transpose=True, name="ab")
            r, c, d = inputs[4], inputs[5], inputs[6]
            restricted_ms = restricted_nnz = None
            with torch.no_grad():
                restricted = grad_rows.restrict_to_live_rows(*adj.transpose()[:2], None, grad, inputs[11])
                if restricted is not None:  # None: too many live rows (MAX_LIVE_FRACTION)
                    rp, cl, vals, plan = restricted
                    restricted_nnz = int(cl.numel())
                    restricted_ms = median_ms(lambda: csr_product(rp, cl, vals, grad, c, r, d, plan))
            rows.append({
                "graph": name, "order": "community", "nodes": n, "nnz": adj.nnz, "F": F, "threshold": threshold,
                "live_fraction": live_fraction, "live_rows": stats["live_rows"], "restricted_nnz": restricted_nnz,
                "used": used, "full_ms": full_ms, "skip_ms": skip_ms, "speedup": full_ms / skip_ms,
                "restricted_ms": restricted_ms,
                "nonzero_rows_ms": median_ms(lambda: grad_rows.nonzero_rows(grad)),
                "torch_any_ms": median_ms(lambda: grad.any(dim=1)),
                "build_ms": 1e3 * stats["build_s"],
                "rel_diff": float((skipped - full).norm() / full.norm())})
            print(rows[-1], flush=True)
        del out, x, problem, adj
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "grad_rows_ab.json"
    path.write_text(json.dumps({"suite": "grad_rows_ab",
                                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                                "torch": torch.__version__,
                                "command": " ".join(["python"] + sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

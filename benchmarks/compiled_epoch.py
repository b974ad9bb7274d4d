#!/usr/bin/env python
"""torch.compile of a PyG model built from fgplugin layers, fed a plain ``edge_index`` (issue 5).

    python benchmarks/compiled_epoch.py [--graphs reddit-like] [--epochs 20] [--out DIR]

For each graph (community order): a 2-layer fgplugin ``GCNConv`` model trained eagerly, and the
same model compiled *before* it has seen its ``edge_index`` (the structure is then built by the
opaque aggregation op when the compiled graph first runs). Reports the median training step of
each, the first compiled step (compilation plus building the structure), the compiled model's
graph breaks (``torch._dynamo.explain`` on a fresh model and a fresh ``edge_index``) and the
relative (Frobenius) difference of the eval outputs on equal weights. Writes ``compiled_epoch.json`` to --out (default $OUT).
Eager runs keep layer 1's aggregation of the constant x (fgplugin.input_cache) and skip the zero
rows of layer 2's gradient (fgplugin.grad_rows), which compiled code does not do;
``eager_kernels_ms`` is the eager step without both, what compilation compares to.
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


def main() -> int:
    import fgplugin
    from fgplugin import grad_rows
    from fgplugin.bench import baselines
    from fgplugin.bench.epoch import load, reordered, time_steps

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="reddit-like")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name in args.graphs.split(","):
        problem = reordered(load(name, device), "community")
        weights = baselines.reference_weights(problem.num_features, args.hidden, problem.num_classes, 0, device)

        def fresh_model():
            return baselines.build("fgplugin", weights, problem.edge_index, problem.num_nodes, adj=problem.adj)[0]

        eager = fresh_model()
        eager_ms, _ = time_steps(eager, problem.edge_index, problem, args.epochs)
        cache_was, skip_was = fgplugin.set_input_cache(False), grad_rows.set_row_skipping(False)
        try:
            eager_kernels_ms, _ = time_steps(fresh_model(), problem.edge_index, problem, args.epochs)
        finally:
            fgplugin.set_input_cache(cache_was)
            grad_rows.set_row_skipping(skip_was)
        compiled = torch.compile(fresh_model())
        cold = problem.edge_index.clone()  # an edge_index no model has seen
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        start = time.perf_counter()
        compiled(problem.x, cold)
        sync()
        first_s = time.perf_counter() - start
        compiled_ms, _ = time_steps(compiled, cold, problem, args.epochs)
        torch._dynamo.reset()
        breaks = torch._dynamo.explain(fresh_model())(problem.x, problem.edge_index.clone()).graph_break_count
        eager.load_state_dict(compiled._orig_mod.state_dict())  # trained apart (dropout): compare on equal weights
        eager.eval(), compiled.eval()
        with torch.no_grad():
            want, got = eager(problem.x, cold), compiled(problem.x, cold)
        rows.append({"graph": name, "order": "community", "nodes": problem.num_nodes,
                     "nnz": problem.edge_index.shape[1], "hidden": args.hidden,
                     "eager_ms": statistics.median(eager_ms), "eager_kernels_ms": statistics.median(eager_kernels_ms),
                     "compiled_ms": statistics.median(compiled_ms),
                     "compiled_first_call_s": first_s, "graph_breaks": breaks,
                     "rel_diff": float((got - want).norm() / want.norm())})
        print(rows[-1], flush=True)
        torch._dynamo.reset()
    out = Path(args.out) / "compiled_epoch.json"
    out.write_text(json.dumps({"suite": "compiled_epoch", "device": torch.cuda.get_device_name() if device.type == "cuda"
                               else "cpu", "torch": torch.__version__,
                               "command": " ".join([Path(sys.executable).name] + sys.argv), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

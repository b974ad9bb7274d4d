"""The ``host`` suite: the host time of one aggregation call, fgplugin's against ``torch.sparse.mm``.

    fgplugin bench host --graphs cora,tolokers --device cuda     # -> <out>/host.json and host.md
    fgplugin bench host --graphs small --device cpu --calls 200

On small graphs a training step is a chain of short kernels, and the time the host takes to issue
each call (Python, argument checks, the dispatcher, the launches) is the step's time. Per graph
(original order, GCN normalization, ``threshold="auto"`` as the epoch suite's fgplugin) and implementation, ``--calls`` back-to-back calls on
``[n, F]`` float32 features (``F`` = ``--F``, default 16, so the kernels stay short):

- ``torch.sparse.mm``: the ``cusparse-cached`` baseline's CSR tensor of ``D^-1/2 (A + I) D^-1/2``
  (normalized once, as a user of cuSPARSE would keep it) times ``x``;
- ``fgplugin.spmm``: ``fgplugin.spmm(adj, x, *adj.norm("gcn", dtype=torch.float32))``, the call a
  GCN layer makes;
- the same two with ``x`` requiring a gradient (``+grad``): the forward call as in training, with
  its autograd record.

Each row: ``host_us``, the wall time per call of a loop of ``--calls`` calls (default 200), from
a synchronized start to the return of the last call, with no synchronization inside: 200 calls of
a few kernels each stay within CUDA's launch queue (1024 entries), so the host never waits for the
device and this is the host's own time per call; ``gpu_us``, the device time per call of the same
loop (CUDA events); ``bound``: ``device`` where the device took longer than the host (then a long
training loop runs at the device's pace and the host time is hidden). Medians of ``--reps`` loops
(default 5: 1000 calls in all). On the CPU ``host_us`` includes the product itself.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

IMPLS = ("torch.sparse.mm", "fgplugin.spmm", "torch.sparse.mm+grad", "fgplugin.spmm+grad")


def parser(prog: str = "fgplugin bench host") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="small", help="comma list of synthetic presets or .npz graphs (default small)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--F", type=int, default=16, help="feature columns (default 16)")
    ap.add_argument("--calls", type=int, default=200, help="calls per timed loop (default 200)")
    ap.add_argument("--reps", type=int, default=5, help="timed loops per row (default 5)")
    ap.add_argument("--out", default="bench_results", help="result folder (default ./bench_results)")
    ap.add_argument("--name", default="host", help="result file stem (default host)")
    ap.add_argument("--commit", default=None, help="the source version to record (default $FGPLUGIN_COMMIT)")
    return ap


def main(argv, prog: list[str]) -> int:
    args = parser(" ".join(prog)).parse_args(argv)
    from fgplugin.config import commit

    from . import report

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for name in [g for g in args.graphs.split(",") if g]:
        try:
            rows += graph_rows(name, device, args.F, args.calls, args.reps)
        except Exception as err:  # noqa: BLE001 -- keep the failure as a row, go on with the next graph
            rows.append({"graph": name, "op": "host", "error": f"{type(err).__name__}: {err}"})
        print(_table([r for r in rows if r["graph"] == name]), file=sys.stderr, flush=True)
    res = report.result("host", rows, device, argv=[*prog, *argv], commit=args.commit or commit(),
                        note="host_us: wall time per call of a loop of back-to-back calls (no sync inside); "
                             "gpu_us: device time per call of the same loop")
    paths = report.write(res, args.out, args.name, plot=False)
    print(f"[bench] wrote {paths['json']}, {paths['md']}", file=sys.stderr)
    return 1 if any(r.get("error") for r in rows) else 0


def graph_rows(name: str, device: torch.device, features: int, calls: int, reps: int) -> list[dict]:
    import fgplugin
    from fgplugin.datasets import load_graph

    from .baselines import CachedCSRGraph

    g = load_graph(name, device)  # a real graph comes on the CPU
    adj = fgplugin.TiledAdjacency.from_edge_index(g.edge_index.to(device), g.num_nodes, threshold="auto")
    adj.prepare(torch.float32)  # the threshold probe and the kernel plans: not part of a call
    norm = adj.norm("gcn", dtype=torch.float32)
    csr = CachedCSRGraph(g.edge_index.to(device), g.num_nodes).csr()
    x = torch.randn(g.num_nodes, features, device=device)
    rows = []
    for impl in IMPLS:
        grad = impl.endswith("+grad")
        xi = x.clone().requires_grad_(grad)
        call = (lambda: torch.sparse.mm(csr, xi)) if impl.startswith("torch") else (
            lambda: fgplugin.spmm(adj, xi, *norm))
        host, gpu = zip(*(_time_loop(call, calls, device) for _ in range(reps)))
        host_us, gpu_us = statistics.median(host), (statistics.median(gpu) if device.type == "cuda" else None)
        rows.append({"graph": name, "order": "original", "impl": impl, "op": "host", "F": features,
                     "nodes": g.num_nodes, "nnz": adj.nnz, "calls": calls, "host_us": host_us, "gpu_us": gpu_us,
                     "bound": None if gpu_us is None else ("device" if gpu_us > host_us else "host")})
    return rows


def _time_loop(call, calls: int, device: torch.device) -> tuple[float, float | None]:
    """(host us per call, device us per call) of ``calls`` back-to-back calls."""
    for _ in range(20):
        call()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t) / calls * 1e6
    if not cuda:
        return host, None
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def _table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['graph']}: {r['error']}")
        else:
            gpu = "" if r["gpu_us"] is None else f", device {r['gpu_us']:.1f} us ({r['bound']}-bound)"
            lines.append(f"{r['graph']:>20} {r['impl']:>22}: host {r['host_us']:.1f} us per call{gpu}")
    return "\n".join(lines)

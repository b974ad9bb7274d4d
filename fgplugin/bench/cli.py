"""``fgplugin bench SUITE``: the benchmark suites of BENCHMARKS.md from one command.

    fgplugin bench epoch                      # GPU: reddit-like, products-like; CPU: oklahoma97, cornell5, tolokers
    fgplugin bench epoch --graphs tiny --epochs 3 --out /tmp/r
    fgplugin bench epoch --impls fgplugin,dgl --orders original,community --device cpu
    fgplugin bench reorder --graphs tolokers  # time, dense-tile share and break-even epochs of each ordering
    fgplugin bench accuracy                   # parity on cora citeseer actor chameleon squirrel tolokers, 5 seeds
    fgplugin bench spmm                       # = python benchmarks/gpu_kernel_check.py --sections bench (also threshold)
    fgplugin bench scaling -- --gpus 1 2      # = python benchmarks/scaling.py ... (arguments after -- passed on)

Also ``python -m fgplugin.bench ...``. Results: ``<out>/<suite>.json`` (BENCHMARKS.md schema),
``.md`` and ``.png`` (with matplotlib) in ``--out`` (default ``./bench_results``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SUITES = ("epoch", "accuracy", "spmm", "threshold", "scaling", "reorder")
NOT_YET: dict = {}  # suite -> message, for suites listed but not implemented


def _list(text):
    return [t for t in text.split(",") if t] if text else None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fgplugin bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", help=f"one of {', '.join(SUITES)}")
    ap.add_argument("--graphs", help="comma list: synthetic presets (tiny, small, reddit-like, ...) or ../shared/data "
                                     "names/paths (default depends on the suite and device)")
    ap.add_argument("--impls", help="comma list of fgplugin, dgl, dgl-path, cusparse-cached, pyg-edge_index, "
                                    "pyg-adj_t, fgplugin-kernels, fgplugin-dgl, fgplugin-torch-dropout (default: all "
                                    "that can run here, fgplugin-dgl where DGL runs, fgplugin-torch-dropout on CPU; "
                                    "accuracy: pyg-edge_index,fgplugin)")
    ap.add_argument("--orders", default=None,
                    help="comma list: original and/or fgplugin.reorder methods, <method>-blockwise<parts> for "
                         "Algorithm 2 (default original,community; reorder suite: degsort,slashburn,rcm,metis,community)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epoch: timed steps per row (default 20, after --warmup); accuracy: training epochs (200)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=None, help="hidden width (default 128 reddit/proteins/archaea-like, "
                                                            "else 64)")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="accuracy: comma list of seeds")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default cuda when available)")
    ap.add_argument("--out", default="bench_results", help="result folder (default ./bench_results)")
    ap.add_argument("--name", default=None, help="result file stem (default: the suite)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _progress(enabled: bool, desc: str):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return lambda total: tqdm(total=total, desc=desc, unit="run", file=sys.stderr, leave=True)


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _script(name: str) -> Path:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / name
    if not path.is_file():
        raise SystemExit(f"fgplugin bench: this suite runs benchmarks/{name} of a source checkout, which is not "
                         f"beside this fgplugin ({path} is missing); clone the repository and run it there")
    return path


def _dispatch(args, extra) -> int:
    if args.suite in ("spmm", "threshold"):
        cmd = [sys.executable, str(_script("gpu_kernel_check.py")), "--sections", "bench", "--out", args.out]
        if args.graphs:
            cmd += ["--graphs", args.graphs]
        if args.impls:
            cmd += ["--impls", args.impls]
        if args.orders:
            cmd += ["--orders", args.orders]
    else:  # scaling
        cmd = [sys.executable, str(_script("scaling.py")), "--out", args.out]
        if args.graphs:
            cmd += ["--graphs", *_list(args.graphs)]
    cmd += extra
    _log("[bench] running: " + " ".join(cmd))
    os.makedirs(args.out, exist_ok=True)
    return subprocess.call(cmd)


def _prog() -> list[str]:
    """How this process was started, for the results' ``command``."""
    script = Path(sys.argv[0])
    if script.name == "__main__.py":
        return ["python", "-m", "fgplugin.bench"] if script.parent.name == "bench" else ["python", "-m", "fgplugin", "bench"]
    return ["fgplugin", "bench"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = parser()
    args = ap.parse_args(argv)
    if args.suite not in SUITES:
        ap.error(f"unknown suite {args.suite!r}; choose one of: {', '.join(SUITES)}")
    if args.suite in NOT_YET:
        _log(f"fgplugin bench: {NOT_YET[args.suite]}")
        return 2
    if args.suite in ("spmm", "threshold", "scaling"):
        return _dispatch(args, extra)
    if extra:
        ap.error(f"the {args.suite} suite takes no arguments after --")

    import torch

    from . import epoch, report
    from .baselines import IMPLS, VARIANTS

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device; use --device cpu")
    impls = _list(args.impls)
    bad = [i for i in impls or [] if i not in IMPLS + VARIANTS]
    if bad:
        ap.error(f"unknown impl(s) {', '.join(bad)}; choose from {', '.join(IMPLS + VARIANTS)}")
    orders = _list(args.orders) or (list(epoch.REORDER_METHODS) if args.suite == "reorder" else ["original", "community"])
    from fgplugin.reorder import METHODS
    bad = [o for o in orders if o != "original" and o.partition("-blockwise")[0] not in METHODS]
    if bad:
        ap.error(f"unknown order(s) {', '.join(bad)}; use original or one of {', '.join(METHODS)}")
    try:
        load_start = list(os.getloadavg())
    except OSError:
        load_start = None
    bar = _progress(not args.no_progress, args.suite)
    extra_keys = {}

    def checkpoint(rows_so_far):  # partial results survive a time limit
        partial = report.result(args.suite, rows_so_far, device, argv=[*_prog(), *argv], loadavg_start=load_start,
                                partial=True, **extra_keys)
        report.write(partial, args.out, args.name, log=_log, plot=False)

    if args.suite == "epoch":
        graphs = _list(args.graphs) or list(epoch.GPU_GRAPHS if device.type == "cuda" else epoch.CPU_GRAPHS)
        epochs = args.epochs or 20
        extra_keys.update(epochs_timed=epochs, warmup=args.warmup)

        rows = epoch.run_epoch_suite(graphs, impls or epoch.default_impls(device), orders, epochs, device,
                                     args.hidden, warmup=args.warmup, progress=bar, log=_log, checkpoint=checkpoint)
    elif args.suite == "reorder":
        graphs = _list(args.graphs) or list(epoch.GPU_GRAPHS if device.type == "cuda" else epoch.CPU_GRAPHS)
        epochs = args.epochs or 20
        extra_keys.update(epochs_timed=epochs, warmup=args.warmup, tile_size=32, threshold="auto")

        rows = epoch.run_reorder_suite(graphs, [o for o in orders if o != "original"], epochs, device, args.hidden,
                                       warmup=args.warmup, progress=bar, log=_log, checkpoint=checkpoint)
    else:  # accuracy
        graphs = _list(args.graphs) or list(epoch.ACCURACY_GRAPHS)
        epochs = args.epochs or 200
        seeds = [int(s) for s in _list(args.seeds)]
        rows = epoch.run_accuracy_suite(graphs, impls or ("pyg-edge_index", "fgplugin"), orders, seeds, epochs,
                                        args.hidden or 64, device, progress=bar, log=_log)
        extra_keys.update(epochs=epochs, seeds=seeds)
    res = report.result(args.suite, rows, device, argv=[*_prog(), *argv], loadavg_start=load_start,
                        **extra_keys)
    paths = report.write(res, args.out, args.name, log=_log)
    summary = {"epoch": report.epoch_summary, "accuracy": report.accuracy_summary,
               "reorder": report.reorder_summary}[args.suite](rows)
    print(summary)
    _log("[bench] wrote " + ", ".join(str(p) for p in paths.values()))
    failed = [r for r in rows if r.get("error")]
    if failed:
        _log(f"[bench] {len(failed)} row(s) could not run (kept with ms_median null and 'error')")
    return 0

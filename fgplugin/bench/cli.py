"""``fgplugin bench SUITE``: fgplugin's benchmark suites from one command (see docs/benchmarks.md
for the method).

    fgplugin bench epoch                      # GPU: reddit-like, products-like; CPU: small (synthetic)
    fgplugin bench epoch --graphs tiny --epochs 3 --out /tmp/r
    fgplugin bench epoch --impls fgplugin,dgl --orders original,community --device cpu
    fgplugin bench reorder --graphs small     # time, dense-tile share and break-even epochs of each ordering
    FGPLUGIN_DATA_DIR=/path/to/npz fgplugin bench accuracy   # parity on cora citeseer actor chameleon
                                              # squirrel tolokers, 5 seeds
    fgplugin bench spmm                       # the CUDA SpMM kernels (GPU only); --quick for a short run
    fgplugin bench threshold                  # fixed dense-tile thresholds against "auto" (GPU only)
    fgplugin bench scaling --gpus 1 2         # multi-GPU epochs; `fgplugin bench scaling --help` lists its options
    fgplugin bench host --graphs cora         # host time per aggregation call vs torch.sparse.mm

Also ``python -m fgplugin.bench ...``. Graphs: synthetic presets of ``fgplugin.datasets.SUITE``
(tiny, small, reddit-like, proteins-like, products-like, archaea-like; generated, no files needed)
or real ``.npz`` graphs by name (looked up in $FGPLUGIN_DATA_DIR) or path.

Implementations: by default those that can run here (one note names any left out because their
library is missing or cannot run on the device); one named in --impls that cannot run is a
failed row.

Results: ``<out>/<suite>.json`` (``--name`` for another stem; the spmm suite also writes
``threshold.json``), a markdown table ``.md`` and, for epoch, accuracy and reorder, a plot
``.png`` (with matplotlib) in ``--out`` (default ./bench_results; for scaling, $OUT first). ``commit`` in the JSON is
``--commit``, else $FGPLUGIN_COMMIT, else null; ``fgplugin_version`` is the installed fgplugin's.

Exit status: 0 when every row ran; 1 when a row failed (each failed row is printed on stderr with
its graph, order, impl and reason, and kept in the JSON with ``error``; in the spmm and threshold
suites also a product over its precision's error limit or with NaN in its output); 2 for a usage
error or a suite that cannot run here (spmm and threshold without a CUDA GPU; accuracy without its
data).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SUITES = ("epoch", "accuracy", "spmm", "threshold", "scaling", "reorder", "host")
GPU_SUITES = ("spmm", "threshold")
NOT_YET: dict = {}  # suite -> message, for suites listed but not implemented
# spmm / threshold options (None: not given)
# Options that only some suites take: {option: those suites}
SUITE_OPTIONS = {**{o: ("spmm", "threshold") for o in ("f_sweep", "reps", "quick", "sweep_graph", "sweep_order")},
                 "precisions": ("spmm", "threshold", "epoch", "accuracy")}


def _list(text):
    return [t for t in text.split(",") if t] if text else None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fgplugin bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", help=f"one of {', '.join(SUITES)}")
    ap.add_argument("--graphs", help="comma list: synthetic presets (tiny, small, reddit-like, ...) or .npz graph "
                                     "names (in $FGPLUGIN_DATA_DIR) or paths. Default: epoch and reorder: "
                                     "reddit-like,products-like on CUDA, small on CPU; accuracy: cora,citeseer,"
                                     "actor,chameleon,squirrel,tolokers (needs $FGPLUGIN_DATA_DIR); spmm: small,"
                                     "reddit-like,proteins-like,products-like,archaea-like")
    ap.add_argument("--impls", help="comma list. epoch/reorder/accuracy: fgplugin, dgl, dgl-path, cusparse-cached, "
                                    "pyg-edge_index, pyg-adj_t, fgplugin-kernels, fgplugin-dgl, "
                                    "fgplugin-torch-dropout, fgplugin-sharded, fgplugin-graphed, and a baseline "
                                    "trained by the same captured step: pyg-edge_index-graphed, pyg-adj_t-graphed, "
                                    "dgl-path-graphed, cusparse-cached-graphed (default: all that can run here but "
                                    "fgplugin-sharded and the -graphed ones, fgplugin-torch-dropout "
                                    "on CPU only; accuracy: pyg-edge_index,fgplugin). spmm/threshold: fgplugin, "
                                    "fgplugin-nodense, fgplugin-csr, fgplugin-t2, fgplugin-t5, fgplugin-t10, "
                                    "cusparse-cached, dgl-path (default: all; threshold: fgplugin and "
                                    "fgplugin-t*)")
    ap.add_argument("--orders", default=None,
                    help="comma list: original and/or fgplugin.reorder methods, <method>-blockwise<parts> for "
                         "Algorithm 2 (default original,community; reorder suite: degsort,slashburn,rcm,metis,"
                         "community; spmm/threshold: original,community,ideal, ideal = the synthetic generator's "
                         "communities)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epoch/reorder: timed steps per row (default 20, after --warmup); accuracy: training "
                         "epochs (200)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="epoch: time each graph's impls in this many alternating rounds, all built at once (default "
                         "1: one impl after the other, each alone in memory)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden width (default 128 reddit/proteins/archaea-like, "
                                                            "else 64)")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="accuracy: comma list of seeds")
    ap.add_argument("--models", default=None, help="epoch and accuracy: comma list of gcn (default), "
                                                   "gcn-input-dropout (dropout on the input too, as PyG's "
                                                   "examples/gcn.py), sage (2-layer SAGEConv, mean)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default cuda when available; spmm and "
                                                   "threshold need CUDA)")
    ap.add_argument("--out", default="bench_results", help="result folder (default ./bench_results)")
    ap.add_argument("--name", default=None, help="result file stem (default: the suite)")
    ap.add_argument("--commit", default=None,
                    help="the source version to record as the results' commit (default $FGPLUGIN_COMMIT, else null)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--precisions", default=None, help="comma list. spmm/threshold: fp32, tf32, bf16 (default all "
                                                       "three; threshold: fp32); epoch/accuracy: fp32, bf16, fp16 "
                                                       "(torch.autocast around the forward, for every impl; default "
                                                       "fp32)")
    spmm = ap.add_argument_group("spmm and threshold suites")
    spmm.add_argument("--F", dest="f_sweep", default=None,
                      help="comma list: the F values of the sweep graph (default 32,64,128,256; every graph runs "
                           "F=128; threshold: 128 only)")
    spmm.add_argument("--sweep-graph", default=None, help="the graph of the F sweep (default reddit-like)")
    spmm.add_argument("--sweep-order", default=None, help="the order of the F sweep (default community)")
    spmm.add_argument("--reps", type=int, default=None, help="timed calls per row (default 20)")
    spmm.add_argument("--quick", action="store_true", default=None, help="small + reddit-like, F=128 only")
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


def _prog() -> list[str]:
    """How this process was started, for the results' ``command``."""
    script = Path(sys.argv[0])
    if script.name == "__main__.py":
        return ["python", "-m", "fgplugin.bench"] if script.parent.name == "bench" else ["python", "-m", "fgplugin", "bench"]
    return ["fgplugin", "bench"]


def _models(args, ap) -> list[str]:
    """The epoch and accuracy suites' ``--models`` (default gcn), checked against ``MODELS``."""
    from .baselines import MODELS

    models = _list(args.models) or ["gcn"]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
    return models


def _precisions(args, ap, known) -> list[str]:
    """The epoch and accuracy suites' ``--precisions`` (default fp32), checked against ``known``."""
    precisions = _list(args.precisions) or ["fp32"]
    bad = [p for p in precisions if p not in known]
    if bad:
        ap.error(f"unknown precision(s) {', '.join(bad)} for the {args.suite} suite; choose from {', '.join(known)}")
    return precisions


def _report_failures(rows, out_path=None) -> int:
    """Print each failed row on stderr; 1 when there was one, else 0."""
    from .report import failures

    lines = failures(rows)
    for line in lines:
        _log(f"[bench] FAILED {line}")
    if lines:
        where = f" (kept in {out_path} with 'error')" if out_path else ""
        _log(f"[bench] {len(lines)} failed run(s){where}")
    return 1 if lines else 0


def _missing_accuracy_data(graphs) -> str | None:
    """Why the accuracy suite's default graphs cannot be read, or ``None``."""
    from fgplugin.datasets import ENV_VAR, data_dir

    folder = data_dir()
    if folder is None:
        why = f"{ENV_VAR} is not set"
    else:
        missing = [g for g in graphs if not (folder / f"{g}.npz").is_file()]
        if not missing:
            return None
        why = f"{ENV_VAR}={folder} has no {', '.join(g + '.npz' for g in missing)}"
    return (f"fgplugin bench accuracy: its default graphs ({', '.join(graphs)}) are real labelled graphs and were not "
            f"found: {why}. Set {ENV_VAR} to the folder holding their .npz files, or pass --graphs (e.g. "
            f"--graphs tiny,small, synthetic presets that need no files).")


def _run_spmm(args, argv, ap) -> int:
    from . import spmm

    impls = _list(args.impls)
    bad = [i for i in impls or [] if i not in spmm.IMPLS]
    if bad:
        ap.error(f"unknown impl(s) {', '.join(bad)} for the {args.suite} suite; choose from {', '.join(spmm.IMPLS)}")
    orders = _list(args.orders) or list(spmm.DEFAULT_ORDERS)
    from fgplugin.reorder import METHODS
    bad = [o for o in orders if o not in ("original", "ideal") and o.partition("-blockwise")[0] not in METHODS]
    if bad:
        ap.error(f"unknown order(s) {', '.join(bad)}; use original, ideal or one of {', '.join(METHODS)}")
    precisions = _list(args.precisions) or (list(spmm.PRECISIONS) if args.suite == "spmm" else ["fp32"])
    bad = [p for p in precisions if p not in spmm.PRECISIONS]
    if bad:
        ap.error(f"unknown precision(s) {', '.join(bad)}; choose from {', '.join(spmm.PRECISIONS)}")
    try:
        f_sweep = [int(f) for f in _list(args.f_sweep)] if args.f_sweep else None
    except ValueError:
        ap.error(f"--F takes a comma list of whole numbers, got {args.f_sweep!r}")
    graphs = _list(args.graphs)
    if args.quick:
        graphs = graphs or list(spmm.QUICK_GRAPHS)
        f_sweep = f_sweep or [128]
    if f_sweep is None:
        f_sweep = list(spmm.DEFAULT_F) if args.suite == "spmm" else [128]
    opts = spmm.Options(graphs=graphs or list(spmm.DEFAULT_GRAPHS), orders=orders,
                        impls=impls or (None if args.suite == "spmm" else list(spmm.THRESHOLD_IMPLS)),
                        f_sweep=f_sweep, sweep_graph=args.sweep_graph or spmm.SWEEP_GRAPH,
                        sweep_order=args.sweep_order or spmm.SWEEP_ORDER, reps=args.reps or spmm.REPS,
                        precisions=precisions)
    if args.device is not None and not args.device.startswith("cuda"):
        _log(f"fgplugin bench {args.suite}: needs a CUDA device, got --device {args.device}; it times fgplugin's "
             "CUDA kernels")
        return 2
    why = spmm.unavailable_reason()
    if why:
        _log(f"fgplugin bench {args.suite}: {why}. Nothing was run. (The CPU suites: epoch, reorder, accuracy, host.)")
        return 2
    import torch

    if args.device and ":" in args.device:
        torch.cuda.set_device(torch.device(args.device))
    rows, paths = spmm.run_suite(args.suite, opts, args.out, name=args.name, argv=[*_prog(), *argv],
                                 commit=args.commit, log=_log)
    _log("[bench] wrote " + ", ".join(str(p) for per_suite in paths.values() for p in per_suite.values()))
    return _report_failures(rows, paths[args.suite]["json"])  # spmm: its threshold rows are copies of its rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "scaling":  # its own options: `fgplugin bench scaling --help`
        from . import scaling

        rest = [a for a in argv[1:] if a != "--"]
        return scaling.main(rest, prog=[*_prog(), "scaling"])
    if argv and argv[0] == "host":  # its own options: `fgplugin bench host --help`
        from . import host

        return host.main(argv[1:], prog=[*_prog(), "host"])
    if "--" in argv:  # older command lines passed suite options after --: read them like the others
        i = argv.index("--")
        argv = argv[:i] + argv[i + 1:]
    ap = parser()
    args = ap.parse_args(argv)
    if args.suite not in SUITES:
        ap.error(f"unknown suite {args.suite!r}; choose one of: {', '.join(SUITES)}")
    if args.suite in NOT_YET:
        _log(f"fgplugin bench: {NOT_YET[args.suite]}")
        return 2
    if args.commit is None:
        from fgplugin.config import commit
        args.commit = commit()
    if args.suite in GPU_SUITES:
        return _run_spmm(args, argv, ap)
    given = [o for o, suites in SUITE_OPTIONS.items() if getattr(args, o) is not None and args.suite not in suites]
    if given:
        ap.error("; ".join(f"--{o.replace('_', '-').replace('f-sweep', 'F')}: an option of the "
                           f"{', '.join(SUITE_OPTIONS[o])} suites" for o in given) + f", not of {args.suite}")

    import torch

    from . import epoch, report
    from .baselines import IMPLS, MODELS, VARIANTS

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
    graphs = _list(args.graphs)
    if args.suite == "accuracy" and not graphs:
        why = _missing_accuracy_data(epoch.ACCURACY_GRAPHS)
        if why:
            _log(why)
            return 2
    if impls is None and args.suite != "reorder":  # defaults: what can run here, a note for the rest
        left_out = {}
        if args.suite == "epoch":
            impls = list(epoch.default_impls(device, left_out))
        else:
            impls, left_out = epoch.impl_availability(("pyg-edge_index", "fgplugin"), device)
            impls = list(impls)
        for why, names in left_out.items():
            _log(f"[bench] note: left out {', '.join(names)}: {why} (name them in --impls to try anyway)")
        if not impls:
            _log(f"fgplugin bench {args.suite}: none of its default implementations can run here; see the note above")
            return 2
    try:
        load_start = list(os.getloadavg())
    except OSError:
        load_start = None
    bar = _progress(not args.no_progress, args.suite)
    extra_keys = {}
    command = [*_prog(), *argv]

    def checkpoint(rows_so_far):  # partial results survive a time limit
        partial = report.result(args.suite, rows_so_far, device, argv=command, commit=args.commit,
                                loadavg_start=load_start, partial=True, **extra_keys)
        report.write(partial, args.out, args.name, log=_log, plot=False)

    if args.suite == "epoch":
        graphs = graphs or list(epoch.GPU_GRAPHS if device.type == "cuda" else epoch.CPU_GRAPHS)
        epochs = args.epochs or 20
        models = _models(args, ap)
        precisions = _precisions(args, ap, epoch.AUTOCAST)
        extra_keys.update(epochs_timed=epochs, warmup=args.warmup, models=models, precisions=precisions,
                          rounds=args.rounds)

        rows = epoch.run_epoch_suite(graphs, impls, orders, epochs, device, args.hidden, warmup=args.warmup,
                                     progress=bar, log=_log, checkpoint=checkpoint, models=models,
                                     precisions=precisions, rounds=args.rounds)
    elif args.suite == "reorder":
        graphs = graphs or list(epoch.GPU_GRAPHS if device.type == "cuda" else epoch.CPU_GRAPHS)
        epochs = args.epochs or 20
        extra_keys.update(epochs_timed=epochs, warmup=args.warmup, tile_size=32, threshold="auto")

        rows = epoch.run_reorder_suite(graphs, [o for o in orders if o != "original"], epochs, device, args.hidden,
                                       warmup=args.warmup, progress=bar, log=_log, checkpoint=checkpoint)
    else:  # accuracy
        graphs = graphs or list(epoch.ACCURACY_GRAPHS)
        epochs = args.epochs or 200
        seeds = [int(s) for s in _list(args.seeds)]
        precisions = _precisions(args, ap, epoch.AUTOCAST)
        models = _models(args, ap)
        rows = epoch.run_accuracy_suite(graphs, impls, orders, seeds, epochs, args.hidden or 64, device,
                                        progress=bar, log=_log, precisions=precisions, models=models)
        extra_keys.update(epochs=epochs, seeds=seeds, precisions=precisions, models=models)
    res = report.result(args.suite, rows, device, argv=command, commit=args.commit, loadavg_start=load_start,
                        **extra_keys)
    paths = report.write(res, args.out, args.name, log=_log)
    summary = {"epoch": report.epoch_summary, "accuracy": report.accuracy_summary,
               "reorder": report.reorder_summary}[args.suite](rows)
    print(summary)
    _log("[bench] wrote " + ", ".join(str(p) for p in paths.values()))
    return _report_failures(rows, paths["json"])

"""The ``scaling`` suite: full-batch 2-layer GCN epochs on 1, 2 and 4 GPUs of one host.

    fgplugin bench scaling                                        # whole suite -> <out>/scaling.json
    fgplugin bench scaling --quick                                # small smoke run
    fgplugin bench scaling --graphs tiny --gpus 1 2 --backend gloo --epochs 2   # CPU smoke run (gloo)
    python -m fgplugin.bench.scaling --help                       # the same, without the fgplugin command

The driver runs one ``torch.distributed.run --nproc_per_node=G -m fgplugin.bench.scaling --worker``
job per GPU count G (each in a launcher process of its own, stopped after ``--launch-timeout``
seconds), each worker process generating the graphs on its own GPU (same seed = same graph), then
merges their rows into ``<out>/scaling.json`` (``--out``, else ``$OUT``, else ``./bench_results``) with a
markdown table beside it. Graphs are the synthetic presets of :data:`fgplugin.datasets.SUITE`.
The launcher sets ``NCCL_NVLS_ENABLE=0`` for the workers.

Per graph and GPU count it measures, for every sharding (1D; 1.5D r=2 when G >= 4), exchange mode
(``sparse``: only the feature rows a rank's non-zeros touch, point to point; ``broadcast``: the
paper's whole-block broadcast, one all-gather in 1D) and ordering (``original``; ``<method>``: whole-graph reordering,
which also clusters nodes into the row blocks and so cuts communication; ``<method>-blockwise<q>``:
Algorithm 2 with one part per row block, node ids kept in their block):

- ``ms_median/min/max``: training epoch (forward, backward, gradient all-reduce, Adam), CUDA
  events on each rank, median of ``--epochs`` after warm-up, slowest rank;
- ``spmm_ms``: SpMM time per epoch (the slowest rank; ``spmm_local_ms``: the own block's
  products, which overlap the transfers, ``spmm_remote_ms``: the other blocks'), ``pack_ms``:
  gathering rows into send buffers and adding received ones in, ``comm_ms``: *exposed*
  communication of the graph (time the rank's stream waited for a row transfer; hidden transfers
  cost nothing; DDP's gradient all-reduce runs inside the backward pass and is not split out),
  ``compute_ms`` = epoch - comm;
  ``imbalance`` = max / mean over ranks of the SpMM time; ``symmetric``: the backward ran the
  forward product (symmetric normalized adjacency) instead of the transposed blocks;
- ``peak_mem_bytes``: largest per-rank peak of the run itself (shard, activations, buffers;
  the generated whole graph each worker keeps for the next configuration is subtracted);
- ``recv_bytes``: feature bytes received per epoch by the busiest rank;
- ``skip_zero_rows``: the zero-row skipping was on (``FGPLUGIN_SKIP_ZERO_ROWS``), and
  ``live_row_exchange``: rank 0's statistics of the backward's live-row exchange
  (:mod:`fgplugin.distributed.live_rows`).

``gpus=1`` rows include plain single-GPU fgplugin (``impl`` ``fgplugin``: ``spmm`` on the whole
graph, no sharding code), the reference of the 4-GPU speedup target. See docs/benchmarks.md for
the method.

Each failed row (and each launch that failed) is printed on stderr with its reason; the command
exits with status 1 when any row failed, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HIDDEN = {"products-like": 64}  # the graph table of docs/benchmarks.md; 128 elsewhere
MODULE = "fgplugin.bench.scaling"


# ============================================================================ driver
def driver(args) -> int:
    out_dir = Path(args.out or os.environ.get("OUT") or "bench_results")
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"),
           "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH")) if p)}
    rows, started = [], time.time()
    for gpus in args.gpus:
        part = out_dir / f".scaling_part_{gpus}.json"
        part.unlink(missing_ok=True)
        launch = ["--standalone", f"--nproc_per_node={gpus}", "-m", MODULE, "--worker", "--part", str(part),
                  "--cache", args.cache, *_forward_args(args)]
        print(f"=== {gpus} rank(s): torch.distributed.run {' '.join(launch)}", flush=True)
        status = _launch(launch, env, args.launch_timeout)
        got = json.loads(part.read_text()) if part.exists() else []
        part.unlink(missing_ok=True)
        rows += got
        if status:
            print(f"!!! {gpus}-rank job: {status}; kept its {len(got)} finished rows", flush=True)
            rows.append({"gpus": gpus, "ms_median": None, "error": f"job {status}"})
    result = _header(args) | {"rows": rows, "wall_s": round(time.time() - started, 1)}
    path = out_dir / "scaling.json"
    path.write_text(json.dumps(result, indent=1))
    table = _table(rows)
    (out_dir / "scaling.md").write_text(f"# scaling ({result['device']})\n\n`{result['command']}`\n\n{table}\n")
    print(table)
    print(f"wrote {path} ({len(rows)} rows, {result['wall_s']} s)")
    failed = _failures(rows)
    for line in failed:
        print(f"[scaling] FAILED {line}", file=sys.stderr, flush=True)
    if failed:
        print(f"[scaling] {len(failed)} failed row(s) (kept in {path} with ms_median null and 'error')",
              file=sys.stderr, flush=True)
    return 1 if failed else 0


def _package_root() -> str:
    """The folder holding the ``fgplugin`` package, so the workers import the same fgplugin."""
    import fgplugin

    return str(Path(fgplugin.__file__).resolve().parents[1])


def _launch(launch_args: list[str], env: dict, timeout: float) -> str | None:
    """Run ``torch.distributed.run`` with ``launch_args`` in a launcher process of its own (its
    environment updated with ``env``); ``None`` when it succeeded, else what went wrong. After
    ``timeout`` seconds the launcher is terminated, which stops its workers."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_torchrun, args=(launch_args, env), name="fgplugin-scaling-launcher")
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()  # SIGTERM: torch.distributed.run stops its workers, then exits
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()
        return f"killed after {timeout} s"
    return f"exit code {proc.exitcode}" if proc.exitcode else None


def _torchrun(launch_args: list[str], env: dict) -> None:
    """The launcher process: ``python -m torch.distributed.run LAUNCH_ARGS``, in-process."""
    os.environ.update(env)
    from torch.distributed.run import main as torchrun_main

    torchrun_main(launch_args)


def _failures(rows) -> list[str]:
    lines = []
    for r in rows:
        if r.get("ms_median") is None or r.get("error"):
            what = " / ".join(str(r.get(k, "-")) for k in ("graph", "order", "impl"))
            where = f"{r.get('gpus')} GPU(s)" + (f", {r['scheme']}" if r.get("scheme") else "")
            lines.append(f"{what} ({where}): {r.get('error') or 'no time recorded'}")
    return lines


def _forward_args(args) -> list[str]:
    out = ["--graphs", *args.graphs, "--method", args.method, "--comm", *args.comm, "--orders", *args.orders,
           "--epochs", str(args.epochs), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    if args.quick:
        out.append("--quick")
    if args.kernels:
        out.append("--kernels")
    if args.backend:
        out += ["--backend", args.backend]
    return out


def _header(args) -> dict:
    import torch

    import fgplugin

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.backend != "gloo" else "cpu"
    return {"suite": "scaling", "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "commit": args.commit, "fgplugin_version": fgplugin.__version__,
            "command": " ".join(shlex.quote(a) for a in [*args.prog, *args.argv]), "env": {"NCCL_NVLS_ENABLE": "0"}}


def _table(rows) -> str:
    head = ("graph", "gpus", "scheme", "r", "impl", "order", "ms", "spmm", "pack", "comm", "imbal", "peak GB", "recv MB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        if r.get("ms_median") is None:
            lines.append(f"| {r.get('graph', '-')} | {r.get('gpus')} | {r.get('scheme', '-')} | {r.get('replication', '-')} "
                         f"| {r.get('impl', '-')} | {r.get('order', '-')} | error: {str(r.get('error'))[:60]} |")
            continue
        lines.append(f"| {r['graph']} | {r['gpus']} | {r['scheme']} | {r['replication']} | {r['impl']} | {r['order']} "
                     f"| {f(r['ms_median'])} | {f(r.get('spmm_ms'))} | {f(r.get('pack_ms'))} | {f(r.get('comm_ms'))} "
                     f"| {f(r.get('imbalance'), 3)} "
                     f"| {f(r['peak_mem_bytes'] / 1e9 if r.get('peak_mem_bytes') is not None else None)} "
                     f"| {f(r['recv_bytes'] / 1e6 if r.get('recv_bytes') is not None else None, 1)} |")
    return "\n".join(lines)


# ============================================================================ worker
def worker(args) -> int:
    import torch
    import torch.distributed as dist

    from fgplugin.distributed import ShardingContext, init_distributed

    device = init_distributed(args.backend, timeout=300)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows: list[dict] = []
    contexts = {}

    def flush():
        if rank == 0:
            Path(args.part).write_text(json.dumps(rows, indent=1))

    for name in args.graphs:
        try:
            data = _graph(name, args, device)
        except Exception as err:  # noqa: BLE001 -- keep the row, go on with the next graph
            rows.append({"graph": name, "gpus": world, "ms_median": None, "error": _short(err)})
            flush()
            continue
        for order, parts in _orders(args, world):
            perm = None
            if order != "original":
                try:
                    perm = _perm(data, args.method, parts, args, device)
                except Exception as err:  # noqa: BLE001
                    rows.append({"graph": name, "gpus": world, "order": _order_name(args.method, parts),
                                 "ms_median": None, "error": _short(err)})
                    flush()
                    continue
            label = "original" if perm is None else _order_name(args.method, parts)
            for replication in _replications(world):
                q = world // replication
                # Block-wise orderings belong to one block count; whole-graph / original to all.
                if parts > 1 and parts != q:
                    continue
                for comm in args.comm:
                    if world == 1 and comm != args.comm[0]:
                        continue  # nothing to exchange on one rank
                    if (replication, comm) not in contexts:  # new_group is collective and costs: create once
                        mode, _, wire = comm.partition("-")
                        contexts[replication, comm] = ShardingContext(
                            replication, comm=mode, comm_dtype=torch.bfloat16 if wire == "bf16" else None)
                    rows.append(_run_config(data, perm, label, contexts[replication, comm], args, device))
                    if rank == 0:
                        _print_row(rows[-1])
                    flush()
            if world == 1 and order != "blockwise":
                rows.append(_run_single(data, perm, label, args, device))
                if rank == 0:
                    _print_row(rows[-1])
                flush()
        del data
        _empty_cache(device)
    flush()
    dist.destroy_process_group()
    return 0


def _orders(args, world):
    """(order kind, parts) pairs to measure on this world size."""
    out = []
    for kind in args.orders:
        if kind == "original":
            out.append(("original", 1))
        elif kind == "whole":
            out.append(("whole", 1))
        elif kind == "blockwise" and world > 1:
            out += [("blockwise", world // r) for r in _replications(world)]
    return out


def _replications(world):
    return [1] + ([2] if world >= 4 else [])


def _order_name(method, parts):
    return method if parts == 1 else f"{method}-blockwise{parts}"


def _graph(name, args, device):
    """Every rank generates the graph on its GPU (timed), then takes rank 0's copy.

    Why the broadcast: at archaea-like size (200M edges) one of four H200s once generated a
    graph that differed from the other three in a handful of edges (same edge count, different
    edge hash), and the sharding's agreement check refused it. Until that is understood, rank 0's
    graph is the one every rank uses; ``meta["generator_disagreed"]`` lists the ranks whose own
    graph differed from rank 0's, so the results keep the evidence."""
    import torch
    import torch.distributed as dist

    from fgplugin.datasets import community_graph

    t = time.perf_counter()
    data = community_graph("small" if args.quick else name, seed=args.seed, device=device)
    data.name = name
    if device.type == "cuda":
        torch.cuda.synchronize()
    data.meta["generate_s"] = time.perf_counter() - t
    fields = ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask")
    mine = torch.tensor([_digest(getattr(data, f)) for f in fields if getattr(data, f) is not None]
                        + [data.edge_index.shape[1]], device=device)
    digests = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(digests, mine)
    data.meta["generator_disagreed"] = [r for r, d in enumerate(digests) if not torch.equal(d, digests[0])]
    if data.meta["generator_disagreed"]:
        print(f"{name}: ranks {data.meta['generator_disagreed']} generated a graph unlike rank 0's; "
              "using rank 0's everywhere", flush=True)
        num_edges = int(digests[0][-1])
        if data.edge_index.shape[1] != num_edges:
            data.edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
        for f in fields:
            if getattr(data, f) is not None:
                dist.broadcast(getattr(data, f), 0)
    return data


def _digest(t) -> int:
    """An order-sensitive integer digest of a tensor (for comparing copies across ranks)."""
    import torch

    flat = t.reshape(-1)
    if flat.is_floating_point():
        flat = flat.view(torch.int32) if flat.dtype == torch.float32 else flat.double().view(torch.int64)
    flat = flat.long()
    weights = torch.arange(flat.numel(), device=flat.device) % 1_000_003 + 1
    return int(((flat % 2_147_483_647) * weights % 2_147_483_647).sum())


def _perm(data, method, parts, args, device):
    """Rank 0 computes the ordering (or reads it from the cache the earlier jobs wrote) and
    broadcasts it, so every rank shards with the same one."""
    import torch
    import torch.distributed as dist

    perm = torch.empty(data.num_nodes, dtype=torch.long, device=device)
    if dist.get_rank() == 0:
        cache = Path(args.cache) / f"{data.name}{'-quick' if args.quick else ''}-seed{args.seed}-{method}-parts{parts}.pt"
        if cache.exists():
            perm.copy_(torch.load(cache, weights_only=True))
        else:
            from fgplugin.reorder import reorder

            t = time.perf_counter()
            perm.copy_(reorder(data.edge_index, method, num_nodes=data.num_nodes, parts=parts))
            print(f"reorder {data.name} {method} parts={parts}: {time.perf_counter() - t:.2f} s", flush=True)
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save(perm.to(torch.int32).cpu(), cache)
    dist.broadcast(perm, 0)
    return perm


def _run_config(data, perm, label, ctx, args, device) -> dict:
    import torch
    import torch.distributed as dist

    world, replication = dist.get_world_size(), ctx.replication
    comm = ctx.comm + ("-bf16" if ctx.comm_dtype == torch.bfloat16 else "")
    row = {"graph": data.name, "order": label, "impl": f"fgplugin-dist-{comm}", "op": "epoch",
           "F": data.num_features, "hidden": HIDDEN.get(data.name, 128), "precision": "fp32", "gpus": world,
           "scheme": "1d" if replication == 1 else "1.5d", "replication": replication, "comm": comm,
           "num_nodes": data.num_nodes, "nnz": data.num_edges}
    if data.meta.get("generator_disagreed"):
        row["generator_disagreed"] = data.meta["generator_disagreed"]
    graph = trainer = None
    try:
        from fgplugin.config import settings
        from fgplugin.distributed import DistGCN, DistributedTrainer, Profiler, ShardedGraph

        base = _mem_reset(device)
        t = time.perf_counter()
        graph = ShardedGraph.from_edge_index(ctx, data.edge_index, data.num_nodes, perm=perm,
                                             extra_fingerprint=(data.num_features,))
        x, y, train = graph.rows(data.x), graph.rows(data.y), graph.rows(data.train_mask)
        model = DistGCN((data.num_features, row["hidden"], data.num_classes)).to(device)
        trainer = DistributedTrainer(model, graph, x, y, train, torch.optim.Adam(model.parameters(), lr=0.01))
        _sync(device)
        row["setup_s"] = _max(time.perf_counter() - t, device)
        row["setup_peak_bytes"] = int(_max(_mem_peak(device) - base, device))
        row["shard_bytes"] = int(_max(graph.nbytes, device))
        _mem_reset(device)
        times = _time_epochs(trainer, args, device)
        peak = _mem_peak(device) - base
        graph.profiler = Profiler(device)
        split = []
        for _ in range(max(3, args.epochs // 2)):
            graph.profiler.reset()
            trainer.step(metrics=False)
            tot = graph.profiler.totals()
            split.append([tot.get(kind, 0.0) for kind in _KINDS] + [graph.profiler.bytes_received])
        graph.profiler = None
        if args.kernels:
            _kernel_table(trainer, row, device)
        row["loss"] = trainer.step()["loss"]
        kinds = [statistics.median(s[i] for s in split) for i in range(len(_KINDS))]
        per_rank = _gather([statistics.median(times), min(times), max(times), *kinds, float(peak),
                            float(split[-1][-1])], device)
        epoch = [r[0] for r in per_rank]
        by_kind = {kind: [r[3 + i] for r in per_rank] for i, kind in enumerate(_KINDS)}
        spmm = [a + b for a, b in zip(by_kind["spmm_local"], by_kind["spmm_remote"])]
        comm = by_kind["comm"]
        peaks, received = [int(r[-2]) for r in per_rank], [int(r[-1]) for r in per_rank]
        row |= {
            "ms_median": max(epoch), "ms_min": max(r[1] for r in per_rank), "ms_max": max(r[2] for r in per_rank),
            "spmm_ms": max(spmm), "spmm_local_ms": max(by_kind["spmm_local"]),
            "spmm_remote_ms": max(by_kind["spmm_remote"]), "pack_ms": max(by_kind["pack"]), "comm_ms": max(comm),
            "compute_ms": max(e - c for e, c in zip(epoch, comm)),
            "imbalance": max(spmm) / (sum(spmm) / len(spmm)) if sum(spmm) else None,
            "symmetric": graph.symmetric, "peak_mem_bytes": max(peaks), "recv_bytes": max(received),
            "skip_zero_rows": settings.skip_zero_rows, "live_row_exchange": graph.live_rows.stats(),
            "per_rank": {"epoch_ms": epoch, "spmm_ms": spmm, **{f"{k}_ms": v for k, v in by_kind.items()},
                         "peak_mem_bytes": peaks, "recv_bytes": received},
        }
    except Exception as err:  # noqa: BLE001 -- an OOM on every rank alike: record it and go on
        row |= {"ms_median": None, "error": _short(err)}
        if dist.get_rank() == 0:
            traceback.print_exc()
    del graph, trainer
    _empty_cache(device)
    return row


def _run_single(data, perm, label, args, device) -> dict:
    """Plain single-GPU fgplugin: the whole (reordered) graph, fgplugin.spmm, no sharding code."""
    import torch
    import torch.nn.functional as F

    row = {"graph": data.name, "order": label, "impl": "fgplugin", "op": "epoch", "F": data.num_features,
           "hidden": HIDDEN.get(data.name, 128), "precision": "fp32", "gpus": 1, "scheme": "single",
           "replication": 1, "comm": None, "num_nodes": data.num_nodes, "nnz": data.num_edges,
           "comm_ms": 0.0, "imbalance": 1.0}
    try:
        from fgplugin import TiledAdjacency
        from fgplugin.aggregation import Aggregation
        from fgplugin.config import settings
        from fgplugin.distributed import DistGCN
        from fgplugin.reorder import inverse_permutation

        base = _mem_reset(device)
        ei, x, y, train = data.edge_index, data.x, data.y, data.train_mask
        if perm is not None:
            ei, x, y, train = inverse_permutation(perm)[ei], x[perm], y[perm], train[perm]
        # The GCN-normalized product, its scales in the features' float32 as the distributed graph's.
        graph = Aggregation.of(TiledAdjacency.from_edge_index(ei, data.num_nodes), dtype=torch.float32)
        del ei
        idx = train.nonzero().squeeze(1)
        model = DistGCN((data.num_features, row["hidden"], data.num_classes)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        class _Plain:  # the trainer interface _time_epochs uses
            def step(self, metrics=False):
                opt.zero_grad()
                loss = F.cross_entropy(model(graph, x)[idx], y[idx])
                loss.backward()
                opt.step()
                return {"loss": float(loss.detach())} if metrics else {}

        plain = _Plain()
        _sync(device)
        row["setup_peak_bytes"] = _mem_peak(device) - base
        row["shard_bytes"] = graph.adj.nbytes
        _mem_reset(device)
        times = _time_epochs(plain, args, device)
        row |= {"ms_median": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
                "peak_mem_bytes": _mem_peak(device) - base, "loss": plain.step(True)["loss"],
                "skip_zero_rows": settings.skip_zero_rows}
        row["compute_ms"] = row["ms_median"]
        del graph, model, opt, x, y, train, plain
    except Exception as err:  # noqa: BLE001
        row |= {"ms_median": None, "error": _short(err)}
        traceback.print_exc()
    _empty_cache(device)
    return row


_KINDS = ("spmm_local", "spmm_remote", "pack", "comm")  # ShardedGraph.region kinds


def _kernel_table(trainer, row, device, steps: int = 3) -> None:
    """Rank 0 prints its GPU time per kernel per epoch (torch.profiler over ``steps`` epochs; every
    rank runs them, so the collectives stay matched). Diagnostic: nothing goes into the results."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            trainer.step(metrics=False)
        _sync(device)
    if dist.get_rank() != 0:
        return
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) / steps / 1e3
    print(f"--- rank 0 kernels, {row['graph']} {row['gpus']}x {row['scheme']} {row['impl']} {row['order']}: "
          f"{total:.2f} ms of {device.type} time per epoch (NCCL kernels run beside compute)", flush=True)
    for e in events[:30]:
        print(f"{getattr(e, key) / steps / 1e3:9.3f} ms {e.count // steps:5d}x  {e.key[:100]}", flush=True)


def _time_epochs(trainer, args, device) -> list[float]:
    import torch

    for _ in range(args.warmup):
        trainer.step(metrics=False)
    _sync(device)
    times = []
    for _ in range(args.epochs):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            trainer.step(metrics=False)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            trainer.step(metrics=False)
            times.append(1e3 * (time.perf_counter() - t))
    return times


def _gather(values, device):
    import torch
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _max(value, device):
    return max(r[0] for r in _gather([float(value)], device))


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _mem_reset(device) -> int:
    import torch

    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _mem_peak(device) -> int:
    import torch

    return torch.cuda.max_memory_allocated() if device.type == "cuda" else 0


def _empty_cache(device):
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _short(err) -> str:
    text = f"{type(err).__name__}: {err}"
    return "OOM" if "out of memory" in text.lower() else text.splitlines()[0][:300]


def _print_row(r):
    if r.get("ms_median") is None:
        print(f"{r['graph']:>14} {r['gpus']}x {r.get('scheme', '-'):>6} {r.get('impl', '-'):>22} "
              f"{r.get('order', '-'):>22}  error: {r.get('error')}", flush=True)
        return
    print(f"{r['graph']:>14} {r['gpus']}x {r['scheme']:>6} {r['impl']:>22} {r['order']:>22}  "
          f"{r['ms_median']:8.2f} ms  spmm {r.get('spmm_ms') or 0:7.2f} (local {r.get('spmm_local_ms') or 0:.2f})  "
          f"pack {r.get('pack_ms') or 0:5.2f}  comm {r.get('comm_ms') or 0:7.2f}  "
          f"imbal {r.get('imbalance') or 0:5.3f}  peak {r['peak_mem_bytes'] / 1e9:6.2f} GB  loss {r.get('loss', 0):.3f}",
          flush=True)


# ============================================================================ CLI
def _words(values):
    """``nargs="+"`` lists that also take comma lists (``--graphs a,b`` = ``--graphs a b``)."""
    return [w for v in values for w in str(v).split(",") if w]


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", default=["products-like", "archaea-like"],
                    help="synthetic presets of fgplugin.datasets.SUITE (space or comma separated; "
                         "default products-like archaea-like)")
    ap.add_argument("--gpus", nargs="+", default=["1", "2", "4"], help="GPU (process) counts, one job each "
                                                                        "(default 1 2 4)")
    ap.add_argument("--method", default="community", help="fgplugin.reorder method for whole-graph and block-wise")
    ap.add_argument("--orders", nargs="+", default=["original", "whole", "blockwise"],
                    help="original, whole (the --method ordering) and/or blockwise (Algorithm 2, one part per "
                         "row block)")
    ap.add_argument("--comm", nargs="+", default=["sparse", "broadcast", "sparse-bf16"],
                    help="exchange modes: sparse, broadcast, sparse-bf16, broadcast-bf16; -bf16 sends feature "
                         "blocks as bf16 (fp32 compute)")
    ap.add_argument("--epochs", type=int, default=10, help="timed epochs per configuration (median reported)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the 'small' preset instead of each graph, 5 epochs")
    ap.add_argument("--backend", default=None, help="nccl (default on GPUs) or gloo (CPU smoke run)")
    ap.add_argument("--kernels", action="store_true",
                    help="print rank 0's GPU time per kernel for each distributed configuration (torch.profiler)")
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else ./bench_results)")
    ap.add_argument("--commit", default=None,
                    help="the source version to record as the results' commit (default $FGPLUGIN_COMMIT, else null)")
    ap.add_argument("--launch-timeout", type=int, default=420, help="seconds per torch.distributed.run job")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "fgplugin_perm_cache"),
                    help="orderings computed by one job and reused by the next (outside --out: 10 MB each)")
    return ap


def main(argv=None, prog: list[str] | None = None) -> int:
    """``prog``: how the command was started, for the results' ``command`` (default
    ``python -m fgplugin.bench.scaling``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = list(prog or ["python", "-m", MODULE])
    ap = parser(" ".join(prog))
    args = ap.parse_args(argv)
    args.graphs, args.orders, args.comm = _words(args.graphs), _words(args.orders), _words(args.comm)
    try:
        args.gpus = [int(g) for g in _words(args.gpus)]
    except ValueError:
        ap.error(f"--gpus takes whole numbers, got {' '.join(args.gpus)}")
    bad = [o for o in args.orders if o not in ("original", "whole", "blockwise")]
    if bad:
        ap.error(f"unknown order(s) {', '.join(bad)}; choose from original, whole, blockwise")
    bad = [c for c in args.comm if c not in ("sparse", "broadcast", "sparse-bf16", "broadcast-bf16")]
    if bad:
        ap.error(f"unknown exchange mode(s) {', '.join(bad)}; choose from sparse, broadcast, sparse-bf16, "
                 "broadcast-bf16")
    if args.commit is None:
        from fgplugin.config import commit
        args.commit = commit()
    args.prog, args.argv = prog, argv
    if args.quick and args.epochs == 10:
        args.epochs = 5
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())

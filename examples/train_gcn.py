"""The main job: a 2-layer GCN trained full-batch with stock PyG and with fgplugin, side by side.

    python examples/train_gcn.py                 # generated community graph "small", CPU or GPU
    python examples/train_gcn.py --graph reddit-like --epochs 200      # on a GPU
    python examples/train_gcn.py --data tolokers          # an .npz graph: a path, or a name in $FGPLUGIN_DATA_DIR
    python examples/train_gcn.py --json out.json     # also write the numbers (docs/benchmarks.md schema)

Stock PyG runs `GCNConv` on the graph as given (random node ids). fgplugin reorders the graph once
with `BlockReorder` (its preprocessing time is printed), swaps the same model's layers with
`fgplugin.pyg.convert` (weights kept) and trains on the reordered graph. On a GPU a third copy
trains on it with `fgplugin.graphed_step`, each step one CUDA graph replay. Each fgplugin copy gets
its own copy of the reordered adjacency, so that each pays its own plans and probes. All start from
the same weights and train in turns, an epoch of each (the order rotating), after one untimed step
of a throwaway copy, so that all meet the same machine state; the script prints the median time per
epoch after the first ones (fgplugin plans and probes its kernels there; the totals include them),
test accuracy, the speedup, and the epoch from which fgplugin's total time, preprocessing included,
is below stock PyG's.
"""
import argparse
import copy
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

import fgplugin
from fgplugin.datasets import community_graph, load_npz
from fgplugin.pyg import BlockReorder, convert


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int, dropout: float = 0.5):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden, cached=True)
        self.conv2 = GCNConv(hidden, out_channels, cached=True)
        self.dropout = torch.nn.Dropout(dropout)  # a module (as PyG's BasicGNN): convert() swaps it too

    def forward(self, x, edge_index):
        x = self.conv1(self.dropout(x), edge_index).relu()
        return self.conv2(self.dropout(x), edge_index)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Epochs left out of the per-epoch median: fgplugin's one-time work (plans, kernel probes, the
# choice of its kept input's form) runs in a model's first epochs; the totals count it.
WARMUP_EPOCHS = 10
# graphed_step's warm-up steps (3, its default): the captured copy's first epoch trains them all,
# and the epochs they stand for, left out of the medians, train no more
CAPTURE_WARMUP = 3


def _step(model, data, graph, optimizer) -> None:
    model.train()
    optimizer.zero_grad()
    out = model(data.x, graph)
    F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    optimizer.step()


class CapturedStep:
    """A training step for :func:`train_in_turns` run as one CUDA graph replay
    (``fgplugin.graphed_step``, kept as ``graphed``): the first call trains the ``CAPTURE_WARMUP``
    warm-up steps (fgplugin makes its choices for a captured step in them) and captures the step,
    the next ``CAPTURE_WARMUP - 1`` calls, which those steps stand for, train nothing more, and each
    later call replays the step. The loss indexes the training rows, as a captured step needs (a
    boolean mask syncs the host)."""

    def __init__(self, model, data, graph, optimizer):
        self.model, self.optimizer, self.inputs = model, optimizer, (data.x, graph)
        self.rows = data.train_mask.nonzero().squeeze(1)
        self.labels = data.y[self.rows]
        self.graphed, self.trained_ahead = None, 0

    def __call__(self) -> None:
        if self.graphed is None:
            self.graphed = fgplugin.graphed_step(self.model, self.optimizer, self.loss, *self.inputs,
                                                 warmup=CAPTURE_WARMUP)
            self.trained_ahead = CAPTURE_WARMUP - 1
        elif self.trained_ahead:
            self.trained_ahead -= 1
        else:
            self.graphed()

    def loss(self, out):
        return F.cross_entropy(out[self.rows], self.labels)


class Run(NamedTuple):
    impl: str  # the name of its JSON rows
    name: str  # the name of its printed row
    order: str
    model: torch.nn.Module
    data: Data
    graph: object
    captured: bool = False  # trained by a CapturedStep


def train_in_turns(runs: list[Run], epochs: int, device: torch.device, seed: int):
    """Trains each run's model full-batch, one epoch of each in turn, the order rotating; returns
    per run (seconds of each epoch, test accuracy, its CapturedStep or ``None``).

    First an untimed step of a copy of the first run's model: the process's first use of what
    every run needs (the CUDA context, the matrix library, the loss's and Adam's kernels) costs
    hundreds of milliseconds on a GPU, which would otherwise fall on whichever run went first."""
    throwaway = copy.deepcopy(runs[0].model)
    _step(throwaway, runs[0].data, runs[0].graph, torch.optim.Adam(throwaway.parameters(), lr=0.01))
    synchronize(device)
    torch.manual_seed(seed)
    steps: list[Callable[[], None]] = []
    for run in runs:
        optimizer = torch.optim.Adam(run.model.parameters(), lr=0.01, weight_decay=5e-4)
        steps.append(CapturedStep(run.model, run.data, run.graph, optimizer) if run.captured else
                     functools.partial(_step, run.model, run.data, run.graph, optimizer))
    times = [[] for _ in runs]
    for epoch in range(epochs):
        first = epoch % len(runs)
        for i in [*range(first, len(runs)), *range(first)]:
            synchronize(device)
            start = time.perf_counter()
            steps[i]()
            synchronize(device)
            times[i].append(time.perf_counter() - start)
    results = []
    for run, step, run_times in zip(runs, steps, times):
        run.model.eval()
        with torch.no_grad():
            pred = run.model(run.data.x, run.graph).argmax(dim=1)
        test = run.data.test_mask & (run.data.y >= 0)
        results.append((run_times, float((pred[test] == run.data.y[test]).float().mean()),
                        step if run.captured else None))
    return results


def break_even_epoch(stock_times, fast_times, preprocess: float, skip: int) -> float | None:
    """The epoch from which fgplugin's total time (preprocessing and its first epochs' one-time work
    included) is below stock PyG's: counted over the measured epochs, then at the two medians;
    ``None`` where fgplugin's median epoch is not the faster."""
    behind = preprocess
    for epoch, (stock, fast) in enumerate(zip(stock_times, fast_times), 1):
        behind += fast - stock
        if behind <= 0:
            return epoch
    gain = statistics.median(stock_times[skip:]) - statistics.median(fast_times[skip:])
    return len(stock_times) + behind / gain if gain > 0 else None


def report(runs: list[Run], results, preprocess: float, epochs: int) -> list[dict]:
    """Prints each run's median epoch and test accuracy, and each fgplugin run's speedup over stock
    PyG (the first run) and break-even epoch; returns the JSON rows (docs/benchmarks.md schema)."""
    skip = min(WARMUP_EPOCHS, epochs - 1)
    medians = [statistics.median(times[skip:]) for times, *_ in results]
    print(f"{'impl':<28}{'ms/epoch':>10}{'test acc':>10}   (ms/epoch: median of epochs {skip + 1}-{epochs})")
    for run, median, (_, accuracy, _) in zip(runs, medians, results):
        print(f"{run.name:<28}{1e3 * median:>10.2f}{accuracy:>10.3f}")
    stock_times = results[0][0]
    rows = []
    for run, median, (times, accuracy, step) in zip(runs, medians, results):
        epoch_row = {"order": run.order, "impl": run.impl, "op": "epoch", "ms_median": 1e3 * median,
                     "ms_min": 1e3 * min(times[skip:]), "ms_max": 1e3 * max(times[skip:]),
                     "ms_total": 1e3 * sum(times), "warmup": skip}
        rows += [epoch_row, {"order": run.order, "impl": run.impl, "op": "accuracy", "value": accuracy,
                             "epochs": epochs}]
        if run.impl == "pyg-edge_index":
            continue
        preprocess_row = {"order": run.order, "impl": run.impl, "op": "preprocess", "ms_median": 1e3 * preprocess}
        who, paid = "fgplugin", "preprocessing"
        if step is not None:
            who, paid = "graphed_step", "preprocessing and capture"
            epoch_row["captured"] = step.graphed.graph is not None
            preprocess_row["capture_ms"] = None if step.graphed.capture_s is None else 1e3 * step.graphed.capture_s
            if not epoch_row["captured"]:
                print(f"graphed_step ran the step eagerly: {step.graphed.fallback_reason}")
        print(f"{'' if step is None else who + ': '}speedup per epoch: {medians[0] / median:.2f}x; all {epochs} "
              f"epochs incl. {paid}: {sum(stock_times) / (sum(times) + preprocess):.2f}x")
        break_even = break_even_epoch(stock_times, times, preprocess, skip)
        print(f"{who}'s total is not below stock PyG's at these medians" if break_even is None else
              f"{who}'s total ({paid} included) is below stock PyG's from epoch {math.ceil(break_even)}"
              f"{'' if break_even <= epochs else ' (at the medians)'}")
        rows += [preprocess_row, {"order": run.order, "impl": run.impl, "op": "break_even_epoch",
                                  "value": None if break_even is None else math.ceil(break_even)}]
    return rows


def write_json(path, args, data, rows) -> None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    graph = args.data or args.graph
    common = {"graph": graph, "F": data.num_features, "precision": "fp32"}
    result = {"suite": "epoch", "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "commit": commit, "command": " ".join(["python"] + sys.argv), "threads": torch.get_num_threads(),
              "rows": [{**common, **row} for row in rows]}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def load(args, device) -> Data:
    graph = load_npz(args.data, features="dense") if args.data else community_graph(args.graph, seed=args.seed,
                                                                                     device=device)
    if graph.x is None or graph.y is None:
        raise SystemExit(f"{graph.name} has no features or labels; pick a labelled graph")
    data = Data(x=graph.x, edge_index=graph.edge_index, y=graph.y, num_nodes=graph.num_nodes)
    if graph.train_mask is None:  # no fixed split in the file: a seeded random one
        order = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(args.seed))
        masks = torch.zeros(3, graph.num_nodes, dtype=torch.bool)
        bounds = [0, graph.num_nodes // 10, graph.num_nodes // 5, graph.num_nodes]
        for i in range(3):
            masks[i, order[bounds[i]:bounds[i + 1]]] = True
        data.train_mask, data.val_mask, data.test_mask = masks
    else:
        data.train_mask, data.val_mask, data.test_mask = graph.train_mask, graph.val_mask, graph.test_mask
    return data.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", default="small", help="synthetic preset (fgplugin.datasets.SUITE)")
    parser.add_argument("--data", help="an .npz graph (a path, or a name in $FGPLUGIN_DATA_DIR) instead of a synthetic graph")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--reorder", default="community", help="ordering method (fgplugin.reorder.METHODS)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this JSON file (docs/benchmarks.md schema)")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    device = torch.device(args.device)

    data = load(args, device)
    print(f"graph: {data.num_nodes} nodes, {data.num_edges} edges, {data.num_features} features, "
          f"device {device}, fgplugin kernels: {'compiled' if fgplugin.extension_status().loaded else 'reference'}")
    torch.manual_seed(args.seed)
    stock = GCN(data.num_features, args.hidden, int(data.y.max()) + 1).to(device)
    fast = convert(copy.deepcopy(stock))

    synchronize(device)
    start = time.perf_counter()
    reordered = BlockReorder(method=args.reorder)(data)
    synchronize(device)
    preprocess = time.perf_counter() - start
    print(f"preprocessing (reorder '{args.reorder}' + tile plan): {preprocess:.2f} s; {reordered.adj_t}")

    runs = [Run("pyg-edge_index", "PyG GCNConv (original order)", "original", stock, data, data.edge_index),
            Run("fgplugin", "fgplugin (reordered)", args.reorder, fast, reordered, reordered.adj_t)]
    if device.type == "cuda" and args.epochs > CAPTURE_WARMUP:
        # on a copy of the adjacency: its plans and probes are built lazily, and each copy pays its own
        runs.append(Run("fgplugin-graphed", "fgplugin, graphed_step", args.reorder, convert(copy.deepcopy(stock)),
                        reordered, reordered.adj_t.to(device, copy=True), captured=True))
    elif device.type == "cuda":
        print(f"(graphed_step's copy runs from {CAPTURE_WARMUP + 1} epochs on: its warm-up takes {CAPTURE_WARMUP})")
    results = train_in_turns(runs, args.epochs, device, args.seed)
    rows = report(runs, results, preprocess, args.epochs)
    print("(a dataset's pre_transform=BlockReorder() reorders once, saved with the data)")
    if args.json:
        write_json(args.json, args, data, rows)


if __name__ == "__main__":
    main()

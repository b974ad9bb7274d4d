"""torch's dropout against fgplugin's on CPU: forward, and forward + backward, per shape and
thread count (fgplugin/parallel_dropout.py).

    python benchmarks/dropout_cpu.py --json benchmarks/results/cpu/dropout.json
"""
import argparse
import json
import platform
import subprocess

import statistics
import time

import torch
import torch.nn.functional as F

import fgplugin

SHAPES = ((11758, 64), (20000, 64), (17425, 64), (2449029, 64))  # tolokers, main job, oklahoma97 hidden; products-like


def measure(fn, x: torch.Tensor, threads: int, backward: bool, reps: int = 20) -> float:
    """Median ms of ``fn(x)`` (and its backward pass) with ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    x = x.detach().requires_grad_(backward)
    g = torch.randn_like(x)
    times = []
    try:
        for i in range(reps + 3):
            start = time.perf_counter()
            y = fn(x)
            if backward:
                y.backward(g)
                x.grad = None
            if i >= 3:
                times.append(1e3 * (time.perf_counter() - start))
    finally:
        torch.set_num_threads(before)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    for shape in SHAPES:
        x = torch.randn(*shape)
        for threads in sorted({1, torch.get_num_threads()}):
            row = {"shape": list(shape), "threads": threads}
            for impl, fn in (("torch", F.dropout), ("fgplugin", fgplugin.dropout)):
                reps = 5 if x.numel() > 10**7 else 20
                row[f"{impl}_forward_ms"] = measure(lambda t: fn(t, 0.5, True), x, threads, False, reps)
                row[f"{impl}_forward_backward_ms"] = measure(lambda t: fn(t, 0.5, True), x, threads, True, reps)
            row["forward_speedup"] = row["torch_forward_ms"] / row["fgplugin_forward_ms"]
            row["forward_backward_speedup"] = row["torch_forward_backward_ms"] / row["fgplugin_forward_backward_ms"]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
            rows.append(row)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        res = {"suite": "dropout_cpu", "device": f"cpu ({platform.processor() or platform.machine()})",
               "torch": torch.__version__, "commit": commit,
               "command": "python benchmarks/dropout_cpu.py --json benchmarks/results/cpu/dropout.json",
               "p": 0.5, "timing": "median of 20 calls after 3 warm-up ones (5 for the 157M-element shape), "
               "time.perf_counter; forward_backward includes the backward pass into a fresh x.grad",
               "rows": rows}
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

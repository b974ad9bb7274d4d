"""Time the ways to cut a [n, 48] SpMM output to 47 columns with a bias add, and to pad its
[n, 47] gradient back to 48 (fgplugin.ops._CutColumns, products-like's output layer).

    python benchmarks/cut_columns_probe.py --rows 2449029 --width 48 --out 47
"""
import argparse
import json

import torch
import torch.nn.functional as F

import fgplugin  # noqa: F401  (loads torch.ops.fgplugin.pad_columns)


def timed(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2449029)
    ap.add_argument("--width", type=int, default=48)
    ap.add_argument("--out", type=int, default=47)
    args = ap.parse_args()
    n, w, o = args.rows, args.width, args.out
    z = torch.randn(n, w, device="cuda")
    bias = torch.randn(o, device="cuda")
    bias_pad = F.pad(bias, (0, w - o))
    g = torch.randn(n, o, device="cuda")
    ms = {
        "fwd cut+bias (z[:, :o] + bias)": timed(lambda: z[:, :o] + bias),
        "fwd cut only (contiguous)": timed(lambda: z[:, :o].contiguous()),
        "fwd padded add then cut (z + bias_pad)[:, :o].contiguous()": timed(lambda: (z + bias_pad)[:, :o].contiguous()),
        "fwd add.out into [n, o] (torch.add(z[:, :o], bias, out=...))": timed(
            lambda: torch.add(z[:, :o], bias, out=torch.empty(n, o, device="cuda"))),
        "bwd cat([g, zeros])": timed(lambda: torch.cat([g, g.new_zeros(n, w - o)], dim=1)),
        "bwd F.pad(g, (0, w - o))": timed(lambda: F.pad(g, (0, w - o))),
        "bwd empty + slice copy + zero": timed(lambda: _pad_by_copy(g, w)),
        "bwd fgplugin pad_columns kernel": timed(lambda: torch.ops.fgplugin.pad_columns(g, w)),
        "bias grad g.sum(0)": timed(lambda: g.sum(0)),
        "copy [n, w] (bandwidth reference)": timed(lambda: z.clone()),
    }
    print(json.dumps({"rows": n, "width": w, "out": o, "ms_median_of_50": {k: round(v, 4) for k, v in ms.items()}},
                     indent=1))


def _pad_by_copy(g, w):
    out = g.new_empty(g.shape[0], w)
    out[:, :g.shape[1]] = g
    out[:, g.shape[1]:] = 0
    return out


if __name__ == "__main__":
    main()

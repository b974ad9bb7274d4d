"""Why a rank's product over the rows received from other ranks costs what it does (one GPU).

    python benchmarks/remote_block.py --graphs products-like archaea-like --parts 4

Takes row block 0 of ``--parts`` of a synthetic graph in ``community`` order, as rank 0 of a 1D
run holds it, and times, at each F of ``--features``:

- ``rows``: the block's rows over all columns (its share of the single-GPU product);
- ``local``: the block's own columns (what overlaps the exchange in fgplugin.distributed);
- ``remote``: the other columns, ids kept (what runs on the all-gathered rows afterwards);
- ``local+remote``: both, back to back, and ``local||remote``: both at once on two CUDA streams.

Medians of 20 after 3 warm-up calls (gpu_kernel_check.time_fn). Each row carries nnz, entries per
row and the bytes of feature rows gathered per ms. Diagnostic: it prints JSON lines and writes no
result file.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from fgplugin import TiledAdjacency, datasets, spmm
from fgplugin.reorder import reorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import time_fn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=["products-like", "archaea-like"])
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--features", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                    help="feature dtypes (bf16: what a run with bf16 on the wire multiplies the received rows in)")
    args = ap.parse_args()
    device = torch.device("cuda")
    for name in args.graphs:
        data = datasets.community_graph(name, seed=0, device=device, num_features=0)
        n = data.num_nodes
        perm = reorder(data.edge_index, "community", num_nodes=n)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n, device=device)
        src, dst = inv[data.edge_index[0]], inv[data.edge_index[1]]
        del data
        rows = n // args.parts
        mine = dst < rows
        src, dst = src[mine], dst[mine]
        own = src < rows
        blocks = {
            "rows": TiledAdjacency.from_edge_index(torch.stack([src, dst]), size=(n, rows)),
            "local": TiledAdjacency.from_edge_index(torch.stack([src[own], dst[own]]), size=(rows, rows)),
            "remote": TiledAdjacency.from_edge_index(torch.stack([src[~own], dst[~own]]), size=(n, rows)),
        }
        gen = torch.Generator(device=device).manual_seed(0)
        rs = torch.rand(rows, device=device, generator=gen) + 0.5
        cs = torch.rand(n, device=device, generator=gen) + 0.5
        side = torch.cuda.Stream()
        for f, dtype in ((f, d) for f in args.features for d in args.dtypes):
            x = torch.randn(n, f, device=device, generator=gen).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
            calls = {
                "rows": lambda: spmm(blocks["rows"], x, rs, cs),
                "local": lambda: spmm(blocks["local"], x[:rows], rs, cs[:rows]),
                "remote": lambda: spmm(blocks["remote"], x, rs, cs),
            }
            calls["local+remote"] = lambda: (calls["local"](), calls["remote"]())

            def both_streams():
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    calls["remote"]()
                calls["local"]()
                torch.cuda.current_stream().wait_stream(side)

            calls["local||remote"] = both_streams
            for kind, fn in calls.items():
                adj = blocks.get(kind)
                ms = time_fn(lambda _, fn=fn: fn(), [None], 20)[0]
                row = {"graph": name, "F": f, "dtype": dtype, "kind": kind, "ms": round(ms, 3)}
                if adj is not None:
                    row |= {"nnz": adj.nnz, "per_row": round(adj.nnz / rows, 1), "dense_share": round(adj.dense_share, 3),
                            "gathered_GB_per_s": round(adj.nnz * f * x.element_size() / ms / 1e6, 1)}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

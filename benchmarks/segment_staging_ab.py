#!/usr/bin/env python
"""A/B: can a remainder pass that stages each row segment's most-used rows of x in shared memory
beat the current one (ba_sparse_kernel)? Second try after staging_ab.patch, without its two costs:
each row lists its staged entries first (no batch of loads waits on a gather for a shared-memory
read), and a warp covers all of F (no re-walk of the indices per feature chunk).

    python benchmarks/segment_staging_ab.py --graphs products-like:1.0 reddit-like:0.05 --out $OUT/seg.json

One ``graph:threshold`` per argument, community order. The remainder at that threshold (all of A at
1.0) is taken from fgplugin's plan; on it, unit weights, F=128, fp32 and bf16:
- ``current``: fgplugin's op with a threshold-1.0 plan of the remainder (ba_sparse_kernel);
- ``seg-K0``: the prototype kernel (segment_staging_ab.cu) without staging: its structure alone;
- ``seg``: the prototype with staging (CTA of W warps per segment of R rows, up to K staged rows of
  x that the segment uses >= 2 times, K from the shared-memory budget).
CUDA events, median of --reps; every output checked against ``current`` (relative Frobenius error).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kernel_check import community_run, time_fn  # noqa: E402

# (warps per CTA, shared memory budget in KB, segment rows)
VARIANTS = [(32, 192, 256), (32, 192, 512), (32, 192, 1024), (16, 96, 128), (16, 96, 256), (16, 96, 512),
            (8, 48, 64), (8, 48, 128), (8, 48, 256)]
BASELINES = [(32, 0, 256), (8, 0, 64)]


def segment_plan(rowptr: torch.Tensor, col: torch.Tensor, seg_rows: int, K: int, min_uses: int = 2):
    """Segments of ``seg_rows`` consecutive rows; per segment its columns used >= ``min_uses`` times,
    most used first, up to K. Returns (seg_row_ptr, code, seg_stage_ptr, stage_col, staged entries):
    code = column, or -1 - slot for a staged entry; each row's staged entries first."""
    from fgplugin._csr import rows_of_edges

    device = col.device
    n = rowptr.numel() - 1
    n_seg = -(-n // seg_rows)
    seg_row_ptr = torch.clamp(torch.arange(n_seg + 1, device=device) * seg_rows, max=n).to(torch.int32)
    if K == 0:
        return seg_row_ptr, col.to(torch.int32), torch.zeros(n_seg + 1, dtype=torch.int32, device=device), \
            torch.zeros(1, dtype=torch.int32, device=device), 0
    rows = rows_of_edges(rowptr, col.numel())
    cols = col.long()
    seg = rows // seg_rows
    uniq, inverse, counts = torch.unique(seg * n + cols, return_inverse=True, return_counts=True)
    useg = uniq // n
    top = int(counts.max())
    order = torch.argsort(useg * (top + 1) + (top - counts))  # by segment, most used first
    first = torch.searchsorted(useg[order], torch.arange(n_seg, device=device))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=device) - first[useg[order]]
    staged = (counts >= min_uses) & (rank < K)
    per_seg = torch.bincount(useg[staged], minlength=n_seg)
    seg_stage_ptr = torch.cat([per_seg.new_zeros(1), torch.cumsum(per_seg, 0)])
    stage_col = torch.zeros(max(int(per_seg.sum()), 1), dtype=torch.int32, device=device)
    stage_col[seg_stage_ptr[useg[staged]] + rank[staged]] = (uniq[staged] % n).to(torch.int32)
    e_staged = staged[inverse]
    code = torch.where(e_staged, -1 - rank[inverse], cols)
    perm = torch.argsort(rows * 2 + (~e_staged).long(), stable=True)  # staged first, else CSR order
    return seg_row_ptr, code[perm].to(torch.int32).contiguous(), seg_stage_ptr.to(torch.int32), stage_col, \
        int(e_staged.sum())


def remainder_csr(adj, threshold: float):
    """(rowptr, col), both int32, of the entries fgplugin's plan at ``threshold`` leaves to the CSR pass."""
    from fgplugin.kernel_plan import plan_for

    if threshold >= 1.0:
        return adj.rowptr.to(torch.int32), adj.col.to(torch.int32)
    p = plan_for(adj, threshold=threshold, weighted=False)
    rem_col, item_ptr, item_row = p[7], p[9].long(), p[10].long()
    counts = torch.zeros(adj.shape[0], dtype=torch.long, device=rem_col.device).index_add_(0, item_row, item_ptr.diff())
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(torch.int32), rem_col.to(torch.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", nargs="+", default=["products-like:1.0", "reddit-like:0.05"])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", nargs="+", help="W:KB:R (warps, shared-memory KB, segment rows); default: all")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from torch.utils.cpp_extension import load

    import fgplugin  # noqa: F401  (the op)
    from fgplugin.kernel_plan import build_plan

    t0 = time.time()
    ext = load("segment_staging_ab", [str(Path(__file__).with_suffix(".cu"))],
               extra_cuda_cflags=["-O3", "-arch=sm_90", "-std=c++17"], verbose=False)
    print(f"prototype built in {time.time() - t0:.0f} s", flush=True)
    op = torch.ops.fgplugin.spmm.default
    rows_out = []
    for spec in args.graphs:
        name, thr = spec.split(":")
        run = community_run(name)
        rowptr, col = remainder_csr(run.adj, float(thr))
        n = run.n
        del run
        torch.cuda.empty_cache()
        plan = build_plan(rowptr, col, (n, n), threshold=1.0)
        rowptr64 = rowptr.long()
        gen = torch.Generator(device="cuda").manual_seed(0)
        x32 = torch.randn(n, 128, device="cuda", generator=gen)
        for dname in args.dtypes:
            x = x32 if dname == "fp32" else x32.to(torch.bfloat16)
            esize = x.element_size()
            base = dict(graph=name, threshold=float(thr), dtype=dname, F=128, nodes=n, rem_nnz=col.numel())
            ref = op(rowptr, col, None, x, None, None, None, None, None, None, plan, []).float()
            med, lo, hi, _ = time_fn(lambda x: op(rowptr, col, None, x, None, None, None, None, None, None, plan, []),
                                     [x], args.reps)
            rows_out.append({**base, "variant": "current", "ms_median": round(med, 4), "ms_min": round(lo, 4)})
            print(rows_out[-1], flush=True)
            cur = med
            chosen = [tuple(map(int, v.split(":"))) for v in args.variants] if args.variants else BASELINES + VARIANTS
            for warps, kb, seg_rows in chosen:
                K = kb * 1024 // (128 * esize)
                t1 = time.time()
                sp = segment_plan(rowptr.long(), col, seg_rows, K)
                torch.cuda.synchronize()
                build_s = time.time() - t1
                fn = lambda x, sp=sp, K=K, warps=warps: ext.segment_spmm(sp[0], rowptr64, *sp[1:4], x, K, warps)  # noqa: E731
                got = fn(x).float()
                err = float((got - ref).norm() / ref.norm())
                med, lo, hi, _ = time_fn(fn, [x], args.reps)
                rows_out.append({**base, "variant": "seg-K0" if K == 0 else "seg", "warps": warps, "smem_kb": kb,
                                 "K": K, "seg_rows": seg_rows, "staged_entries": sp[4],
                                 "staged_share": round(sp[4] / max(col.numel(), 1), 4),
                                 "staged_rows": int(sp[2][-1]), "ms_median": round(med, 4), "ms_min": round(lo, 4),
                                 "vs_current": round(cur / med, 3), "rel_err_vs_current": err,
                                 "plan_build_s": round(build_s, 3)})
                print(rows_out[-1], flush=True)
                del sp, got
            del x, ref
        del rowptr, rowptr64, col, plan, x32
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"suite": "segment_staging_ab", "device": torch.cuda.get_device_name(),
                                          "torch": torch.__version__, "command": " ".join(sys.argv),
                                          "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()

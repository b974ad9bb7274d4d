"""Malformed inputs for the C++/CUDA entry points (``torch.ops.fgplugin.*``), run by test_fuzz.py in a
subprocess so that a crash shows as the process dying, not as the test run dying.

    python tests/fuzz_ops.py SEED CASES DEVICE

Each case takes valid arguments of one op (a random graph and features) and damages one or two
of them: row pointers that decrease, start or end wrong, column ids out of range, plan buffers
and layouts of the wrong size, dtype or contents, wrong shapes, dtypes and devices. Every call
must either raise a Python exception or return a result of the right shape; for calls on valid
arguments the result must equal the float64 reference. Prints one summary line and exits 0.
"""
from __future__ import annotations

import random
import sys

import torch

import fgplugin
from fgplugin import TiledAdjacency
from fgplugin.ops import op_args
from fgplugin.testing import dense_spmm, random_graph_case, rel_error

INTS = (torch.int32, torch.int64)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _graph(rng: random.Random, device: str):
    case = random_graph_case(rng.randrange(10**6), n_src=rng.choice([1, 5, 40, 300]), avg_degree=rng.choice([0, 1, 6]))
    adj = TiledAdjacency.from_edge_index(case.edge_index, case.num_nodes, threshold=rng.choice([0.0, 0.05, 1.0]))
    return case, adj.to(device)


def _damage_index(rng: random.Random, t: torch.Tensor, bound: int) -> torch.Tensor:
    """``t`` with one entry out of range, negative, or the whole tensor of another dtype / length."""
    t = t.clone()
    kind = rng.choice(["big", "negative", "dtype", "shorter", "longer", "huge"])
    if t.numel() and kind in ("big", "negative", "huge"):
        i = rng.randrange(t.numel())
        t[i] = {"big": bound + rng.randrange(1, 10**3), "negative": -rng.randrange(1, 10**3),
                "huge": torch.iinfo(t.dtype).max}[kind]
    elif kind == "dtype":
        t = t.to(rng.choice([torch.int16, torch.float32, torch.int64 if t.dtype == torch.int32 else torch.int32]))
    elif kind == "shorter" and t.numel():
        t = t[:-1]
    else:
        t = torch.cat([t, t[-1:] + 1]) if t.numel() else torch.ones(1, dtype=t.dtype, device=t.device)
    return t


def _spmm_case(rng: random.Random, device: str):
    case, adj = _graph(rng, device)
    dtype = rng.choice([torch.float32, torch.float64] + ([torch.bfloat16] if device == "cuda" else []))
    x = torch.randn(adj.shape[1], rng.choice([1, 3, 8, 33]), device=device).to(dtype)
    args, features = op_args(adj, x, *adj.norm("gcn"), with_transpose=rng.random() < 0.5, name="fuzz")
    args = list(args)
    damaged = rng.random() < 0.85
    if damaged:
        target = rng.choice(["rowptr", "col", "values", "x", "scale", "diag", "plan", "layout", "device"])
        if target == "rowptr":
            args[0] = _damage_index(rng, args[0], adj.nnz + 1)
            if rng.random() < 0.5 and args[0].numel() > 2:  # a decreasing step
                args[0][1], args[0][2] = args[0][2].clone() + 5, args[0][1].clone()
        elif target == "col":
            args[1] = _damage_index(rng, args[1], adj.shape[1])
        elif target == "values":
            args[2] = torch.randn(max(adj.nnz + rng.choice([-1, 0, 1]), 0), device=device).to(rng.choice(FLOATS))
        elif target == "x":
            args[3] = rng.choice([x[:-1], x.t(), x.reshape(-1), x.to(torch.int32), x[:, :0], torch.empty(0, 3)])
        elif target in ("scale", "diag"):
            slot = {"scale": rng.choice([4, 5]), "diag": 6}[target]
            args[slot] = torch.randn(rng.randrange(0, adj.shape[0] + 3), device=device).to(rng.choice(FLOATS))
        elif target == "plan":
            n = rng.randrange(0, 4096)
            args[7] = rng.choice([torch.randint(0, 255, (n,), dtype=torch.uint8, device=device),
                                  torch.zeros(n, dtype=torch.int32, device=device)])
            if not args[8]:
                args[8] = list(range(52))
        elif target == "layout":
            layout = list(args[8]) or [3, 0, 256, 16] + [0, 0, 3] * 16
            i = rng.randrange(len(layout))
            layout[i] = rng.choice([-16, 0, 16, 1 << 40, layout[i] + 16, 4])
            args[8] = layout[: rng.choice([len(layout), len(layout) - 3])]
            if args[7] is None:
                args[7] = torch.zeros(64, dtype=torch.uint8, device=device)
        else:
            args[0] = args[0].cpu() if device == "cuda" else args[0]
    return ("spmm", torch.ops.fgplugin.spmm.default, args, (case, x, features, adj), damaged)


def _sddmm_case(rng: random.Random, device: str):
    case, adj = _graph(rng, device)
    f = rng.choice([1, 4, 9])
    a, b = torch.randn(adj.shape[0], f, device=device), torch.randn(adj.shape[1], f, device=device)
    args = [adj.rowptr, adj.col, a, b]
    damaged = rng.random() < 0.85
    if damaged:
        i = rng.randrange(4)
        if i < 2:
            args[i] = _damage_index(rng, args[i], adj.nnz + 1 if i == 0 else adj.shape[1])
        else:
            args[i] = rng.choice([args[i][:-1], args[i].t(), args[i].double(), args[i].reshape(-1)])
    return ("sddmm", torch.ops.fgplugin.sddmm.default, args, None, damaged)


def _small_case(rng: random.Random, device: str):
    x = torch.randn(rng.randrange(0, 50), rng.randrange(0, 9), device=device)
    x[::3] = 0
    kind = rng.choice(["nonzero_rows", "pad_columns", "dropout"])
    bad = rng.choice([x, x.reshape(-1), x.to(torch.int64), x.unsqueeze(0)])
    if kind == "nonzero_rows":
        return (kind, torch.ops.fgplugin.nonzero_rows.default, [bad], None, True)
    if kind == "pad_columns":
        width = rng.choice([x.shape[1] + 3, x.shape[1] - 1, -5, 0, 1 << 20])
        return (kind, torch.ops.fgplugin.pad_columns.default, [bad, width], None, True)
    return (kind, torch.ops.fgplugin.dropout.default, [bad, rng.choice([-0.5, 0.0, 0.3, 1.0, 2.0]), rng.randrange(99)],
            None, True)


def main(seed: int, cases: int, device: str) -> None:
    rng = random.Random(seed)
    raised = ran = checked = 0
    for k in range(cases):
        make = rng.choice([_spmm_case, _spmm_case, _sddmm_case, _small_case])
        name, op, args, valid, damaged = make(rng, device)
        try:
            out = op(*args)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            raised += 1
            assert str(err), f"case {k} ({name}): an exception without a message"
            continue
        ran += 1
        if device == "cuda":
            torch.cuda.synchronize()
        if name == "spmm" and not damaged:
            case, x, features, adj = valid
            want = dense_spmm(case.dense(), x.double().cpu(), *(None if t is None else t.cpu() for t in adj.norm("gcn")))
            tol = 2e-2 if x.dtype == torch.bfloat16 else 1e-5
            assert rel_error(out[:, :features].float().cpu(), want) <= tol, f"case {k}: wrong result"
            checked += 1
    print(f"fuzz {device} seed={seed}: {cases} cases, {raised} raised, {ran} ran, {checked} checked against float64")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

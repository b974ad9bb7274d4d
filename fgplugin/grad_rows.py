"""The backward product skips the zero rows of its output gradient.

In full-batch node classification the loss reads only the training nodes,
``loss(out[train_mask], y[train_mask])``, so the gradient that reaches the last layer's
aggregation ``out = A h`` is zero on every other row. Its backward product
``grad_h = A^T G`` then needs only the columns of ``A^T`` that belong to non-zero rows of ``G``:
on ogbn-products 8% of the nodes train, in the synthetic suite 10%. This module finds those rows
and keeps, per graph structure, ``A^T`` restricted to them (with its kernel plan), so that the
backward product reads only the non-zeros that can contribute. The terms it leaves out are
products with exact zeros, so the result is the same up to float rounding.

When the autograd backward of :func:`fgplugin.spmm` uses it (all must hold, else it runs the full
product):

- eager mode, and no double backward (``create_graph=True`` needs the product's gradient with
  respect to every row of ``G``, zero or not);
- the full product is large enough to be worth it: non-zeros x columns at least ``MIN_WORK``
  for the device (on small graphs the sync and the extra pass cost as much as they save);
- at most ``MAX_LIVE_FRACTION`` of ``G``'s rows are non-zero, first on a sample of
  ``SAMPLE_ROWS`` rows (so a dense gradient costs two tiny kernels and one host sync), then on
  all of them; a gradient as wide as the last one that used the structure's kept rows skips
  the sample and is compared with those rows at once (one host sync in all);
- the structure has not seen ``MAX_MISSES`` new sets of non-zero rows in a row.

The restricted structure is built when a set of rows is seen for the first time (a pass over
``A^T``'s non-zeros and a kernel plan: 5-8 ms for the 75-200M non-zeros of the synthetic suite on
an H100, about two full products) and reused while the next gradients
have the same non-zero rows; its memory is that of ``A^T``'s CSR times the live fraction. It is
kept for as long as the structure's transpose lives. Switch it off with
``FGPLUGIN_SKIP_ZERO_ROWS=0`` or :func:`set_row_skipping`.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .kernel_plan import build_plan

# The skipping path measured 2.2x faster than the full product at 25% live rows (2-core CPU,
# tolokers' graph, F=64: benchmarks/results/cpu/grad_rows_ab.json) and 2.2x at 30% (H100,
# reddit-like: benchmarks/results/h100/grad_rows_ab.json); a first, unrecorded CPU trial at 50%
# was slower than the full product.
MAX_LIVE_FRACTION = 0.3
SAMPLE_ROWS = 1024
MAX_MISSES = 3
# Non-zeros x columns of the full product below which it costs about as much as finding the live
# rows (a host sync and a pass over G): H100, fp32, about 0.15 ms at 2**28 (products-like's and
# reddit-like's products are 20x that, the real graphs' at most 0.7x); 2-core CPU, about 0.15 ms
# at 2**22.
MIN_WORK = {"cuda": 1 << 28, "cpu": 1 << 22}
_enabled = os.environ.get("FGPLUGIN_SKIP_ZERO_ROWS", "1") != "0"
# t_col of a transposed CSR -> its _Restriction; entries go with the structure they restrict.
_restrictions: WeakIdKeyDictionary = WeakIdKeyDictionary()
_total_build_s = 0.0


def set_row_skipping(enabled: bool) -> bool:
    """Turns the skipping of zero output-gradient rows on or off; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def row_skipping_enabled() -> bool:
    return _enabled


@dataclass
class _Restriction:
    """``A^T`` restricted to the columns ``live`` (the non-zero rows of the last gradients)."""

    live: torch.Tensor | None = None
    rowptr: torch.Tensor | None = None
    col: torch.Tensor | None = None
    keep: torch.Tensor | None = None  # positions in the full CSR of the kept non-zeros
    plans: dict = field(default_factory=dict)  # (weighted, block-adaptive) -> kernel plan
    misses: int = 0
    builds: int = 0
    hits: int = 0
    build_s: float = 0.0  # time spent building restrictions and their plans
    width: int = -1  # columns of the gradient that last used the restriction


def stats(t_col: torch.Tensor) -> dict:
    """How the structure with transposed column array ``t_col`` fared: builds, hits, misses
    (for tests and benchmarks)."""
    entry = _restrictions.get(t_col)
    if entry is None:
        return {"builds": 0, "hits": 0, "misses": 0, "live_rows": None, "build_s": 0.0}
    live_rows = None if entry.live is None else int(entry.live.sum())
    return {"builds": entry.builds, "hits": entry.hits, "misses": entry.misses, "live_rows": live_rows,
            "build_s": entry.build_s}


def total_build_s() -> float:
    """Seconds spent building restrictions and their plans since import, over all structures
    (a one-time cost per structure that benchmarks count as preprocessing: take differences)."""
    return _total_build_s


def restricted_transpose(t_rowptr, t_col, t_values, grad: torch.Tensor, full_plan: list):
    """``(rowptr, col, values, plan)`` of ``A^T`` restricted to the non-zero rows of ``grad``,
    or ``None`` when the full product should run (see the module doc). ``full_plan`` is the
    kernel plan of the full ``A^T`` (empty: plain kernels, so the restriction gets none either).
    The restriction's plan puts every entry in the remainder pass: leaving out most columns
    leaves few tiles dense."""
    if not _enabled or torch.is_grad_enabled() or torch.compiler.is_compiling() or grad.dim() != 2:
        return None
    n = grad.shape[0]
    if n == 0 or t_col.numel() * grad.shape[1] < MIN_WORK.get(grad.device.type, MIN_WORK["cuda"]):
        return None
    entry = _restrictions.get(t_col)
    if entry is None:
        entry = _restrictions[t_col] = _Restriction()
    if entry.misses >= MAX_MISSES:
        return None
    # The sample costs a host sync; a gradient as wide as the one that used the kept rows last
    # is taken to come from the same layer, and goes straight to the comparison.
    if entry.live is None or grad.shape[1] != entry.width:
        step = max(n // SAMPLE_ROWS, 1)
        if float(_nonzero_rows(grad[::step]).float().mean()) > MAX_LIVE_FRACTION:  # one host sync
            return None
    live = _nonzero_rows(grad)
    if entry.live is not None and torch.equal(live, entry.live):
        entry.hits += 1
        entry.misses = 0
    elif int(live.sum()) > MAX_LIVE_FRACTION * n:
        return None
    else:
        with _timed(entry, grad.device):
            _rebuild(entry, t_rowptr, t_col, live)
    entry.width = grad.shape[1]
    weighted = t_values is not None
    key = (weighted, bool(full_plan))  # the full product's kernel (a float64 call runs the plain one)
    plan = entry.plans.get(key)
    if plan is None:
        with _timed(entry, grad.device):
            shape = (t_rowptr.numel() - 1, n)
            plan = build_plan(entry.rowptr, entry.col, shape, threshold=1.0, weighted=weighted) if full_plan else []
            entry.plans[key] = plan
    values = None if t_values is None else t_values.index_select(0, entry.keep)
    return entry.rowptr, entry.col, values, plan


@contextmanager
def _timed(entry: _Restriction, device: torch.device):
    global _total_build_s
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _device: None)
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    seconds = time.perf_counter() - start
    entry.build_s += seconds
    _total_build_s += seconds


def _nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """Rows of ``grad`` with any entry that is not zero (NaN counts as non-zero).

    On CUDA the extension's ``nonzero_rows`` kernel: torch's ``any(dim=1)`` read a [2.45M, 48]
    fp32 gradient at 0.7 TB/s on the H100 (0.7 ms). On the CPU ``abs().amax() != 0``: ``any`` was
    about 10x slower there (torch 2.13, 2 cores)."""
    if grad.device.type == "cuda" and hasattr(torch.ops.fgplugin, "nonzero_rows"):
        return torch.ops.fgplugin.nonzero_rows.default(grad)
    return grad.abs().amax(dim=1) != 0  # NaN != 0


@torch.no_grad()
def _rebuild(entry: _Restriction, t_rowptr, t_col, live) -> None:
    kept = live.index_select(0, t_col)
    ends = torch.cumsum(kept, 0, dtype=t_rowptr.dtype)  # kept non-zeros up to each position
    starts = torch.cat([ends.new_zeros(1), ends])
    entry.misses = entry.misses + 1 if entry.live is not None else 0
    entry.live = live
    entry.rowptr = starts.index_select(0, t_rowptr)
    entry.keep = kept.nonzero().squeeze(1).to(t_col.dtype)
    entry.col = t_col.index_select(0, entry.keep)
    entry.plans = {}
    entry.builds += 1

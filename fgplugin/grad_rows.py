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

Once a width has settled (its gradient had the same kept rows on two host checks in a row), its eager
products stop looking: each host sync waits for the whole step so far, and while it waits none of
the backward pass's remaining work is queued. They use the restriction as a captured product does
(below), and a second device flag, whether the rows differ at all, is read on a later call without
waiting; where it came back set, that call looks on the host again (:func:`settled_restriction`).

A backward product captured into a CUDA graph (``fgplugin.graphed_step``) cannot look at ``G``'s
rows on the host: it keeps to the restriction its warm-up used at ``G``'s width, and a flag
computed on the device runs the full product too where ``G`` has rows outside it (the
``spmm_if`` op; :func:`captured_restriction`).

A restriction is built when a set of rows is seen for the first time (a pass over ``A^T``'s
non-zeros and a kernel plan: 5-8 ms for the 75-200M non-zeros of the synthetic suite on an H100,
about two full products) and reused whenever a later gradient has the same non-zero rows. Each
structure keeps up to ``MAX_KEPT`` of them, the most recently used: layers that share a graph and
each see a row-sparse gradient (the last two of a 3-layer GCN) keep one each; one that none of the
structure's last ``STALE_USES`` restricted products used is dropped. A restriction's
memory is that of ``A^T``'s CSR times its live fraction; they are kept for as long as the
structure's transpose lives. Switch it off with
``FGPLUGIN_SKIP_ZERO_ROWS=0`` or :func:`fgplugin.set_row_skipping`.

The distributed backward uses the same restrictions for its block products
(:func:`fgplugin.ops.spmm_skipping_zero_rows`) and the same rules, agreed between the ranks, to send
only the non-zero rows (:mod:`fgplugin.distributed.live_rows`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .capture_holds import capturing, collection, hold
from .config import settings
from .kernel_plan import KernelPlan, build_kernel_plan

# The skipping path measured 2.2x faster than the full product at 25% live rows (2-core CPU,
# tolokers' graph, F=64: benchmarks/results/cpu/grad_rows_ab.json) and 2.2x at 30% (H100,
# reddit-like: benchmarks/results/h100/grad_rows_ab.json); a first, unrecorded CPU trial at 50%
# was slower than the full product.
MAX_LIVE_FRACTION = 0.3
SAMPLE_ROWS = 1024
MAX_MISSES = 3
# Restrictions kept per structure, most recently used first: one per layer whose backward product
# sees a row-sparse gradient (a 3-layer GCN has two: the loss rows and their neighbours), so that
# layers sharing a graph do not evict each other's every step.
MAX_KEPT = 3
# A kept restriction that none of the structure's last STALE_USES restricted products used is
# dropped: the first layer's gradient of the first step (before the input cache holds its
# aggregation) is never seen again, and its restriction would otherwise hold memory for good.
STALE_USES = 4
# Non-zeros x columns of the full product below which it costs about as much as finding the live
# rows (a host sync and a pass over G): H100, fp32, about 0.15 ms at 2**28 (products-like's and
# reddit-like's products are 20x that, the real graphs' at most 0.7x); 2-core CPU, about 0.15 ms
# at 2**22.
MIN_WORK = {"cuda": 1 << 28, "cpu": 1 << 22}
# Calls of a structure for which a gradient width seen dense is taken to belong to a layer whose
# gradient is dense: about four training steps of a 2-layer model whose other layer restricts.
DENSE_CALLS = 8
# Host-checked calls in a row at one width that must find the same rows (the build counts as one)
# before later calls of that width use them unchecked (settled_restriction).
SETTLE_CALLS = 2
# col of a restricted CSR (A^T's in the backward pass) -> its KeptSets of _Kept; entries go with the
# structure they restrict.
_restrictions: WeakIdKeyDictionary = WeakIdKeyDictionary()
_total_build_s = 0.0


@dataclass(eq=False)  # identity: list.remove must not compare tensors
class _Kept:
    """A CSR restricted to the columns ``live`` (the non-zero rows of some gradients)."""

    live: torch.Tensor
    rowptr: torch.Tensor
    keep: torch.Tensor  # positions in the full CSR of the kept non-zeros
    col: torch.Tensor
    width: int = -1  # columns of the gradient that last used it
    plans: dict = field(default_factory=dict)  # (weighted, block-adaptive) -> kernel plan
    last_use: int = 0  # the structure's use count when it was last used
    # Host-checked calls in a row at ``width`` that found ``live`` (the build counts as one); from
    # SETTLE_CALLS on, eager products of that width use it unchecked (settled_restriction).
    streak: int = 0
    changed: _LateFlag | None = None  # whether an unchecked gradient's rows differed from ``live``


class _LateFlag:
    """A one-element bool computed on the device, read on the host once it has arrived, without
    waiting for it: on CUDA a copy to pinned memory and an event after it; elsewhere the value."""

    __slots__ = ("_host", "_event")

    def __init__(self, flag: torch.Tensor):
        if flag.is_cuda:
            self._host = torch.empty(1, dtype=torch.bool, pin_memory=True)
            self._host.copy_(flag.reshape(1), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(flag.device))  # the copy's stream
        else:
            self._host, self._event = flag.reshape(1), None

    def read(self) -> bool | None:
        """The flag, or ``None`` while the device has not got to it."""
        if self._event is not None and not self._event.query():
            return None
        return bool(self._host[0])


@dataclass
class KeptSets:
    """What was built for sets of live rows (items with a ``last_use``), most recently used first,
    and how it fared; the rules the restrictions here and the distributed exchange
    (:mod:`fgplugin.distributed.live_rows`) both follow: at most ``max_kept`` (default
    :data:`MAX_KEPT`, read at each use), one that none of the last :data:`STALE_USES` uses touched
    is dropped, and ``misses`` counts new sets in a row."""

    max_kept: int | None = None
    kept: list = field(default_factory=list)
    uses: int = 0
    misses: int = 0
    builds: int = 0
    hits: int = 0  # uses whose rows were compared on the host and matched
    unchecked: int = 0  # uses of a settled restriction, rows not compared on the host
    build_s: float = 0.0  # time spent building (timed_build)
    calls: int = 0  # products that asked for a restriction (restrict_to_live_rows, settled_restriction)
    # gradient width -> ``calls`` when a gradient of that width was last seen with too many live
    # rows: for DENSE_CALLS calls after that, a captured or unchecked product of that width runs in
    # full (a layer of that width whose gradient is dense shares the graph)
    dense_at: dict = field(default_factory=dict)

    def dense_lately(self, width: int) -> bool:
        return self.calls - self.dense_at.get(width, -DENSE_CALLS) < DENSE_CALLS

    def record(self, item, built: bool, checked: bool = True) -> None:
        """Counts a use of ``item`` (a kept one, or one just built) and moves it to the front;
        ``checked=False``: a kept one used without comparing the rows (not a hit: they may
        differ)."""
        if built:
            self.misses = self.misses + 1 if self.kept else 0
            self.builds += 1
            del self.kept[(MAX_KEPT if self.max_kept is None else self.max_kept) - 1:]  # least recently used go
        else:
            if checked:
                self.hits += 1
                self.misses = 0
            else:
                self.unchecked += 1
            self.kept.remove(item)
        self.kept.insert(0, item)
        self.uses += 1
        item.last_use = self.uses
        self.kept = [k for k in self.kept if self.uses - k.last_use < STALE_USES]

    def counts(self) -> dict:
        return {"builds": self.builds, "hits": self.hits, "unchecked": self.unchecked, "misses": self.misses,
                "kept": len(self.kept), "build_s": self.build_s}


def stats(col: torch.Tensor) -> dict:
    """How the structure with column array ``col`` (``A^T``'s in the backward pass of
    :func:`fgplugin.spmm`) fared: builds, hits, unchecked uses, misses, restrictions kept, and the
    live rows of the one used last (for tests and benchmarks)."""
    entry = _restrictions.get(col, KeptSets())
    return {**entry.counts(), "live_rows": int(entry.kept[0].live.sum()) if entry.kept else None}


def total_build_s() -> float:
    """Seconds spent building restrictions and their plans since import, over all structures
    (a one-time cost per structure that benchmarks count as preprocessing: take differences)."""
    return _total_build_s


def may_apply(nnz: int, width: int, device_type: str) -> bool:
    """Whether the skipping may apply to a backward product of ``nnz`` non-zeros and ``width``
    columns on ``device_type``: switched on, and at least ``MIN_WORK`` multiply-adds (the rest is
    decided per gradient)."""
    return settings.skip_zero_rows and nnz * width >= MIN_WORK.get(device_type, MIN_WORK["cuda"])


def restrict_to_live_rows(rowptr, col, values, x: torch.Tensor, block_adaptive: bool):
    """``(rowptr, col, values, plan)`` of the CSR ``(rowptr, col, values)`` restricted to the
    columns whose row of ``x`` is not zero, for the product with ``x``; or ``None`` when the full
    product should run (see the module doc). In the backward pass of :func:`fgplugin.spmm` the
    CSR is ``A^T`` and ``x`` the output gradient. ``block_adaptive``: whether the full product
    runs the block-adaptive kernel (else the restriction runs the plain one too). The
    restriction's plan puts every entry in the remainder pass: leaving out most columns leaves few
    tiles dense."""
    if not _may_restrict(col, x) or capturing(x):  # finding the live rows syncs: see captured_restriction
        return None
    n, width = x.shape
    entry = _entry(col)
    entry.calls += 1
    if entry.misses >= MAX_MISSES:
        return None
    # The sample costs a host sync; a gradient as wide as one that used a kept restriction is
    # taken to come from the same layer, and goes straight to the comparison.
    if not any(kept.width == width for kept in entry.kept):
        step = max(n // SAMPLE_ROWS, 1)
        if float(nonzero_rows(x[::step]).float().mean()) > MAX_LIVE_FRACTION:  # one host sync
            entry.dense_at[width] = entry.calls
            return None
    live = nonzero_rows(x)
    match = _match(entry, live, width)
    if match is None and int(live.sum()) > MAX_LIVE_FRACTION * n:
        entry.dense_at[width] = entry.calls
        return None
    return _restricted(entry, rowptr, col, values, live, block_adaptive, match, width, x)


def _may_restrict(col: torch.Tensor, x: torch.Tensor) -> bool:
    """The checks of the product's kind and size that come before any look at ``x``'s rows."""
    if not settings.skip_zero_rows or torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dim() != 2:
        return False
    n, width = x.shape
    return n > 0 and width > 0 and may_apply(col.numel(), width, x.device.type)


def captured_restriction(rowptr, col, values, x: torch.Tensor, block_adaptive: bool):
    """For a backward product captured into a CUDA graph by :func:`fgplugin.graphed_step`, where
    nothing may sync: the restriction the eager steps before the capture (its warm-up) used for
    gradients as wide as ``x``, as ``(rowptr, col, values, plan, outside)``, or ``None`` (the
    full product runs). ``outside`` is a one-element bool tensor on the device, set when a
    replay's ``x`` has a non-zero row the restriction leaves out (the loss's rows changed in place
    since the capture): the caller then runs the full product too (the ``spmm_if`` op), so a
    replay is never wrong, only slower. What the graph reads is held with its capture's
    collection (fgplugin.capture_holds), so a capture that collects nothing gets no restriction.

    Only an unambiguous restriction is handed out: none where the eager path gave up on the
    structure (``MAX_MISSES``), where the kept restrictions hold two of this width (two layers of
    one width sharing the graph: which is whose is not known here), or where a gradient of this
    width was seen dense within the last ``DENSE_CALLS`` calls (a layer of that width whose
    gradient is dense shares the graph)."""
    if not (_may_restrict(col, x) and collection() is not None):
        return None
    plan_key = (values is not None, block_adaptive)
    kept = _unambiguous(_restrictions.get(col), x.shape[1], plan_key)
    if kept is None:
        return None
    kept_values = None if values is None else values.index_select(0, kept.keep)
    outside = torch.logical_and(nonzero_rows(x), kept.live.logical_not()).any()
    hold(kept)
    return kept.rowptr, kept.col, kept_values, hold(kept.plans[plan_key]), outside


def settled_restriction(rowptr, col, values, x: torch.Tensor, block_adaptive: bool):
    """For an eager backward product, the restriction that gradients as wide as ``x`` have settled
    on, used without looking at ``x``'s rows on the host (which waits for the device to finish
    the step so far, while none of the backward pass's remaining work is queued), as
    ``(rowptr, col, values, plan, outside)`` like :func:`captured_restriction`, whose rules it
    shares; or ``None``: then :func:`restrict_to_live_rows` decides, with its host sync.

    A restriction settles when ``SETTLE_CALLS`` host-checked calls in a row at its width found its
    rows (its build counts as one). A settled one is handed out with the device flag ``outside``
    (the caller runs the full product where it is set), and with a second flag, whether the
    gradient's rows differ from it at all, read on a later call once the device has computed it
    (while one is on its way, calls get none of their own: a lasting change is seen by the next
    flag). Where it has come back set, the restriction is unsettled and that call goes to
    :func:`restrict_to_live_rows`, whose host checks rebuild for new rows or settle again. So a
    gradient whose rows changed costs the full product on top of the restricted one until the flag
    is read, and is never wrong; two sets of rows taking turns at one width end with a restriction
    each, which no unchecked product is handed (as for a capture)."""
    if not _may_restrict(col, x):  # never called in a capture: the caller takes captured_restriction there
        return None
    entry = _restrictions.get(col)
    plan_key = (values is not None, block_adaptive)
    kept = _unambiguous(entry, x.shape[1], plan_key)
    if kept is None or kept.streak < SETTLE_CALLS:
        return None
    changed = None if kept.changed is None else kept.changed.read()
    if changed:
        kept.streak, kept.changed = 0, None
        return None
    entry.calls += 1
    entry.record(kept, built=False, checked=False)
    live = nonzero_rows(x)
    if changed is not None or kept.changed is None:  # else the last flag is still on its way: it is read first
        kept.changed = _LateFlag(torch.ne(live, kept.live).any())
    kept_values = None if values is None else values.index_select(0, kept.keep)
    outside = torch.logical_and(live, kept.live.logical_not()).any()
    return kept.rowptr, kept.col, kept_values, kept.plans[plan_key], outside


def _unambiguous(entry: KeptSets | None, width: int, plan_key: tuple) -> _Kept | None:
    """The one restriction of ``entry`` (a structure's) kept for gradients ``width`` columns wide,
    with its plan for ``plan_key`` built; ``None`` where there is none, or two, or where the
    structure's restrictions are not to be trusted without a look at the gradient's rows (see
    :func:`captured_restriction`)."""
    if entry is None or entry.misses >= MAX_MISSES or entry.dense_lately(width):
        return None
    candidates = [k for k in entry.kept if k.width == width]
    if len(candidates) != 1 or plan_key not in candidates[0].plans:  # a plan is built with host syncs
        return None
    return candidates[0]


def restricted(rowptr, col, values, live: torch.Tensor, block_adaptive: bool):
    """``(rowptr, col, values, plan)`` of the CSR restricted to the columns where ``live`` (a
    bool mask, one entry per column) is true, kept per structure (keyed by ``col``) and reused
    while the mask stays the same; the caller decided that restricting pays."""
    entry = _entry(col)
    return _restricted(entry, rowptr, col, values, live, block_adaptive, _match(entry, live), -1, None)


def _entry(col: torch.Tensor) -> KeptSets:
    entry = _restrictions.get(col)
    if entry is None:
        entry = _restrictions[col] = KeptSets()
    return entry


def _match(entry: KeptSets, live: torch.Tensor, width: int = -1) -> _Kept | None:
    """The kept restriction for the mask ``live``, or ``None``; those last used with a gradient
    of ``width`` columns are compared first (one host sync per comparison)."""
    for kept in sorted(entry.kept, key=lambda k: k.width != width):
        if torch.equal(live, kept.live):
            return kept
    return None


def _restricted(entry: KeptSets, rowptr, col, values, live, block_adaptive: bool, kept: _Kept | None, width: int,
                x: torch.Tensor):
    built = kept is None
    if built:
        with timed_build(entry, live.device):
            kept = _Kept(live, *restrict_columns(rowptr, col, live))
    entry.record(kept, built)
    if width >= 0:
        kept.streak = kept.streak + 1 if not built and kept.width == width else 1
        kept.width = width
        for other in entry.kept:  # "in a row" at this width
            if other is not kept and other.width == width:
                other.streak = 0
    if x is not None and x.is_cuda:
        _check_full_product(rowptr, col, values, x)
    # the full product's kind of kernel (a float64 call runs the plain one)
    plan = restriction_plan(kept.plans, kept.rowptr, kept.col, (rowptr.numel() - 1, live.numel()),
                            weighted=values is not None, block_adaptive=block_adaptive, timed_by=entry)
    kept_values = None if values is None else values.index_select(0, kept.keep)
    return kept.rowptr, kept.col, kept_values, plan


def _check_full_product(rowptr, col, values, x: torch.Tensor) -> None:
    """Calls the ``spmm_if`` op of a captured product's fallback (:func:`captured_restriction`)
    on the full CSR and none of ``x``'s columns (no kernel runs): the op checks the CSR's contents
    with a host sync when it has not seen them lately, which a capture must not meet. A lookup
    after the first call."""
    none = x[:, :0]
    torch.ops.fgplugin.spmm_if.default(torch.empty((), dtype=torch.bool, device=x.device), rowptr, col, values, none,
                                       None, None, None, none.new_empty((rowptr.numel() - 1, 0)))


def restriction_plan(plans: dict, rowptr, col, shape, *, weighted: bool, block_adaptive: bool,
                     timed_by=None) -> KernelPlan | None:
    """The kernel plan of a restricted CSR, built once and kept in ``plans``: every entry in the
    remainder pass (leaving out most columns leaves few tiles dense), or ``None`` for the plain
    kernels. A build is timed into ``timed_by`` (see :func:`timed_build`) when given."""
    key = (weighted, block_adaptive)
    if key not in plans:
        with timed_build(timed_by, col.device) if timed_by is not None else nullcontext():
            plans[key] = build_kernel_plan(rowptr, col, shape, threshold=1.0, weighted=weighted) \
                if block_adaptive else None
    return plans[key]


@contextmanager
def timed_build(owner, device: torch.device):
    """Times a build of a restriction (syncing ``device``), adding the seconds to
    ``owner.build_s`` and to :func:`total_build_s`."""
    global _total_build_s
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _device: None)
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    seconds = time.perf_counter() - start
    owner.build_s += seconds
    _total_build_s += seconds


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """Rows of ``grad`` with any entry that is not zero (NaN counts as non-zero), as a bool mask:
    the ``nonzero_rows`` op (on CUDA a kernel of its own: torch's ``any(dim=1)`` read a
    [2.45M, 48] fp32 gradient at 0.7 TB/s on the H100)."""
    return torch.ops.fgplugin.nonzero_rows.default(grad)


@torch.no_grad()
def restrict_columns(rowptr: torch.Tensor, col: torch.Tensor, live: torch.Tensor):
    """``(rowptr, keep, col)`` of the CSR ``(rowptr, col)`` restricted to the columns where the
    bool mask ``live`` holds: ``keep`` the positions of the kept non-zeros in the full CSR (for its
    values), ``col`` their columns (in the same numbering)."""
    kept = live.index_select(0, col)
    ends = torch.cumsum(kept, 0, dtype=rowptr.dtype)  # kept non-zeros up to each position
    starts = torch.cat([ends.new_zeros(1), ends])
    keep = kept.nonzero().squeeze(1).to(col.dtype)
    return starts.index_select(0, rowptr), keep, col.index_select(0, keep)


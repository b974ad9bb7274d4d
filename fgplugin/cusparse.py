"""Products that cuSPARSE (``torch.sparse.mm``) runs faster than fgplugin's kernel, run there.

fgplugin's CSR kernel gathers a row's neighbours with one warp per row (or per chunk of a hub
row), all of the row's F columns at once. On small graphs at 128-256 columns cuSPARSE's CSR SpMM
is faster: H100, CUDA-graph replay, GCN normalization, F = 128: actor 24 against 16 us, twitch_de
48 against 31, amazon_photo 34 against 26, chameleon 19 against 14 (up to 1.7x at F = 256); at 16
columns fgplugin's is faster on all 17 graphs measured (1.2-3.6x), at 64 on 15 of them
(benchmarks/results/h100/kernel_vs_cusparse.json). Gathering 8 rows at a time instead of 4, or
splitting F over more warps, made fgplugin's kernel slower on those graphs, not faster (same
file). So for an adjacency with ``threshold="auto"`` the second product at each width from
``MIN_WIDTH`` to ``MAX_WIDTH`` columns times both kernels, once, and a width where cuSPARSE is at
least ``MIN_GAIN`` faster runs there from then on. Counted per adjacency and width, so the
second may be another product at the width (a hidden layer's after the first layer's). The first
runs fgplugin's kernel untimed: a product seen once may never repeat (a constant input's first
layer call, ``A (x W)`` or ``A x``, which fgplugin.input_cache replaces by its kept aggregation
from the next call on), and timing both kernels with the fold's build cost more than the rest of
a first training step's one-time work (H100: 4-9 ms per graph, about 56 ms on a process's first;
docs/results.md section 36). Products whose result the caller keeps (the input cache's dense aggregation,
SGConv's cached propagation: :func:`computed_once`) are neither timed nor counted. The product
chosen: ``diag(r) (A + diag(d)) diag(c)`` folded into one CSR
(values ``r_i w_ij c_j``, the diagonal as entries), kept with the adjacency, with its transpose
for the backward pass.

It applies where all of these hold, else fgplugin's kernel runs:

- CUDA (or ``FGPLUGIN_CUSPARSE=1``, which forces it on any device: for tests), float32 features
  outside autocast (16-bit products stay on fgplugin's kernels, which accumulate in float32);
- no gradient wanted for the edge values, scales or diagonal (only ``x``'s: the transpose's
  product);
- at most ``MAX_NNZ`` non-zeros; no edge values or scales made in inference mode;
- in the backward pass, a gradient whose zero rows fgplugin's zero-row skipping would leave out
  (fgplugin.grad_rows: products of at least ``grad_rows.MIN_WORK`` multiply-adds) runs that
  restricted product on fgplugin's kernel instead of the full transposed one on cuSPARSE;
- plain eager mode, or a CUDA graph capture after the choice was made (fgplugin.graphed_step's
  warm-up makes it, timing device time alone, and keeps it apart from an eager step's choice);
  not under torch.compile, functorch transforms, tensor subclasses or torch function / dispatch
  modes.

The timing weighs what a run costs a step (autotune.cost_ms): device time in a captured step,
else the larger of host and device time. ``FGPLUGIN_CUSPARSE`` / :func:`fgplugin.set_cusparse`:
``auto`` (default), ``0`` (never), ``1`` (wherever it applies, untimed).
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from typing import NamedTuple

import torch
from torch import Tensor

from . import autotune
from .capture_holds import capturing, hold
from ._csr import rows_of_edges
from .config import settings
from .eager import plain_eager

# The widths timed: fgplugin's kernel won on every graph at 16 columns; wider products than 256 (a
# layer's input features) were not measured, and are rarely repeated: a constant input's product
# is kept (fgplugin.input_cache), so timing both kernels for it would cost more than it could save.
MIN_WIDTH, MAX_WIDTH = 64, 256
# cuSPARSE must be this much faster to be chosen: a small graph's eager product is host-bound, and
# one timing of its host time can be off by more than the two kernels differ
MIN_GAIN = 0.05
# Larger graphs are not timed: their fold is a second copy of the graph built by a sort (GBs at 100M
# non-zeros), and on the 75-200M-edge graphs measured cuSPARSE was never 5% faster: 1.3-1.6x slower
# on the same (reordered) order, within 0.98-1.16x of fgplugin's kernel on the original one
# (docs/results.md section 4)
MAX_NNZ = 1 << 24
MAX_FOLDS = 4  # folds kept per adjacency (one per normalization in use), the oldest dropped first


class Folded(NamedTuple):
    """``diag(r) (A + diag(d)) diag(c)`` as a torch CSR tensor and its transpose, with the
    arguments it was folded from (as the caller passed them) and their versions."""

    matrix: Tensor
    transposed: Tensor
    sources: tuple
    versions: tuple


# A width's choice before it is made: its first product ran, on fgplugin's kernel, untimed
SEEN_ONCE = "seen once"


def runs(adj, x: Tensor, row_scale, col_scale, diag, ours, sources: tuple) -> bool | None:
    """Whether ``spmm(adj, x, row_scale, col_scale, diag)`` (checked arguments; ``sources``: the
    scale arguments as the caller passed them) runs on cuSPARSE; ``ours(adj, x, row_scale,
    col_scale, diag, with_transpose)`` is fgplugin's product, which the second call at a width
    times against cuSPARSE's. ``None`` (falsy: fgplugin's kernel) where the choice is still to be
    made by the next call at the width: a caller keeping its decisions for repeated calls
    (fgplugin.repeated_calls, fgplugin.layer_calls) must not keep this one."""
    width = x.shape[1]
    forced = settings.cusparse == "1"
    if not MIN_WIDTH <= width <= MAX_WIDTH and not forced:  # most calls end here, at no cost
        return False
    if not plain_eager(x):  # before anything torch.compile cannot trace: it runs fgplugin's op
        return False
    key = _key(width)
    choice = adj._shared.get(key)
    if choice is False and not forced:
        return False
    if not _applies(adj, x, row_scale, col_scale, diag, forced):
        return False
    if capturing(x):
        # timing and folding need host syncs: a capture takes cuSPARSE only with its fold at hand
        return (forced or choice is True) and _kept_fold(adj, sources) is not None
    if forced:
        return True
    if choice is None or choice == SEEN_ONCE:
        if _computed_once.get():
            return None  # neither timed nor counted: the caller keeps this product's result
        if choice is None:
            adj._shared[key] = SEEN_ONCE
            return None
        choice = adj._shared[key] = _cusparse_is_faster(adj, width, row_scale, col_scale, diag, ours, sources)
    return choice


def choice_at(adj, width: int):
    """The route's record for ``width`` columns on ``adj`` in this context (eager, or a captured
    step's warm-up): ``None`` (no product yet), ``SEEN_ONCE``, or whether cuSPARSE runs it."""
    return adj._shared.get(_key(width))


def _key(width: int) -> tuple:
    """Where the route's record for ``width`` columns is kept in an adjacency's ``_shared``: apart
    for a captured step's warm-up, whose choice weighs device time alone."""
    return "cusparse", width, autotune.in_captured_step()


_computed_once = contextvars.ContextVar("fgplugin_computed_once", default=False)


@contextlib.contextmanager
def computed_once():
    """Products made inside, at a width whose route is not chosen yet, run fgplugin's kernel and
    neither time the route nor count towards it: for a result its caller keeps, which is never
    made again (the input cache's kept aggregation, SGConv's ``cached=True`` propagation). Their
    hops at one width would otherwise time the route for products that do not repeat."""
    token = _computed_once.set(True)
    try:
        yield
    finally:
        _computed_once.reset(token)


def product(adj, x: Tensor, row_scale, col_scale, diag, sources: tuple, restricted_adjoint=None) -> Tensor:
    """``diag(r) (A + diag(d)) diag(c) x`` on cuSPARSE (differentiable in ``x``).
    ``restricted_adjoint(g, full)``: the backward product over the non-zero rows of ``g`` where
    the zero-row skipping applies, else ``full()`` (cuSPARSE's full transposed product)."""
    fold = folded(adj, row_scale, col_scale, diag, sources)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Product.apply(x, fold, restricted_adjoint)
    return torch.sparse.mm(fold.matrix, x)


def folded(adj, row_scale, col_scale, diag, sources: tuple) -> Folded:
    """The folded CSR of ``adj`` and its (checked) scales, kept with the adjacency under the
    arguments the caller passed (``sources``: the same tensors, not rewritten in place, find it
    again, though a float64 scale is cast anew each call), up to ``MAX_FOLDS``; rebuilt after an
    in-place write to the edge values or to a scale."""
    kept = _kept_fold(adj, sources)
    if kept is not None:
        return hold(kept)
    folds = adj._kept_for_values("cusparse_folds") or {}
    fold = _fold(adj, row_scale, col_scale, diag, sources)
    folds = {k: v for k, v in folds.items() if k != _fold_key(sources)}
    folds[_fold_key(sources)] = fold
    while len(folds) > MAX_FOLDS:
        folds.pop(next(iter(folds)))
    adj._keep_for_values("cusparse_folds", folds)
    return hold(fold)


def _kept_fold(adj, sources: tuple) -> Folded | None:
    folds = adj._kept_for_values("cusparse_folds")
    fold = None if folds is None else folds.get(_fold_key(sources))
    if fold is None or fold.versions != _versions(sources) or not all(
            a is b if isinstance(a, Tensor) else a == b for a, b in zip(fold.sources, sources)):
        return None
    return fold


def _fold_key(sources: tuple) -> tuple:
    return tuple(id(t) if isinstance(t, Tensor) else t for t in sources)


def _versions(sources: tuple) -> tuple:
    return tuple(t._version if isinstance(t, Tensor) else None for t in sources)


class _Product(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fold, restricted_adjoint):
        ctx.fold, ctx.restricted_adjoint = fold, restricted_adjoint
        return torch.sparse.mm(fold.matrix, x)

    @staticmethod
    def backward(ctx, grad):
        def full():
            return torch.sparse.mm(ctx.fold.transposed, grad)

        return (full() if ctx.restricted_adjoint is None else ctx.restricted_adjoint(grad, full)), None, None


def _applies(adj, x: Tensor, row_scale, col_scale, diag, forced: bool) -> bool:
    if x.dtype != torch.float32 or torch.is_autocast_enabled(x.device.type):
        return False
    if not forced and (not x.is_cuda or adj.threshold != "auto" or adj.nnz > MAX_NNZ):
        return False
    # a fold is kept by the versions of what it was made from, which tensors made in inference
    # mode do not have
    if any(isinstance(t, Tensor) and t.is_inference() for t in (adj.values, row_scale, col_scale, diag)):
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (adj.values, row_scale, col_scale, diag)):
        return False
    return True


@torch.enable_grad()
def _cusparse_is_faster(adj, width: int, row_scale, col_scale, diag, ours, sources: tuple) -> bool:
    """Times one forward product both ways at ``width`` columns, each as a training step calls
    it (recorded for autograd; autotune.cost_ms: in an eager step its host time counts too)."""
    gen = torch.Generator(adj.device).manual_seed(0)
    x = torch.randn(adj.shape[1], width, device=adj.device, generator=gen).requires_grad_()
    try:
        our_ms = autotune.cost_ms(lambda: ours(adj, x, row_scale, col_scale, diag, True), x.device, warm_up=True)
        their_ms = autotune.cost_ms(lambda: product(adj, x, row_scale, col_scale, diag, sources), x.device,
                                    warm_up=True, stop_above=our_ms)
        faster = their_ms < our_ms * (1 - MIN_GAIN)
    except torch.cuda.OutOfMemoryError:  # the fold is a second copy of the graph: keep fgplugin's kernel
        torch.cuda.empty_cache()
        faster = False
    if not faster and not any(v is True for k, v in adj._shared.items() if k[0] == "cusparse"):
        adj._keep_for_values("cusparse_folds", None)  # no width runs on cuSPARSE: no fold is needed
    return faster


def _fold(adj, row_scale, col_scale, diag, sources: tuple) -> Folded:
    n_rows, n_cols = adj.shape
    rows = rows_of_edges(adj.rowptr, adj.nnz)
    cols = adj.col.long()
    values = torch.ones(adj.nnz, dtype=torch.float64, device=adj.device) if adj.values is None \
        else adj.values.detach().to(torch.float64)
    if row_scale is not None:
        values = values * row_scale[rows]
    if col_scale is not None:
        values = values * col_scale[cols]
    if diag is not None:
        loops = torch.arange(diag.shape[0], device=adj.device)
        loop_values = diag.to(torch.float64)
        if row_scale is not None:
            loop_values = loop_values * row_scale[:diag.shape[0]]
        if col_scale is not None:
            loop_values = loop_values * col_scale[:diag.shape[0]]
        rows, cols, values = torch.cat([rows, loops]), torch.cat([cols, loops]), torch.cat([values, loop_values])
    values = values.to(torch.float32)
    matrix = _csr(rows, cols, values, (n_rows, n_cols))
    symmetric = adj.values is None and row_scale is col_scale and n_rows == n_cols and adj.is_symmetric
    transposed = matrix if symmetric else _csr(cols, rows, values, (n_cols, n_rows))
    return Folded(matrix, transposed, sources, _versions(sources))


def _csr(rows: Tensor, cols: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    """The CSR tensor of the COO entries (repeated entries summed, as fgplugin's product sums them)."""
    with warnings.catch_warnings():  # torch's notes that its sparse tensors are in beta / unchecked
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, shape, check_invariants=False)
        return coo.coalesce().to_sparse_csr()

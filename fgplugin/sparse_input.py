"""A layer's constant input kept as a sparse matrix, so that ``x W`` runs on fgplugin's SpMM.

Many graphs come with bag-of-words node features: 0.1-2% of the entries of Cora's, CiteSeer's,
Coauthor's or Facebook's 1-7K feature columns are non-zero. The first layer multiplies them by
its weight every step, and again (transposed) for the weight's gradient: two dense GEMMs over
``n x F`` mostly-zero entries, which on such graphs are most of a captured training step for
stock PyG and for fgplugin alike (H100: 0.65-0.9 ms of the 1.1-1.2 ms steps of coauthor_cs,
facebook_pagepage and cornell5; docs/results.md).

When the input cache (fgplugin.input_cache) keeps a layer's constant input anyway, it may keep
``x`` as a CSR (a :class:`SparseInput`) instead of the dense ``A^K x``; the layer then computes
``A^K (x W)``, with ``x W`` on fgplugin's SpMM (``x``'s CSR times ``W``; its backward the
transposed product for ``W``'s gradient), ``A^K`` on the layer's graph. Per step that is 2 + 2K
sparse products over ``nnz(x) + K nnz(A)`` entries instead of two GEMMs over ``A^K x``'s entries.
A layer's other product with the same input (SAGE's root weight, ``aggregation.transform``) runs
on the sparse form too; the probe (CPU, captured steps) does not time it, so it underrates the
sparse form there.

Which is faster depends on the densities, the widths, the device and the rest of the step, so
the choice is timed, once, when the cache is filled (:func:`keep`): for a captured step and on the
CPU, both ways' forward and backward products on the actual shapes. An eager CUDA step, whose
host queues kernels while the device runs earlier ones, keeps the dense form unless the sparse
one saves more device time than its own host time (:func:`may_win_eager`), and where it does,
times the two forms on the user's own training steps (fgplugin.form_trial). Only float32 inputs
are candidates: float64 runs are reference runs, and 16-bit inputs would be widened to float32
values. ``FGPLUGIN_SPARSE_INPUT`` / :func:`fgplugin.set_sparse_input` turn the choice off
(``"0"``) or force the sparse form wherever it applies (``"1"``, for tests).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import Tensor

from . import autotune, ops
from ._csr import rowptr_from_sorted_rows
from .capture_holds import capturing
from .config import set_row_skipping, settings
from .form_trial import FormTrial
from .tiling import TiledAdjacency

# Inputs whose sparse work (nnz(x) + K nnz(A)) exceeds this share of n F are never timed: gathers
# cost several times a GEMM's multiply-add, so the sparse form cannot win there.
MAX_SPARSE_SHARE = 0.1


class SparseInput:
    """A constant ``[n, F]`` input held as its non-zeros (a rectangular :class:`TiledAdjacency`
    without dense tiles): ``x @ w`` is ``fgplugin.spmm(adj, w)``, differentiable in ``w``."""

    __slots__ = ("adj",)

    def __init__(self, adj: TiledAdjacency):
        self.adj = adj

    @classmethod
    def of(cls, x: Tensor) -> "SparseInput":
        """The non-zeros of a 2-D float tensor ``x`` (raises ValueError for NaN or infinite ones)."""
        x = x.detach()
        rows, cols = x.nonzero(as_tuple=True)  # row-major: a CSR's order
        rowptr = rowptr_from_sorted_rows(rows, x.shape[0], torch.int64)
        # no dense tiles: a feature matrix has no blocks for them, and no probe is spent on it
        return cls(TiledAdjacency.from_csr(rowptr, cols, x[rows, cols], shape=tuple(x.shape), threshold=1.0))

    @property
    def shape(self) -> tuple[int, int]:
        return self.adj.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.adj.values.dtype

    @property
    def device(self) -> torch.device:
        return self.adj.device

    def __matmul__(self, w: Tensor) -> Tensor:
        return ops.spmm(self.adj, w)


def keep(graph, x: Tensor, width: int, hops: int, dense: Callable[[], Tensor]):
    """What a layer that aggregates ``x`` over ``graph`` (an ``Aggregation``) ``hops`` times and
    multiplies it by a ``[F, width]`` weight keeps of its constant input: ``dense()`` (``A^K x``),
    ``x`` as a :class:`SparseInput` where its products are faster, or, where the sparse form may
    make an eager CUDA step faster, a :class:`fgplugin.form_trial.FormTrial` that times both on
    the training steps (the input cache keeps the faster). Running out of GPU memory while the
    forms are timed keeps the dense form; in ``dense()`` itself it is the caller's, as without
    the sparse form."""
    if not _candidate(graph, x, hops):
        return dense()
    if settings.sparse_input == "1":
        sparse = _sparse_form(x)
        return dense() if sparse is None else sparse
    eager = x.is_cuda and not autotune.in_captured_step()
    try:
        sparse = (_worth_a_trial if eager else _faster_sparse_form)(graph, x, width, hops)
    except torch.cuda.OutOfMemoryError:  # timing the forms: keeping the dense one needs no more
        torch.cuda.empty_cache()
        sparse = None
    if sparse is None:
        return dense()
    return FormTrial(dense(), sparse, x.device) if eager else sparse


def may_win_eager(dense_ms: tuple[float, float], sparse_ms: tuple[float, float] | None = None) -> bool:
    """Whether the sparse form may make an eager step faster, given each form's ``(device, host)``
    ms per training step (:func:`_worth_a_trial`): only if the device time it saves exceeds its
    own host time. A step bound by its host pays the sparse form's host work (2 + 2K sparse
    products against two GEMMs); one bound by its device gains at most the device time saved,
    little against such a step where it is less than that host time. Without
    ``sparse_ms`` (not timed yet): whether the dense form's device time exceeds its host time, a
    shortcut that spares building the sparse form where it has no chance: it makes more calls, and
    its host time read 0.92-2.4x the dense form's on the graphs below.

    H100, the 11 graphs whose bag-of-words input may be kept sparse (docs/results.md section 29):
    the sparse form saved 0.003-0.12 ms of device time on 8 of them and 0.46 on cornell5, less
    than its 0.31-0.83 ms of host time, and in another lease's eager steps those 9 ran
    0.085-0.53 ms slower on it; on coauthor_cs and facebook_pagepage it saved 0.78-0.90 ms for
    0.48-0.49, and their eager steps were within 8% either way, which only a trial on those steps
    tells apart. The difference of
    the two forms' host times, the obvious bound, read -0.03 to 0.42 ms on the same graphs, noise
    against the steps' 0.085-0.53."""
    dense_device, dense_host = dense_ms
    if sparse_ms is None:
        return dense_device > dense_host
    sparse_device, sparse_host = sparse_ms
    return dense_device - sparse_device > sparse_host


def _candidate(graph, x: Tensor, hops: int) -> bool:
    """Whether ``x`` may be kept sparse: allowed, float32, few enough non-zeros to have a chance."""
    if settings.sparse_input == "0" or x.dim() != 2 or x.dtype != torch.float32 or x.numel() == 0:
        return False
    if capturing(x):  # counting needs a host sync
        return False
    work = int(torch.count_nonzero(x)) + hops * graph.adj.nnz
    return settings.sparse_input == "1" or work <= MAX_SPARSE_SHARE * graph.shape[0] * x.shape[1]  # A^K x's size


def _sparse_form(x: Tensor) -> SparseInput | None:
    """``x`` as a :class:`SparseInput`, or ``None`` where it has NaN or infinite entries (the dense
    products keep their semantics) or the GPU has no memory for it (the dense form needs no more)."""
    try:
        return SparseInput.of(x)
    except ValueError:
        return None
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def _faster_sparse_form(graph, x: Tensor, width: int, hops: int) -> SparseInput | None:
    """On the CPU and for a captured step: the sparse form where its products are faster
    (:func:`_sparse_is_faster`), else ``None``."""
    sparse = _sparse_form(x)
    return sparse if sparse is not None and _sparse_is_faster(graph, x, sparse, width, hops) else None


def _sparse_is_faster(graph, x: Tensor, sparse: SparseInput, width: int, hops: int) -> bool:
    """Times one training step's use of each form (:func:`_form_steps`) by
    :func:`fgplugin.autotune.cost_ms`: on the CPU and for a captured step."""
    dense_step, sparse_step = _form_steps(graph, x, width, hops)
    with _row_skipping_off():
        sparse_ms = autotune.cost_ms(sparse_step(sparse), x.device, warm_up=True)
        # warmed up too: a first GEMM of a shape loads its kernels (CUDA's lazy loading), which
        # made one dense step look slower than the whole sparse one and ended the timing there
        return sparse_ms < autotune.cost_ms(dense_step, x.device, warm_up=True, stop_above=sparse_ms)


def _worth_a_trial(graph, x: Tensor, width: int, hops: int) -> SparseInput | None:
    """The sparse form where :func:`may_win_eager` says a trial on the eager steps may find it
    faster, else ``None``; each form's training-step use (:func:`_form_steps`) timed by
    :func:`fgplugin.autotune.device_and_host_ms`, the sparse form built and timed only where the
    dense form's times leave it a chance. H100: 3-7 ms for the dense form alone, 22-50 ms with the
    sparse form, whose first products build its kernel plans (which a trial's first sparse steps
    would otherwise build). Seven timed batches instead of three took 2x (dense form alone) and
    1.5x as long and changed no decision on 11 graphs; where one flips between runs (cornell5:
    0.46 ms saved against 0.45-0.72 ms of sparse host time), the two forms' eager steps are within
    4%."""
    dense_step, sparse_step = _form_steps(graph, x, width, hops)
    with _row_skipping_off():
        dense_ms = autotune.device_and_host_ms(dense_step, x.device)
        if not may_win_eager(dense_ms):
            return None
        sparse = _sparse_form(x)
        if sparse is None:
            return None
        return sparse if may_win_eager(dense_ms, autotune.device_and_host_ms(sparse_step(sparse), x.device)) else None


@contextmanager
def _row_skipping_off():
    """The zero-row skipping off while the forms are timed: its host sync would wait for the
    timer's sleep kernel."""
    previous = set_row_skipping(False)
    try:
        yield
    finally:
        set_row_skipping(previous)


def _form_steps(graph, x: Tensor, width: int, hops: int):
    """``(dense_step, sparse_step)``: one training step's use of each form, forward and backward
    through autograd as the layer runs them, at ``width`` columns: the dense form's ``(A^K x) W``
    and its weight gradient ``(A^K x)^T G``, against (``sparse_step(sparse)``, for ``x``'s
    :class:`SparseInput`) ``x W``, the ``hops`` products over the graph, their adjoints and
    ``x^T G'``. Through autograd because a step pays the autograd functions' host time as well."""
    gen = torch.Generator(device=x.device).manual_seed(0)
    w = torch.randn(x.shape[1], width, device=x.device, generator=gen).requires_grad_()
    g_dst = torch.randn(graph.shape[0], width, device=x.device, generator=gen)
    # the dense form multiplies A^K x, one row per target node (its values do not change a GEMM's time)
    aggregated = x if graph.shape[0] == x.shape[0] else x.new_zeros(graph.shape[0], x.shape[1])

    def step(forward):
        def run():
            w.grad = None
            with torch.enable_grad():
                forward().backward(g_dst)
        return run

    def sparse_step(sparse: SparseInput):
        def forward():
            h = sparse @ w
            for _ in range(hops):
                h = graph(h)
            return h
        return step(forward)

    return step(lambda: aggregated @ w), sparse_step

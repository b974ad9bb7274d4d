"""A ``fgplugin.spmm`` call that repeats an earlier one reuses what the earlier one decided.

On small graphs a training step is bound by host time, and most of a product's host time went
to its checks and choices: argument checks, the scales' dtype, the cuSPARSE choice, the padding,
the kept op arguments, which autograd node records it. 16 us of a 25 us call (a GCN layer's
product with its epilogue, 64-node graph, 2-core CPU, torch 2.13), where the op itself, kernels
and autograd node included, takes 9 us. Those depend only on what a training loop passes
unchanged from one step to the next: the adjacency, the scale and bias tensors (by identity), x's
dtype, shape and device, whether a gradient is wanted, the switches of fgplugin.config and the
edge values' version. So :func:`fgplugin.spmm` keeps, per adjacency and per such key, the
decided call (the op's arguments but ``x``, the scales, diagonal and bias, the columns to pad
``x`` with, and how to run the op: the extension's ``KeptSpmm``, which runs it from C++, or
``fgplugin.ops.PreparedCall``; ``fgplugin.ops.prepared_call`` picks), and a later call with the
same key runs it at once. Module constants that steer a decision (the work floors of the zero-row
skipping and of the padding) count when a call is first decided.

Only calls in plain eager mode are kept or reused, with no autocast, forward-mode AD, CUDA graph
capture or captured-step warm-up active; their edge values, scales and diagonal need no gradient,
the checks changed none of the given tensors (no cast), and their width's route to cuSPARSE is not
left to a later call (fgplugin.cusparse: the first product at a width). Everything else takes the
full path, every time. What the op's C++ side checks (shapes, dtypes, devices of every tensor it gets) it
checks on every call, so a tensor resized in place since still gets a clear error, not a wrong
read. A kept call holds only weak references to the caller's tensors of its key (scales,
diagonal, bias: the call passes them itself), so scales made anew every step are freed as
before; an adjacency keeps at most ``MAX_KEPT`` calls, all for its edge values' current version.
"""
from __future__ import annotations

import weakref

import torch
from torch.autograd import forward_ad as _forward_ad

from .autotune import in_captured_step
from .capture_holds import capturing, collecting_holds
from .config import settings
from .eager import plain_eager

MAX_KEPT = 32  # per adjacency: a few layers x widths x grad modes; dropped all at once beyond


def key_of(adj, x: torch.Tensor, row_scale, col_scale, diag, bias, width) -> tuple:
    """What a call's decisions depend on, besides the context :func:`find` checks (the edge
    values' version at ``_VERSION_AT``). Tensors by id and dtype; a float ``diag`` by value; ``x``'s
    layout, so that a sparse ``x`` meets the full path's check."""
    grad = torch.is_grad_enabled()
    values = adj.values
    return (x.dtype, x.layout, x.shape, x.device, grad and x.requires_grad,
            None if row_scale is None else (id(row_scale), row_scale.dtype),
            None if col_scale is None else (id(col_scale), col_scale.dtype),
            (id(diag), diag.dtype) if isinstance(diag, torch.Tensor) else diag,
            None if bias is None else (id(bias), bias.dtype, grad and bias.requires_grad), width,
            None if values is None else values._version, *switches())


def switches() -> tuple:
    """The switches of fgplugin.config that steer a product's decisions (kept calls are keyed by them)."""
    return settings.cusparse, settings.block_adaptive, settings.skip_zero_rows


_VERSION_AT = 10


def find(adj, x, row_scale, col_scale, diag, bias, width):
    """The call kept for these arguments, or ``None`` (then the caller takes the full path)."""
    if torch.compiler.is_compiling():  # first: a traced read of the kept calls would be guarded on
        return None
    calls = getattr(adj, "_calls", None)  # before the caller's checks: adj may be anything
    if not calls or not context_allows(x) or not _keyable(row_scale, col_scale, diag, bias):
        return None
    kept = calls.get(key_of(adj, x, row_scale, col_scale, diag, bias, width))
    if kept is None:
        return None
    prepared, refs = kept
    # equal ids are the same objects only while the kept ones live (weak references, so that a
    # kept call holds none of the caller's tensors)
    r, c, d, b = refs
    if ((r is not None and r() is not row_scale) or (c is not None and c() is not col_scale)
            or (d is not None and d() is not diag) or (b is not None and b() is not bias)
            or need_grads(adj.values, row_scale, col_scale, diag)):
        return None
    return prepared


def keep(adj, x, row_scale, col_scale, diag, bias, width, prepared, checked: tuple) -> None:
    """Keeps ``prepared`` (a ``PreparedCall``) for calls like this one where that is safe (see
    the module doc), for a call whose context :func:`context_allows`; ``checked``: the scales,
    diagonal and bias as the checks returned them."""
    sources = (row_scale, col_scale, diag, bias)
    if any(a is not b for a, b in zip(sources, checked) if isinstance(a, torch.Tensor)):
        return  # a cast made a tensor of its own: the call would have to cast again
    values = adj.values
    if values is not None and values.is_inference():
        return  # no version to key on
    if need_grads(values, row_scale, col_scale, diag):
        return
    calls = adj._calls
    key = key_of(adj, x, row_scale, col_scale, diag, bias, width)
    if len(calls) >= MAX_KEPT or any(k[_VERSION_AT] != key[_VERSION_AT] for k in calls):
        # calls kept for earlier edge values never match again, and may hold a copy of them (a cast)
        calls.clear()
    calls[key] = prepared, tuple(weakref.ref(t) if isinstance(t, torch.Tensor) else None for t in sources)


def _keyable(row_scale, col_scale, diag, bias) -> bool:
    """Whether the arguments are of the kinds a kept call was checked with (tensors or ``None``, a
    plain number for ``diag``): anything else takes the full path and gets its checks' error."""
    tensor = torch.Tensor
    return ((row_scale is None or isinstance(row_scale, tensor)) and (col_scale is None or isinstance(col_scale, tensor))
            and (bias is None or isinstance(bias, tensor))
            and (diag is None or type(diag) in (float, int, bool) or isinstance(diag, tensor)))


def context_allows(x: torch.Tensor) -> bool:
    """Whether this call's context lets a call be kept or reused (see the module doc)."""
    return (plain_eager(x) and not _any_autocast() and _forward_ad._current_level < 0 and not in_captured_step()
            and not collecting_holds() and not capturing(x))


_any_autocast = torch._C._is_any_autocast_enabled


def need_grads(values, row_scale, col_scale, diag) -> bool:
    """Whether the edge values, scales or diagonal need a gradient: such calls take the full path."""
    return ((values is not None and values.requires_grad) or (row_scale is not None and row_scale.requires_grad)
            or (col_scale is not None and col_scale.requires_grad)
            or (isinstance(diag, torch.Tensor) and diag.requires_grad))

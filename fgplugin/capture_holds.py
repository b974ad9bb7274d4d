"""What a CUDA graph being captured reads from fgplugin's caches, held for as long as the graph.

A captured graph reads tensors at fixed addresses. Some of what the products read comes from
caches that may let it go later: a layer's kept input aggregation (fgplugin.input_cache, dropped
when the layer sees another input), the weighted copies of an adjacency (``with_values``, up to
a few per adjacency), its constant diagonals and cuSPARSE folds (bounded too). If one of them were
freed, the graph would read whatever the allocator put there next, without any error. So while
``fgplugin.graphed_step`` captures a step, each cache hands what it returns to :func:`hold`, and
the step keeps the list (:func:`collecting`) with its graph.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

# per thread (and task), like the capture itself
_held = contextvars.ContextVar("fgplugin_capture_holds", default=None)
# The collections in progress in any thread, latest last: autograd runs a CUDA backward pass on a
# thread of its own, which sees none of the capturing thread's context variables, so what a
# captured backward product reads (fgplugin.grad_rows.captured_restriction) goes to the latest.
# Holding an object in a collection it does not belong to only keeps it alive a little longer.
_in_progress: list = []


@contextlib.contextmanager
def collecting(into: list):
    """Within: what the caches hand out is appended to ``into``."""
    token = _held.set(into)
    _in_progress.append(into)
    try:
        yield into
    finally:
        del _in_progress[max(i for i, held in enumerate(_in_progress) if held is into)]  # by identity
        _held.reset(token)


def hold(obj):
    """``obj``, noted as read by the capture in progress (if any)."""
    held = _held.get()
    if held is None and _in_progress:
        held = _in_progress[-1]
    if held is not None:
        held.append(obj)
    return obj


def capturing(t) -> bool:
    """Whether ``t`` is a CUDA tensor and the current stream is capturing a CUDA graph (where a
    host sync, e.g. a check or a timing, would fail the capture)."""
    return isinstance(t, torch.Tensor) and t.is_cuda and _stream_capturing()


# torch.cuda.is_current_stream_capturing less its Python wrapper (asked on every kept spmm call,
# fgplugin.repeated_calls); a CUDA build's, and t.is_cuda never holds on another
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)


def collecting_holds() -> bool:
    """Whether what the caches hand out is being collected (:func:`collecting`)."""
    return _held.get() is not None

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
import threading

import torch

# per thread (and task), like the capture itself
_held = contextvars.ContextVar("fgplugin_capture_holds", default=None)
# The collections in progress in any thread (by id): autograd runs a CUDA backward pass on a
# thread of its own, which sees none of the capturing thread's context variables, so what a
# captured backward product reads (fgplugin.grad_rows.captured_restriction) goes to every one of
# them. Holding an object in a collection it does not belong to only keeps it alive a little longer.
_in_progress: dict = {}
_in_progress_lock = threading.Lock()


@contextlib.contextmanager
def collecting(into: list):
    """Within: what the caches hand out is appended to ``into``."""
    token = _held.set(into)
    with _in_progress_lock:
        _in_progress[id(into)] = into
    try:
        yield into
    finally:
        with _in_progress_lock:
            del _in_progress[id(into)]
        _held.reset(token)


def hold(obj):
    """``obj``, noted as read by the capture in progress (if any): the caller's thread's
    collection, else (autograd's backward thread) every collection in progress."""
    held = _held.get()
    if held is not None:
        held.append(obj)
        return obj
    with _in_progress_lock:
        for collection in _in_progress.values():
            collection.append(obj)
    return obj


def collection_in_progress() -> bool:
    """Whether some thread collects what a capture reads (:func:`collecting`)."""
    return _held.get() is not None or bool(_in_progress)


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

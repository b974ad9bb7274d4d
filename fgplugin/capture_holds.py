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
# The collections in progress, by the CUDA stream each one's capture runs on: autograd runs a
# CUDA backward pass on a thread of its own, which sees none of the capturing thread's context
# variables but runs on the forward pass's stream, so what a captured backward product reads
# (fgplugin.grad_rows.captured_restriction) finds its collection by the current stream.
_by_stream: dict = {}  # stream key -> list of collections (nested ones last)
_by_stream_lock = threading.Lock()


def _stream_key():
    """The current CUDA stream where one is capturing, else ``None``."""
    if not torch.cuda.is_initialized() or not _stream_capturing():
        return None
    stream = torch.cuda.current_stream()
    return stream.device_index, stream.stream_id


@contextlib.contextmanager
def collecting(into: list):
    """Within: what the caches hand out is appended to ``into`` (also from autograd's backward
    thread, where a capture is in progress on the current stream)."""
    token = _held.set(into)
    key = _stream_key()
    if key is not None:
        with _by_stream_lock:
            _by_stream.setdefault(key, []).append(into)
    try:
        yield into
    finally:
        try:
            if key is not None:
                with _by_stream_lock:
                    collections = _by_stream[key]
                    del collections[max(i for i, c in enumerate(collections) if c is into)]  # by identity
                    if not collections:
                        del _by_stream[key]
        finally:
            _held.reset(token)


def collection() -> list | None:
    """The collection a capture in progress here reads for: this thread's, else the latest one
    whose capture runs on the current CUDA stream (autograd's backward thread), else ``None``."""
    held = _held.get()
    if held is not None:
        return held
    if not _by_stream:  # no capture collects anywhere: the eager calls' case, without the stream query
        return None
    key = _stream_key()
    if key is None:
        return None
    with _by_stream_lock:
        collections = _by_stream.get(key)
        return collections[-1] if collections else None


def hold(obj):
    """``obj``, noted as read by the capture in progress (if any, :func:`collection`)."""
    held = collection()
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

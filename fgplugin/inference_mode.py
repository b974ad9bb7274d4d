"""fgplugin's work under ``torch.inference_mode()`` runs with inference mode off.

What fgplugin builds for a graph (its adjacency, transpose, kernel plans, normalization, the
op's arguments) is kept and reused by later calls, training ones included. Built in inference
mode those would be inference tensors, which autograd refuses to save: a model evaluated first
(PyTorch Lightning's sanity check runs validation under inference mode before training starts)
then failed its first training step with "Inference tensors cannot be saved for backward". So
the entry points that build or read those caches (``fgplugin.spmm``, ``TiledAdjacency.norm``,
the layers' graph handling) run with inference mode off and autograd off instead: the same
results, computed without recording anything, and normal tensors in the caches and outputs.
"""
from __future__ import annotations

import contextvars
import functools

import torch

# set while a call made in inference mode runs with it off: what the caller asked for still rules
# choices that depend on it (a layer's input cache is not used in inference mode)
_called_in_inference_mode = contextvars.ContextVar("fgplugin_called_in_inference_mode", default=False)


def outside_inference_mode(fn):
    """``fn``, run with inference mode and autograd off when called in inference mode."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # torch.compile cannot trace the inference-mode query (a graph break): it asks first
        if torch.compiler.is_compiling() or not torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        token = _called_in_inference_mode.set(True)
        try:
            with torch.inference_mode(False), torch.no_grad():
                return fn(*args, **kwargs)
        finally:
            _called_in_inference_mode.reset(token)

    return wrapper


def in_inference_mode() -> bool:
    """Whether the caller is in inference mode, also inside :func:`outside_inference_mode`."""
    return torch.is_inference_mode_enabled() or _called_in_inference_mode.get()

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

import functools

import torch


def outside_inference_mode(fn):
    """``fn``, run with inference mode and autograd off when called in inference mode."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # torch.compile cannot trace the inference-mode query (a graph break): it asks first
        if torch.compiler.is_compiling() or not torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode(False), torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper

"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where DGL's were."""
from __future__ import annotations

import sys

import torch

from .convs import GraphConv, SAGEConv, SGConv, dgl_conv

#: stock DGL layer -> its fgplugin drop-in
LAYERS = {dgl_conv.GraphConv: GraphConv, dgl_conv.SAGEConv: SAGEConv, dgl_conv.SGConv: SGConv}

_patched: list[tuple[dict, str, type]] = []  # (module namespace, name, stock class) that patch() rebound


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Swaps every stock layer of ``model`` (``model`` itself included) for its fgplugin drop-in,
    in place, and returns ``model``. Parameters, buffers, hooks and settings stay: only the class
    changes (the drop-ins add no state). Subclasses of the stock layers are left alone."""
    for module in model.modules():
        ours = LAYERS.get(type(module))
        if ours is not None:
            module.__class__ = ours
    return model


def patch() -> None:
    """Makes the stock names resolve to the fgplugin layers, so unmodified scripts use them.

    Every imported module that holds a stock layer class under some name gets ours instead
    (``dgl.nn.GraphConv``, ``dgl.nn.pytorch.GraphConv``, ``dgl.nn.pytorch.conv.GraphConv``, user
    modules that imported the class before); the defining modules keep the stock class, so
    existing stock objects still pickle. Idempotent; undone by :func:`unpatch`.
    """
    stock_by_id = {id(stock): stock for stock in LAYERS}  # id(): touches no attribute of odd objects
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or str(namespace.get("__name__", "")).startswith("fgplugin"):
            continue
        for name, value in list(namespace.items()):
            stock = stock_by_id.get(id(value))
            if stock is not None and namespace["__name__"] != stock.__module__:
                namespace[name] = LAYERS[stock]
                _patched.append((namespace, name, stock))


def unpatch() -> None:
    """Restores every name :func:`patch` rebound (layers already built stay fgplugin layers)."""
    while _patched:
        namespace, name, stock = _patched.pop()
        if namespace.get(name) is LAYERS[stock]:
            namespace[name] = stock

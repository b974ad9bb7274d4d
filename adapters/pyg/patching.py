"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where PyG's were."""
from __future__ import annotations

import sys

import torch
from torch_geometric.nn import conv as pyg_conv

from .gcn_conv import GCNConv
from .lg_conv import LGConv
from .sage_conv import SAGEConv
from .sg_conv import SGConv

#: stock PyG layer -> its fgplugin drop-in
LAYERS = {pyg_conv.GCNConv: GCNConv, pyg_conv.SAGEConv: SAGEConv, pyg_conv.SGConv: SGConv, pyg_conv.LGConv: LGConv}

_patched: list[tuple[dict, str, type]] = []  # (module namespace, name, stock class) that patch() rebound


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Swaps every stock layer of ``model`` (``model`` itself included) for its fgplugin drop-in,
    in place, and returns ``model``.

    The layers keep their parameters, buffers, hooks and settings: only their class changes (the
    drop-ins add no state). Subclasses of the stock layers are left alone, since they may
    override what the drop-in replaces.
    """
    for module in model.modules():
        ours = LAYERS.get(type(module))
        if ours is not None:
            module.__class__ = ours
            module._set_jittable_templates()  # PyG's generated propagate() for the new class
    return model


def patch() -> None:
    """Makes the stock names resolve to the fgplugin layers, so unmodified scripts use them.

    Every imported module that holds a stock layer class under some name gets ours instead:
    ``torch_geometric.nn.GCNConv``, ``torch_geometric.nn.conv.GCNConv``, the modules that bound
    the class at import (``torch_geometric.nn.models.basic_gnn``, so ``torch_geometric.nn.models.GCN``
    builds ours) and user modules that ran ``from torch_geometric.nn import GCNConv`` before.
    Modules imported later find ours in ``torch_geometric.nn``. The defining modules
    (``torch_geometric.nn.conv.gcn_conv.GCNConv``) keep the stock class, so existing stock
    objects still pickle. Idempotent; undone by :func:`unpatch`.
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

"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where PyG's were."""
from __future__ import annotations

import torch

from fgplugin._rebind import AdapterSwaps
from torch_geometric.nn import conv as pyg_conv

from .gcn_conv import GCNConv
from .lg_conv import LGConv
from .sage_conv import SAGEConv
from .sg_conv import SGConv

#: stock PyG layer -> its fgplugin drop-in
LAYERS = {pyg_conv.GCNConv: GCNConv, pyg_conv.SAGEConv: SAGEConv, pyg_conv.SGConv: SGConv, pyg_conv.LGConv: LGConv}

# PyG generates each layer class's propagate(); a converted layer needs the one of its new class.
_swaps = AdapterSwaps(LAYERS, on_convert=lambda module: module._set_jittable_templates())

def convert(model: torch.nn.Module, *, dropout: bool = True) -> torch.nn.Module:
    """Swaps the stock GCNConv, SAGEConv, SGConv and LGConv layers of ``model`` for fgplugin's, **in
    place** (the same module objects change class; weights, settings and hooks kept; no copy), and
    returns ``model``.

    ``dropout``: also swap ``torch.nn.Dropout`` for :class:`fgplugin.Dropout` (the same
    distribution; a parallel mask on CPUs, torch's dropout on GPUs); ``False`` keeps torch's.
    Subclasses of the stock layers are left as they are (they may override what fgplugin's layers
    replace)."""
    return _swaps.convert(model, dropout=dropout)


def patch(*, dropout: bool = False) -> None:
    """Makes ``torch_geometric.nn.GCNConv`` & co. (also as bound by ``torch_geometric.nn.models``)
    fgplugin's layers in every imported module, for scripts that build their models themselves;
    ``dropout=True`` also swaps ``torch.nn.Dropout``. The patched names then miss stock layers in
    ``isinstance`` (built before, unpickled, torch's own modules' dropout): test against
    ``torch_geometric.nn.conv.gcn_conv.GCNConv`` (``torch.nn.modules.dropout.Dropout``).
    :func:`unpatch` undoes it."""
    _swaps.patch(dropout=dropout)


def unpatch() -> None:
    """Undoes :func:`patch`."""
    _swaps.unpatch()

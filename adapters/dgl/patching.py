"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where DGL's were."""
from __future__ import annotations

import torch

from fgplugin._rebind import AdapterSwaps

from .convs import GraphConv, SAGEConv, SGConv, dgl_conv

#: stock DGL layer -> its fgplugin drop-in
LAYERS = {dgl_conv.GraphConv: GraphConv, dgl_conv.SAGEConv: SAGEConv, dgl_conv.SGConv: SGConv}

_swaps = AdapterSwaps(LAYERS)

def convert(model: torch.nn.Module, *, dropout: bool = True) -> torch.nn.Module:
    """Swaps the stock GraphConv, SAGEConv (mean; its other aggregators run stock code) and SGConv layers
    of ``model`` for fgplugin's, **in place** (the same module objects change class; weights,
    settings and hooks kept; no copy), and returns ``model``.

    ``dropout``: also swap ``torch.nn.Dropout`` for :class:`fgplugin.Dropout` (the same
    distribution; a parallel mask on CPUs, torch's dropout on GPUs); ``False`` keeps torch's.
    Subclasses of the stock layers are left as they are (they may override what fgplugin's layers
    replace)."""
    return _swaps.convert(model, dropout=dropout)


def patch(*, dropout: bool = False) -> None:
    """Makes ``dgl.nn.GraphConv`` & co. fgplugin's layers in every imported module, for scripts that build
    their models themselves; ``dropout=True`` also swaps ``torch.nn.Dropout``. The patched names
    then miss stock layers in ``isinstance`` (built before, unpickled, torch's own modules'
    dropout): test against the defining module's class (``dgl.nn.pytorch.conv.graphconv.GraphConv``,
    ``torch.nn.modules.dropout.Dropout``). :func:`unpatch` undoes it."""
    _swaps.patch(dropout=dropout)


def unpatch() -> None:
    """Undoes :func:`patch`."""
    _swaps.unpatch()

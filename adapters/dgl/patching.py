"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where DGL's were."""
from __future__ import annotations

from fgplugin._rebind import LayerRebinder

from .convs import GraphConv, SAGEConv, SGConv, dgl_conv

#: stock DGL layer -> its fgplugin drop-in
LAYERS = {dgl_conv.GraphConv: GraphConv, dgl_conv.SAGEConv: SAGEConv, dgl_conv.SGConv: SGConv}

_rebinder = LayerRebinder(LAYERS)

#: Swaps the stock layers of a model for fgplugin's, in place (see LayerRebinder.convert).
convert = _rebinder.convert
#: ``dgl.nn.GraphConv`` & co. become ours in every imported module.
patch = _rebinder.patch
#: Undoes :func:`patch`.
unpatch = _rebinder.unpatch

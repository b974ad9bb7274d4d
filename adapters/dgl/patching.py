"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where DGL's were."""
from __future__ import annotations

from fgplugin._rebind import AdapterSwaps, adapter_functions

from .convs import GraphConv, SAGEConv, SGConv, dgl_conv

#: stock DGL layer -> its fgplugin drop-in
LAYERS = {dgl_conv.GraphConv: GraphConv, dgl_conv.SAGEConv: SAGEConv, dgl_conv.SGConv: SGConv}

_swaps = AdapterSwaps(LAYERS)

convert, patch, unpatch = adapter_functions(
    _swaps, __name__, layers="GraphConv, SAGEConv (mean; its other aggregators run stock code) and SGConv",
    patched="``dgl.nn.GraphConv`` & co.",
    stock_classes="the defining module's class (``dgl.nn.pytorch.conv.graphconv.GraphConv``, "
                  "``torch.nn.modules.dropout.Dropout``)")

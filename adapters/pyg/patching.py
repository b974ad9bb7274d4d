"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where PyG's were."""
from __future__ import annotations

from fgplugin._rebind import AdapterSwaps, adapter_functions
from torch_geometric.nn import conv as pyg_conv

from .gcn_conv import GCNConv
from .lg_conv import LGConv
from .sage_conv import SAGEConv
from .sg_conv import SGConv

#: stock PyG layer -> its fgplugin drop-in
LAYERS = {pyg_conv.GCNConv: GCNConv, pyg_conv.SAGEConv: SAGEConv, pyg_conv.SGConv: SGConv, pyg_conv.LGConv: LGConv}

# PyG generates each layer class's propagate(); a converted layer needs the one of its new class.
_swaps = AdapterSwaps(LAYERS, on_convert=lambda module: module._set_jittable_templates())

convert, patch, unpatch = adapter_functions(
    _swaps, __name__, layers="GCNConv, SAGEConv, SGConv and LGConv",
    patched="``torch_geometric.nn.GCNConv`` & co. (also as bound by ``torch_geometric.nn.models``)",
    stock_classes="``torch_geometric.nn.conv.gcn_conv.GCNConv`` (``torch.nn.modules.dropout.Dropout``)")

"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where PyG's were."""
from __future__ import annotations

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

#: Swaps the stock layers (and ``torch.nn.Dropout``) of a model for fgplugin's, in place: the
#: model's own modules change class, weights and settings kept (see AdapterSwaps.convert);
#: ``convert(model, dropout=False)`` keeps torch's dropout.
convert = _swaps.convert
#: ``torch_geometric.nn.GCNConv`` & co. (also as bound by ``torch_geometric.nn.models``) become
#: ours; ``patch(dropout=True)`` also swaps ``torch.nn.Dropout``. The patched names then miss
#: stock layers in ``isinstance`` (built before, unpickled, torch's own modules' dropout): test
#: against ``torch_geometric.nn.conv.gcn_conv.GCNConv`` (``torch.nn.modules.dropout.Dropout``).
patch = _swaps.patch
#: Undoes :func:`patch`.
unpatch = _swaps.unpatch

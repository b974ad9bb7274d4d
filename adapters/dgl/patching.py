"""``convert(model)``, ``patch()``, ``unpatch()``: put fgplugin's layers where DGL's were."""
from __future__ import annotations

from fgplugin._rebind import AdapterSwaps

from .convs import GraphConv, SAGEConv, SGConv, dgl_conv

#: stock DGL layer -> its fgplugin drop-in
LAYERS = {dgl_conv.GraphConv: GraphConv, dgl_conv.SAGEConv: SAGEConv, dgl_conv.SGConv: SGConv}

_swaps = AdapterSwaps(LAYERS)

#: Swaps the stock layers (and ``torch.nn.Dropout``) of a model for fgplugin's, in place: the
#: model's own modules change class, weights and settings kept (see AdapterSwaps.convert);
#: ``convert(model, dropout=False)`` keeps torch's dropout.
convert = _swaps.convert
#: ``dgl.nn.GraphConv`` & co. become ours in every imported module; ``patch(dropout=True)``
#: also swaps ``torch.nn.Dropout``. The patched names then miss stock layers in ``isinstance``
#: (built before, unpickled, torch's own modules' dropout): test against the defining module's
#: class (``dgl.nn.pytorch.conv.graphconv.GraphConv``, ``torch.nn.modules.dropout.Dropout``).
patch = _swaps.patch
#: Undoes :func:`patch`.
unpatch = _swaps.unpatch

"""fgplugin for DGL: drop-in ``GraphConv``, ``SAGEConv`` (mean) and ``SGConv`` on fgplugin's SpMM,
``convert()`` and ``patch()``.

    import fgplugin.dgl
    fgplugin.dgl.patch()                  # dgl.nn.GraphConv & co. are ours from here
    model = fgplugin.dgl.convert(model)   # or: swap the layers of an existing model in place

DGL is imported through :func:`fgplugin.dgl.import_dgl`, which makes PyPI's DGL 2.1 importable
under torch > 2.2 (see _import_shim.py).
"""
from ._import_shim import import_dgl
from .convs import GraphConv, SAGEConv, SGConv, structure
from .patching import LAYERS, convert, patch, unpatch
from .transforms import BlockReorder

__all__ = ["GraphConv", "SAGEConv", "SGConv", "structure", "convert", "patch", "unpatch", "LAYERS", "import_dgl",
           "BlockReorder"]

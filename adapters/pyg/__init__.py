"""fgplugin for PyTorch Geometric: drop-in layers on fgplugin's SpMM, ``convert()`` and ``patch()``.

``fgplugin.pyg.GCNConv``, ``SAGEConv`` (mean aggregation), ``SGConv`` and ``LGConv`` subclass the
stock layers and replace only the aggregation: constructor, parameters, ``state_dict`` and
results stay those of PyG. They take the graph as ``edge_index`` (or PyG's ``EdgeIndex``), a
``torch.sparse`` or ``SparseTensor`` ``adj_t``, or a :class:`fgplugin.TiledAdjacency`.

    import fgplugin.pyg
    fgplugin.pyg.patch()                  # torch_geometric.nn.GCNConv & co. are ours from here
    model = fgplugin.pyg.convert(model)   # or: swap the layers of an existing model in place

The adjacency structure of a graph is built once per ``edge_index`` object and cached (see
_graph.py). ``torch.compile`` traces the layers without graph breaks for an ``edge_index`` (the
structure is built or found when the compiled graph runs: _deferred.py) and for a
``TiledAdjacency``.
"""
try:
    import torch_geometric  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("fgplugin.pyg needs PyTorch Geometric; install it with `pip install fgplugin[pyg]`") from err

from ._aggregation import gcn_scales
from .gcn_conv import GCNConv
from .lg_conv import LGConv
from .patching import LAYERS, convert, patch, unpatch
from .sage_conv import SAGEConv
from .sg_conv import SGConv
from .transforms import BlockReorder

__all__ = ["GCNConv", "SAGEConv", "SGConv", "LGConv", "gcn_scales", "convert", "patch", "unpatch", "LAYERS",
           "BlockReorder"]

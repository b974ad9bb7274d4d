"""``LGConv`` (LightGCN propagation) on fgplugin's SpMM."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from fgplugin.aggregation import aggregate
from fgplugin.eager import eager_in_old_dynamo

from ._aggregation import NONE, NormSpec
from ._layer import FgpluginLayer, make_aggregation


class LGConv(FgpluginLayer, pyg_conv.LGConv):
    r"""Drop-in :class:`torch_geometric.nn.LGConv` whose propagation runs on fgplugin's SpMM.

    Same constructor, ``forward(x, edge_index, edge_weight=None)`` and results (within float
    rounding) as the stock layer: symmetric normalization without added self loops when
    ``normalize=True``, plain (weighted) sums otherwise.
    """

    _stock = pyg_conv.LGConv
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    @eager_in_old_dynamo
    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        aggregation = self._served_aggregation(x, edge_index, edge_weight)
        if aggregation is None:
            return self._stock_forward(x, edge_index, edge_weight)
        return aggregate(aggregation, x, owner=self, node_dim=self.node_dim, fresh=True)  # the output itself

    def _aggregation(self, n: int, edge_index, edge_weight, dtype):
        norm = NormSpec("gcn", add_self_loops=False) if self.normalize else NONE
        return make_aggregation(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm, dtype)

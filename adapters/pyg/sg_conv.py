"""``SGConv`` whose K propagation steps run on fgplugin's SpMM."""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from fgplugin.aggregation import aggregate, cached_propagation
from fgplugin.eager import eager_in_old_dynamo

from ._aggregation import NormSpec
from ._layer import FgpluginLayer, linear, make_aggregation


class SGConv(FgpluginLayer, pyg_conv.SGConv):
    r"""Drop-in :class:`torch_geometric.nn.SGConv` whose K propagation steps run on fgplugin's SpMM.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, edge_weight=None)``
    and results (within float rounding) as the stock layer. With ``cached=True`` it caches the
    propagated features in ``_cached_x`` on the first call (``K >= 1``: with ``K = 0`` nothing is
    propagated, and nothing cached), as the stock layer does, and later calls use them (detached)
    whatever graph they pass. Without it, a linear map that narrows the
    features is applied first, so the K products run on fewer columns.
    """

    _stock = pyg_conv.SGConv
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    @eager_in_old_dynamo
    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        if self._cached_x is not None:  # as stock: the features propagated on the first call
            return self.lin(self._cached_x.detach())
        aggregation = self._served_aggregation(x, edge_index, edge_weight)
        if aggregation is None:
            return self._stock_forward(x, edge_index, edge_weight)
        plain = linear(self.lin)
        parts = None if self.cached else plain
        if parts is not None:
            return aggregate(aggregation, x, weight=parts[0], bias=parts[1], hops=self.K, owner=self,
                             node_dim=self.node_dim)
        with cached_propagation(self.cached, x.device.type):
            # a linear map of the user's (hooks, a wrapper) may write to its input in place: a copy
            x = aggregate(aggregation, x, hops=self.K, owner=self, node_dim=self.node_dim,
                          fresh=plain is None)
        if self.cached and self.K > 0:  # as stock, which caches inside its propagation loop
            self._cached_x = x
        return self.lin(x)

    def _aggregation(self, n: int, edge_index, edge_weight, dtype):
        norm = NormSpec("gcn", False, self.add_self_loops)
        return make_aggregation(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm, dtype)

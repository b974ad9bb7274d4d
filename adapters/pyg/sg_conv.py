"""``SGConv`` whose K propagation steps run on fgplugin's SpMM."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from ._graph import SPARSE_KINDS, graph_of, values_of
from ._layer import FgpluginLayer, Plan, aggregate, weighted
from .gcn_conv import gcn_scales


class SGConv(FgpluginLayer, pyg_conv.SGConv):
    r"""Drop-in :class:`torch_geometric.nn.SGConv` whose K propagation steps run on fgplugin's SpMM.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, edge_weight=None)``
    and results (within float rounding) as the stock layer. With ``cached=True`` it caches the
    propagated features in ``_cached_x`` on the first call, as the stock layer does, and later
    calls use them (detached) whatever graph they pass.
    """

    _stock = pyg_conv.SGConv
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        if self._cached_x is not None:  # as stock: the features propagated on the first call
            return self.lin(self._cached_x.detach())
        plan = self._served_plan(x, edge_index, edge_weight)
        if plan is None:
            return self._stock_forward(x, edge_index, edge_weight)
        for _ in range(self.K):
            x = aggregate(plan, x, self.node_dim)
            if self.cached:
                self._cached_x = x
        return self.lin(x)

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | None:
        graph = graph_of(edge_index, n, n, flip=self.flow == "target_to_source")
        if graph is None:
            return None
        values = values_of(edge_index) if graph.kind in SPARSE_KINDS else edge_weight
        adj = weighted(graph, values)
        return None if adj is None else Plan(adj, gcn_scales(graph, adj, values, False, self.add_self_loops))

"""``LGConv`` (LightGCN propagation) on fgplugin's SpMM."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from ._graph import SPARSE_KINDS, graph_of, values_of
from ._layer import NO_NORM, FgpluginLayer, Plan, aggregate, weighted


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

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        plan = self._served_plan(x, edge_index, edge_weight)
        if plan is None:
            return self._stock_forward(x, edge_index, edge_weight)
        return aggregate(plan, x, self.node_dim)

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | None:
        graph = graph_of(edge_index, n, n, flip=self.flow == "target_to_source")
        if graph is None:
            return None
        adj = weighted(graph, values_of(edge_index) if graph.kind in SPARSE_KINDS else edge_weight)
        if adj is None:
            return None
        return Plan(adj, adj.norm("gcn", add_self_loops=False) if self.normalize else NO_NORM)

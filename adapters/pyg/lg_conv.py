"""``LGConv`` (LightGCN propagation) on fgplugin's SpMM."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from ._deferred import DeferredPlan
from ._layer import FgpluginLayer, aggregate, make_plan
from ._plan import NONE, NormSpec, Plan


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

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | DeferredPlan | None:
        norm = NormSpec("gcn", add_self_loops=False) if self.normalize else NONE
        return make_plan(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm)

"""``SGConv`` whose K propagation steps run on fgplugin's SpMM."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor

from ._deferred import DeferredPlan
from ._layer import FgpluginLayer, aggregate, make_plan
from ._plan import NormSpec, Plan


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
        kept = self._kept_aggregation(plan, x, lambda: self._propagate(plan, x), extra=(self.K,))
        x = kept if kept is not None else self._propagate(plan, x)
        if self.cached:
            self._cached_x = x
        return self.lin(x)

    def _propagate(self, plan, x: Tensor) -> Tensor:
        for _ in range(self.K):
            x = aggregate(plan, x, self.node_dim)
        return x

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | DeferredPlan | None:
        norm = NormSpec("gcn", False, self.add_self_loops)
        return make_plan(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm)

"""``GCNConv`` on fgplugin's SpMM (its normalization, PyG's ``gcn_norm``, is ``gcn_scales`` in _aggregation.py)."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor, SparseTensor

from fgplugin import TiledAdjacency
from fgplugin.aggregation import Aggregation, aggregate

from ._aggregation import NONE, NormSpec
from ._deferred import DeferredAggregation
from ._layer import FgpluginLayer, is_ours, linear, make_aggregation


class GCNConv(FgpluginLayer, pyg_conv.GCNConv):
    r"""Drop-in :class:`torch_geometric.nn.GCNConv` whose propagation runs on fgplugin's SpMM.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, edge_weight=None)``
    and results (within float rounding) as the stock layer, which documents the arguments. The
    graph may also be a :class:`fgplugin.TiledAdjacency`. With ``cached=True`` the layer keeps its
    aggregation (adjacency and scales) in ``_cached_edge_index`` (``_cached_adj_t`` for a
    ``SparseTensor``) on the first call and, like the stock layer, ignores the graphs of later
    calls; a ``TiledAdjacency`` carries its own cache and is always used as given. The
    aggregation and its shortcuts are fgplugin.aggregation's. Hooks, explain mode and inputs
    fgplugin cannot serve run the stock code.
    """

    _stock = pyg_conv.GCNConv
    _graph_caches = ("_cached_edge_index", "_cached_adj_t")
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        out = self._as_decided(x, edge_index, edge_weight)
        if out is not None:  # a call like the previous one (fgplugin.layer_calls)
            return out
        aggregation = self._served_aggregation(x, edge_index, edge_weight)
        if aggregation is None:
            return self._stock_forward(x, edge_index, edge_weight)
        parts = linear(self.lin)
        if parts is None:  # a linear map with hooks (or not yet initialized): the module, then aggregate
            return aggregate(aggregation, self.lin(x), bias=self.bias, node_dim=self.node_dim)
        return self._aggregate_and_keep(aggregation, x, parts[0], edge_index, edge_weight)

    def _decision_values(self) -> tuple:
        return self.normalize, self.improved, self.add_self_loops, self.cached, self.flow, self.node_dim

    def _aggregation(self, n: int, edge_index, edge_weight, dtype) -> Aggregation | DeferredAggregation | None:
        cache_name = "_cached_adj_t" if isinstance(edge_index, SparseTensor) else "_cached_edge_index"
        cache = None if isinstance(edge_index, TiledAdjacency) or not self.normalize else getattr(self, cache_name)
        if cache is not None:  # the stock semantics: the graph given now is ignored
            if is_ours(cache):
                return cache
            return self._adopt_stock_cache(cache_name, n)
        norm = NormSpec("gcn", self.improved, self.add_self_loops) if self.normalize else NONE
        aggregation = make_aggregation(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm, dtype)
        if aggregation is not None and self.cached and self.normalize and not isinstance(edge_index, TiledAdjacency):
            setattr(self, cache_name, aggregation)
        return aggregation

"""``GCNConv`` on fgplugin's SpMM (its normalization, PyG's ``gcn_norm``, is ``gcn_scales`` in _aggregation.py)."""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor, SparseTensor

from fgplugin import TiledAdjacency, layer_calls
from fgplugin.aggregation import Aggregation, aggregate, aggregate_as_decided
from fgplugin.eager import eager_in_old_dynamo

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
    calls (unlike it, features with another number of nodes than the kept graph's are refused, with
    the way to reset the cache, where the stock layer aggregates over the kept graph regardless or
    fails inside its scatter); a ``TiledAdjacency`` carries its own cache and is always used as given. The
    aggregation and its shortcuts are fgplugin.aggregation's. Hooks, explain mode and inputs
    fgplugin cannot serve run the stock code.
    """

    _stock = pyg_conv.GCNConv
    _graph_caches = ("_cached_edge_index", "_cached_adj_t")
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    @eager_in_old_dynamo
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
        if torch.compiler.is_compiling():  # torch.compile traces the full path alone
            return aggregate(aggregation, x, weight=parts[0], bias=self.bias, owner=self, node_dim=self.node_dim)
        layer_calls.deciding(self)
        out = aggregate(aggregation, x, weight=parts[0], bias=self.bias, owner=self, node_dim=self.node_dim)
        weight, bias = self.lin.weight, self.bias
        layer_calls.keep(self, edge_index, edge_weight, self._decision_objects(self.lin, weight, bias),
                         self._decision_values(weight, bias, edge_index), x)
        return out

    def _as_decided(self, x, edge_index, edge_weight) -> Tensor | None:
        """The output of a call like this layer's previous served one, run as that one decided
        (fgplugin.layer_calls), or ``None``: then the full path runs."""
        if torch.compiler.is_compiling() or not self._fgplugin_serves():
            return None
        lin = self.lin  # each read through nn.Module's __getattr__ costs a microsecond: once
        if lin._forward_hooks or lin._forward_pre_hooks:
            return None
        weight, bias = lin.weight, self.bias
        decision = layer_calls.find(self, edge_index, edge_weight, self._decision_objects(lin, weight, bias),
                                    self._decision_values(weight, bias, edge_index), x)
        if decision is None:
            return None
        return aggregate_as_decided(decision, self, x, weight, bias)

    def _decision_objects(self, lin, weight, bias) -> tuple:
        """What the layer's decisions read, by identity: its linear map, weight, bias and graph caches."""
        return lin, weight, bias, self._cached_edge_index, self._cached_adj_t

    def _decision_values(self, weight, bias, edge_index) -> tuple:
        """The layer's plain settings and shapes that its decisions read, compared by equality (a
        write to ``weight.data`` may change the weight's shape, not the object; an ``EdgeIndex``'s
        ``sparse_resize_`` changes its size, not its version)."""
        return (self.normalize, self.improved, self.add_self_loops, self.cached, self.flow, self.node_dim,
                weight.shape, weight.dtype, None if bias is None else (bias.shape, bias.dtype, bias.requires_grad),
                edge_index.sparse_size() if isinstance(edge_index, EdgeIndex) else None)

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

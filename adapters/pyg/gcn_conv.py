"""``GCNConv`` on fgplugin's SpMM (its normalization, PyG's ``gcn_norm``, is ``gcn_scales`` in _plan.py)."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import Adj, OptTensor, SparseTensor

from fgplugin import TiledAdjacency
from fgplugin.ops import aggregate_padded_product, padded_width, transform_with_bias

from ._deferred import DeferredPlan
from ._layer import FgpluginLayer, aggregate, make_plan
from ._plan import NONE, NormSpec, Plan


class GCNConv(FgpluginLayer, pyg_conv.GCNConv):
    r"""Drop-in :class:`torch_geometric.nn.GCNConv` whose propagation runs on fgplugin's SpMM.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, edge_weight=None)``
    and results (within float rounding) as the stock layer, which documents the arguments. The
    graph may also be a :class:`fgplugin.TiledAdjacency`. With ``cached=True`` the layer keeps its
    fgplugin plan (adjacency and scales) in ``_cached_edge_index`` (``_cached_adj_t`` for a
    ``SparseTensor``) on the first call and, like the stock layer, ignores the graphs of later
    calls; a ``TiledAdjacency`` carries its own cache and is always used as given. An input that
    is the same unchanged tensor on every call and needs no gradient has its aggregation kept
    from the second call on (fgplugin.input_cache), and then only ``(A X) W`` is computed. Hooks,
    explain mode, ``decomposed_layers > 1`` and inputs fgplugin cannot serve run the stock code.
    """

    _stock = pyg_conv.GCNConv
    _plan_caches = ("_cached_edge_index", "_cached_adj_t")
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        plan = self._served_plan(x, edge_index, edge_weight)
        if plan is None:
            return self._stock_forward(x, edge_index, edge_weight)
        # A (X W) = (A X) W: a constant input's A X is kept and reused (fgplugin.input_cache);
        # else aggregate on the narrower side, as DGL's GraphConv does. When the input is the
        # narrower side this also skips the backward SpMM if x needs no gradient.
        kept = self._kept_aggregation(plan, x)
        if kept is not None:
            return self._transform_with_bias(kept)
        if x.layout == torch.strided and x.size(-1) < self.out_channels:
            return self._transform_with_bias(aggregate(plan, x, self.node_dim))
        return self._aggregate_transformed(plan, x)

    def _transform_with_bias(self, h: Tensor) -> Tensor:
        """``lin(h) + bias``, fused where the linear map is plain (fgplugin.ops.transform_with_bias)."""
        if self._plain_lin():
            return transform_with_bias(h, self.lin.weight.t(), self.bias)
        out = self.lin(h)
        return out if self.bias is None else out + self.bias

    def _plain_lin(self) -> bool:
        """Whether ``self.lin`` is a plain bias-free ``Linear``, whose product the layer may compute itself."""
        lin = self.lin
        return (type(lin) is Linear and lin.bias is None and not isinstance(lin.weight, UninitializedParameter)
                and not lin._forward_hooks and not lin._forward_pre_hooks)

    def _aggregate_transformed(self, plan, x: Tensor) -> Tensor:
        """``A (X W)``. Where the kernel wants wider rows than ``out_channels`` (C = 47 on
        CUDA: 48), ``W`` gets zero rows so that ``X W`` comes out that wide and the SpMM takes it
        as it is, instead of padding a copy and cutting its output back (products-like on an
        H100: those copies were 1.8 ms of a 32 ms training step, step_profile.json). The bias add
        cuts the extra columns (fgplugin.ops.aggregate_padded_product). Adds the bias."""
        width = padded_width(self.out_channels, x.dtype, x.device)
        if width == self.out_channels or x.layout != torch.strided or not self._plain_lin():
            out = aggregate(plan, self.lin(x), self.node_dim)
            return out if self.bias is None else out + self.bias
        return aggregate_padded_product(lambda h: aggregate(plan, h, self.node_dim), x, self.lin.weight.t(), width,
                                        self.bias)

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | DeferredPlan | None:
        cache_name = "_cached_adj_t" if isinstance(edge_index, SparseTensor) else "_cached_edge_index"
        cache = None if isinstance(edge_index, TiledAdjacency) or not self.normalize else getattr(self, cache_name)
        if cache is not None:  # the stock semantics: the graph given now is ignored
            return cache if isinstance(cache, (Plan, DeferredPlan)) else self._adopt_stock_cache(cache_name, n)
        norm = NormSpec("gcn", self.improved, self.add_self_loops) if self.normalize else NONE
        plan = make_plan(edge_index, edge_weight, n, n, self.flow == "target_to_source", norm)
        if plan is not None and self.cached and self.normalize and not isinstance(edge_index, TiledAdjacency):
            setattr(self, cache_name, plan)
        return plan

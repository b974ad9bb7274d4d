"""``GCNConv`` on fgplugin's SpMM, and ``gcn_scales``: PyG's ``gcn_norm`` as row/column scales."""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptTensor, SparseTensor

from fgplugin import Normalization, TiledAdjacency

from ._graph import SPARSE_KINDS, Graph, graph_of, values_of
from ._layer import NO_NORM, FgpluginLayer, Plan, aggregate, weighted


def gcn_scales(graph: Graph, adj: TiledAdjacency, values: Tensor | None, improved: bool = False,
               add_self_loops: bool = True) -> Normalization:
    r"""PyG's ``gcn_norm`` of ``graph`` as ``(row_scale, col_scale, diag)`` for ``fgplugin.spmm``.

    ``adj`` is ``graph.adj`` carrying ``values`` (given in the input's edge order). The stock
    ``gcn_norm`` treats a node's existing self loops differently for each input kind, and so does
    this function (``fill`` = 2 if ``improved`` else 1):

    - ``edge_index`` (``add_remaining_self_loops``): with weights, a node keeps the weight of its
      (last) self loop and other loops are dropped; without weights every node gets one loop of the
      weight the installed PyG gives unweighted graphs (see :func:`_probe_unweighted_fill`);
    - ``SparseTensor`` (``fill_diag``): every node's diagonal becomes ``fill``;
    - ``torch.sparse`` (``add_self_loops``): ``fill`` is added to every node's diagonal;
    - ``TiledAdjacency``: fgplugin's own ``"gcn"`` normalization (existing loops kept, ``fill``
      added where there is none).

    The diagonal term ``d`` turns A's own loop entries into that (``d = kept - loops``).
    Differentiable in ``values``, with the gradients of the stock code.
    """
    if not add_self_loops:
        return adj.norm("gcn", add_self_loops=False)
    fill = 2.0 if improved else 1.0
    if graph.kind == "edge_index" and values is None:
        fill = _UNWEIGHTED_FILL[improved]
    if graph.kind == "tiled" or graph.loops.numel() == 0:
        return adj.norm("gcn", improved=fill == 2.0)
    n = adj.shape[0]
    dtype = torch.float32 if values is None else values.dtype
    loop_values = torch.ones_like(graph.loops, dtype=dtype) if values is None else values[graph.loops]
    loops = torch.zeros(n, dtype=dtype, device=adj.device).index_add_(0, graph.loop_nodes, loop_values)
    if graph.kind == "torch.sparse":
        diag = torch.full((n,), fill, dtype=dtype, device=adj.device)
    elif graph.kind == "edge_index" and values is not None:
        last = torch.full((n,), -1, dtype=torch.long, device=adj.device)
        last = last.scatter_reduce(0, graph.loop_nodes, graph.loops, "amax")
        # Detached like PyG's index_put: every loop of a node gets the gradient of the kept one.
        diag = torch.where(last >= 0, (values[last.clamp(min=0)] - loops).detach(), fill)
    else:
        diag = fill - loops
    deg = adj.in_degree(weighted=True) + diag
    inv_sqrt = deg.rsqrt()
    inv_sqrt = inv_sqrt.masked_fill(inv_sqrt == float("inf"), 0.0)  # as PyG
    return Normalization(inv_sqrt, inv_sqrt, diag)


def _probe_unweighted_fill(improved: bool) -> float:
    """The self-loop weight the installed PyG's ``gcn_norm`` gives an unweighted ``edge_index``.

    PyG 2.8 adds those loops before it fills in unit weights, so ``improved`` changes nothing
    there (it does for weighted graphs); probing keeps fgplugin equal to whichever behaviour the
    installed release has. Two nodes, edge 0 -> 1: node 1's normalized loop weight is
    ``f / (1 + f)``, solved for ``f``.
    """
    _, weight = pyg_conv.gcn_conv.gcn_norm(torch.tensor([[0], [1]]), None, 2, improved, True)
    w = float(weight[-1])
    return round(w / (1.0 - w), 3)


# Probed once at import: torch.compile must not trace the probe.
_UNWEIGHTED_FILL = {improved: _probe_unweighted_fill(improved) for improved in (False, True)}


class GCNConv(FgpluginLayer, pyg_conv.GCNConv):
    r"""Drop-in :class:`torch_geometric.nn.GCNConv` whose propagation runs on fgplugin's SpMM.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, edge_weight=None)``
    and results (within float rounding) as the stock layer, which documents the arguments. The
    graph may also be a :class:`fgplugin.TiledAdjacency`. With ``cached=True`` the layer keeps its
    fgplugin plan (adjacency and scales) in ``_cached_edge_index`` (``_cached_adj_t`` for a
    ``SparseTensor``) on the first call and, like the stock layer, ignores the graphs of later
    calls; a ``TiledAdjacency`` carries its own cache and is always used as given. Hooks,
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
        # A (X W) = (A X) W: aggregate on the narrower side, as DGL's GraphConv does. When the
        # input is the narrower side this also skips the backward SpMM if x needs no gradient.
        if x.layout == torch.strided and x.size(-1) < self.out_channels:
            out = self.lin(aggregate(plan, x, self.node_dim))
        else:
            out = aggregate(plan, self.lin(x), self.node_dim)
        if self.bias is not None:
            out = out + self.bias
        return out

    def _plan(self, n: int, edge_index, edge_weight) -> Plan | None:
        cache_name = "_cached_adj_t" if isinstance(edge_index, SparseTensor) else "_cached_edge_index"
        cache = None if isinstance(edge_index, TiledAdjacency) or not self.normalize else getattr(self, cache_name)
        if cache is not None:  # the stock semantics: the graph given now is ignored
            return cache if isinstance(cache, Plan) else self._adopt_stock_cache(cache_name, n)
        graph = graph_of(edge_index, n, n, flip=self.flow == "target_to_source")
        if graph is None:
            return None
        values = values_of(edge_index) if graph.kind in SPARSE_KINDS else edge_weight
        adj = weighted(graph, values)
        if adj is None:
            return None
        if not self.normalize:
            return Plan(adj, NO_NORM)
        plan = Plan(adj, gcn_scales(graph, adj, values, self.improved, self.add_self_loops))
        if self.cached and graph.kind != "tiled":
            setattr(self, cache_name, plan)
        return plan

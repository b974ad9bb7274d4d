"""A layer's :class:`fgplugin.aggregation.Aggregation`: its graph's adjacency (weighted) and the
scales of its normalization.

``aggregation_of(graph, values, norm)`` is what every drop-in layer aggregates with, both on the
eager path and inside the ``torch.compile`` op of _deferred.py, so the two cannot drift apart.
``gcn_scales`` is PyG's ``gcn_norm`` expressed as row/column scales and a diagonal term.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch_geometric.nn import conv as pyg_conv

from fgplugin import Normalization, TiledAdjacency
from fgplugin.normalization import scales_of_degrees
from fgplugin._csr import rows_of_edges
from fgplugin.aggregation import NO_NORM, Aggregation

from ._graph import Graph


class NormSpec(NamedTuple):
    """Which normalization a layer applies: ``kind`` is ``"none"``, ``"gcn"`` (PyG's
    ``gcn_norm`` with ``improved`` / ``add_self_loops``) or ``"mean"`` (neighbourhood mean)."""

    kind: str
    improved: bool = False
    add_self_loops: bool = True


NONE = NormSpec("none")
MEAN = NormSpec("mean")


def weighted(graph: Graph, values: Tensor | None) -> TiledAdjacency | None:
    """``graph``'s adjacency with per-edge ``values`` (in the input's edge order), or ``None``
    where fgplugin refuses them (e.g. NaN weights), so that the stock layer decides. A
    ``TiledAdjacency`` input gets the refusal's error instead: the stock layer cannot read it."""
    if values is None:
        return graph.adj
    try:
        return graph.adj.with_values(values)
    except (ValueError, TypeError) as refusal:
        if graph.kind != "tiled":
            return None
        if graph.adj.values is None or not graph.adj._edge_order_dropped:
            raise
        raise type(refusal)(f"{refusal}. This TiledAdjacency already carries edge weights (BlockReorder builds "
                            "data.adj_t with data.edge_weight): pass it without edge_weight") from refusal


def aggregation_of(graph: Graph, values: Tensor | None, norm: NormSpec, values_source=None,
                   dtype: torch.dtype = torch.float32) -> Aggregation | None:
    """The aggregation of ``graph`` with edge ``values`` (input edge order) under ``norm``, its
    scales in ``dtype`` (float64 for float64 features); ``None`` where fgplugin refuses the values.
    ``values_source``: the object the values were read from when each read gives a new tensor (a
    ``torch.sparse`` input's ``values()``); it stands for them in the key (its version counter
    counts writes to its values)."""
    adj = weighted(graph, values)
    if adj is None:
        return None
    if graph.kind == "tiled" and values is None:  # its own weights: a write to them changes the key
        values_source = graph.adj.values
    key = (graph.adj, values if values_source is None else values_source, norm, dtype)
    if norm.kind == "gcn":
        return Aggregation(adj, gcn_scales(graph, adj, values, norm.improved, norm.add_self_loops, dtype), key)
    if norm.kind == "mean":
        return Aggregation(adj, adj.norm("mean", dtype=dtype), key)
    if norm.kind == "none":
        return Aggregation(adj, NO_NORM, key)
    raise ValueError(f"unknown normalization {norm.kind!r}; expected 'none', 'gcn' or 'mean'")


def gcn_scales(graph: Graph, adj: TiledAdjacency, values: Tensor | None, improved: bool = False,
               add_self_loops: bool = True, dtype: torch.dtype = torch.float32) -> Normalization:
    r"""PyG's ``gcn_norm`` of ``graph`` as ``(row_scale, col_scale, diag)`` for ``fgplugin.spmm``, in
    ``dtype`` (degrees summed in float64).

    ``adj`` is ``graph.adj`` carrying ``values`` (given in the input's edge order). The stock
    ``gcn_norm`` treats a node's existing self loops differently for each input kind, and so does
    this function (``fill`` = 2 if ``improved`` else 1):

    - ``edge_index`` (``add_remaining_self_loops``): with weights, a node keeps the weight of its
      (last) self loop and other loops are dropped; without weights every node gets one loop of the
      weight the installed PyG gives unweighted graphs (see :func:`_probe_unweighted_fill`: PyG 2.8
      ignores ``improved`` there);
    - ``SparseTensor`` (``fill_diag``): every node's diagonal becomes ``fill``;
    - ``torch.sparse`` (``add_self_loops``): ``fill`` is added to every node's diagonal;
    - ``TiledAdjacency``: as ``edge_index``, since it holds an edge list (its own weights, in CSR
      order), so ``model(x, data.adj_t)`` equals ``model(x, data.edge_index)``.

    The diagonal term ``d`` turns A's own loop entries into that (``d = kept - loops``).
    Differentiable in ``values``, with the gradients of the stock code.
    """
    if not add_self_loops:
        return adj.norm("gcn", add_self_loops=False, dtype=dtype)
    if graph.kind == "tiled":
        values = adj.values  # in CSR order, like the loop positions (_node_loops)
    cacheable = values is None or not values.requires_grad  # then they depend on the adjacency alone
    key = ("pyg_gcn_scales", graph.kind, improved, dtype)
    kept = adj._kept_for_values(key) if cacheable else None  # rebuilt after an in-place write to the values
    if kept is not None:
        return kept
    fill = 2.0 if improved else 1.0
    if graph.kind in ("edge_index", "tiled") and values is None:
        fill = _UNWEIGHTED_FILL[improved]
    n, work = adj.shape[0], torch.float64
    loops, last = _node_loops(graph, adj, values, work)
    if graph.kind == "torch.sparse":
        diag = torch.full((n,), fill, dtype=work, device=adj.device)
    elif graph.kind in ("edge_index", "tiled") and values is not None:
        # Detached like PyG's index_put: every loop of a node gets the gradient of the kept one.
        kept = values[last.clamp(min=0)].to(work) if values.numel() else torch.zeros(n, dtype=work, device=adj.device)
        diag = torch.where(last >= 0, (kept - loops).detach(), fill)
    else:
        diag = fill - loops
    scales = scales_of_degrees("gcn", adj.in_degree(weighted=True, dtype=work), diag=diag, dtype=dtype)
    if cacheable:
        adj._keep_for_values(key, scales)
    return scales


def _node_loops(graph: Graph, adj: TiledAdjacency, values: Tensor | None, dtype: torch.dtype):
    """Per node: the summed weight of its self loops, and the position (in ``values``' order) of
    its last one, -1 without. An ``edge_index`` lists its loops when its graph is built; a
    ``TiledAdjacency``'s are found with static shapes (no ``nonzero``), so ``torch.compile``
    traces them without a graph break."""
    n = adj.shape[0]
    if graph.kind == "tiled":
        rows = rows_of_edges(adj.rowptr, adj.nnz)
        is_loop = rows == adj.col.long()
        weight = is_loop.to(dtype) if values is None else is_loop * values.to(dtype)
        positions = torch.where(is_loop, torch.arange(adj.nnz, device=adj.device), -1)
        nodes = rows
    else:
        positions, nodes = graph.loops, graph.loop_nodes
        weight = torch.ones_like(positions, dtype=dtype) if values is None else values[positions].to(dtype)
    loops = torch.zeros(n, dtype=dtype, device=adj.device).index_add_(0, nodes, weight)
    last = torch.full((n,), -1, dtype=torch.long, device=adj.device).scatter_reduce(0, nodes, positions, "amax")
    return loops, last


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

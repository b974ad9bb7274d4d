"""DGL's ``GraphConv``, ``SAGEConv`` (mean) and ``SGConv`` with their aggregation on fgplugin's SpMM.

Each subclasses the stock layer and overrides only ``forward``: constructor, parameters,
``state_dict``, errors and results (within float rounding) stay DGL's. Where fgplugin cannot
serve a call (a graph with several edge types, features on another device, an aggregator other
than mean) the stock code runs. The structure of a graph is built once and kept on DGL's graph
index (``graph._graph``), which ``local_scope()`` shares and any structural change replaces.
An input that is the same unchanged tensor on every call and needs no gradient has its
aggregation kept from the second call on (fgplugin.input_cache): then only the dense products run.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

import fgplugin
from fgplugin import TiledAdjacency, input_cache
from fgplugin.ops import aggregate_padded_product, padded_width, transform_with_bias

from ._import_shim import import_dgl

import_dgl()  # through the shim, before anything below imports DGL
from dgl.nn.pytorch import conv as dgl_conv  # noqa: E402
from dgl.utils import expand_as_pair  # noqa: E402


class Structure(NamedTuple):
    """A graph's adjacency (rows = destination nodes, edges in edge-ID order, unit weights) and
    whether some destination node has no in-edge (DGL's zero-in-degree check, without a sync)."""

    adj: TiledAdjacency
    zero_in_degree: bool


def structure(graph) -> Structure | None:
    """The cached :class:`Structure` of a DGL graph or block with one edge type, else ``None``."""
    if len(graph.canonical_etypes) != 1:
        return None
    cached = getattr(graph._graph, "_fgplugin_structure", None)
    return cached if cached is not None else _build_structure(graph)


# DGL's graph API goes through its C library, which torch.compile cannot trace: a graph first seen
# inside a compiled region is built here behind one graph break, and read without one afterwards.
@torch.compiler.disable
def _build_structure(graph) -> Structure:
    src, dst = graph.edges(order="eid")
    adj = TiledAdjacency.from_edge_index(torch.stack([src, dst]), size=(graph.num_src_nodes(), graph.num_dst_nodes()))
    built = Structure(adj, bool((adj.in_degree() == 0).any()))
    graph._graph._fgplugin_structure = built
    return built


def _spmm(adj: TiledAdjacency, x: Tensor, row_scale=None, col_scale=None) -> Tensor:
    """``spmm`` over the first dimension of an ``(N, *, F)`` feature tensor."""
    out = fgplugin.spmm(adj, x.reshape(x.shape[0], -1), row_scale, col_scale)
    return out.view(out.shape[0], *x.shape[1:])


def _aggregate_transformed(adj: TiledAdjacency, x: Tensor, weight: Tensor, row_scale, col_scale, bias) -> Tensor:
    """``A (X W) + bias``. Where the kernel wants wider rows than W's columns (47 on CUDA: 48),
    ``W`` gets zero columns so that ``X W`` comes out that wide and the SpMM takes it as it is,
    instead of padding a copy and cutting its output back (see ``fgplugin.ops.padded_width``);
    the bias add cuts the extra columns (``fgplugin.ops.aggregate_padded_product``)."""
    return aggregate_padded_product(lambda h: _spmm(adj, h, row_scale, col_scale), x, weight,
                                    padded_width(weight.shape[1], x.dtype, x.device), bias)


def _served(graph, feat_src: Tensor, edge_weight) -> Structure | None:
    """The graph's structure, carrying ``edge_weight``, when fgplugin can run this call; else
    ``None``, and the stock code runs (with its errors)."""
    found = structure(graph)
    if found is None or not isinstance(feat_src, Tensor) or feat_src.device != found.adj.device:
        return None
    if feat_src.dim() < 2 or feat_src.shape[0] != found.adj.shape[1]:
        return None
    if edge_weight is None:
        return found
    if edge_weight.dim() != 1 or edge_weight.shape[0] != found.adj.nnz:
        return None
    try:
        return found._replace(adj=found.adj.with_values(edge_weight))
    except (ValueError, TypeError):  # e.g. NaN weights, which fgplugin refuses and DGL propagates
        return None


def _kept(layer, graph, feat_src: Tensor, edge_weight, found: Structure, compute, *settings) -> Tensor | None:
    """``compute()``, the aggregation of ``feat_src``, kept from an earlier call when it is a
    constant input over the same graph and edge weights (fgplugin.input_cache), else ``None``.
    ``settings``: the layer's options that ``compute`` depends on."""
    deps = (structure(graph).adj, edge_weight, type(layer).__name__, *settings)
    nbytes = feat_src.numel() // max(feat_src.shape[0], 1) * found.adj.shape[0] * feat_src.element_size()
    return input_cache.of(layer).get(feat_src, deps, nbytes, compute)


class GraphConv(dgl_conv.GraphConv):
    r"""Drop-in :class:`dgl.nn.GraphConv` whose aggregation runs on fgplugin's SpMM.

    Same constructor (``norm`` in both/right/left/none, ``weight``, ``bias``, ``activation``,
    ``allow_zero_in_degree``), ``forward(graph, feat, weight=None, edge_weight=None)``, errors
    (``DGLError`` on zero-in-degree nodes, on an external weight next to the module's own) and
    results as the stock layer. Degrees are edge counts, as in DGL (edge weights scale messages
    only); ``norm="both"`` uses source out-degrees and destination in-degrees, no self loops.
    """

    def forward(self, graph, feat, weight=None, edge_weight=None):
        feat_src, feat_dst = expand_as_pair(feat, graph)
        found = _served(graph, feat_src, edge_weight)
        if found is None or (found.zero_in_degree and not self._allow_zero_in_degree) \
                or (weight is not None and self.weight is not None):
            return super().forward(graph, feat, weight=weight, edge_weight=edge_weight)
        adj = found.adj
        row_scale, col_scale, _ = adj.norm(self._norm)
        weight = self.weight if weight is None else weight
        kept = None if weight is None else _kept(self, graph, feat_src, edge_weight, found,
                                                 lambda: _spmm(adj, feat_src, row_scale, col_scale), self._norm)
        if kept is not None:  # a constant input's A X, kept: (A X) W = A (X W)
            rst = transform_with_bias(kept, weight, self.bias)
        elif weight is not None and self._in_feats > self._out_feats:  # W first: aggregate fewer columns
            rst = _aggregate_transformed(adj, feat_src, weight, row_scale, col_scale, self.bias)
        elif weight is not None:
            rst = transform_with_bias(_spmm(adj, feat_src, row_scale, col_scale), weight, self.bias)
        else:
            rst = _spmm(adj, feat_src, row_scale, col_scale)
            rst = rst if self.bias is None else rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst


class SAGEConv(dgl_conv.SAGEConv):
    r"""Drop-in :class:`dgl.nn.SAGEConv`; ``aggregator_type="mean"`` runs on fgplugin's SpMM, the
    other aggregators (gcn, pool, lstm) keep the stock code. Same constructor, parameters,
    ``forward(graph, feat, edge_weight=None)`` and results as the stock layer."""

    def forward(self, graph, feat, edge_weight=None):
        feat_src = feat[0] if isinstance(feat, tuple) else feat
        found = _served(graph, feat_src, edge_weight) if self._aggre_type == "mean" else None
        if found is None:
            return super().forward(graph, feat, edge_weight=edge_weight)
        if isinstance(feat, tuple):
            feat_src, feat_dst = self.feat_drop(feat[0]), self.feat_drop(feat[1])
        else:
            feat_src = feat_dst = self.feat_drop(feat)
            if graph.is_block:
                feat_dst = feat_src[: graph.number_of_dst_nodes()]
        adj = found.adj
        row_scale = adj.norm("mean").row_scale
        kept = _kept(self, graph, feat_src, edge_weight, found, lambda: _spmm(adj, feat_src, row_scale))
        if kept is not None:  # a constant input's neighbour mean, kept
            h_neigh = self.fc_neigh(kept)
        elif self._in_src_feats > self._out_feats:  # A (X W): aggregate fewer columns
            h_neigh = _spmm(adj, self.fc_neigh(feat_src), row_scale)
        else:
            h_neigh = self.fc_neigh(_spmm(adj, feat_src, row_scale))
        rst = self.fc_self(feat_dst) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst


class SGConv(dgl_conv.SGConv):
    r"""Drop-in :class:`dgl.nn.SGConv` whose k propagation steps run on fgplugin's SpMM.

    Same constructor, ``forward(graph, feat, edge_weight=None)``, errors and results as the stock
    layer: without edge weights both sides are scaled by in-degree^-1/2 (DGL's choice); with them,
    the weights are normalized as by ``EdgeWeightNorm("both")`` (weighted degrees). With
    ``cached=True`` the propagated features are kept on the first call, as in DGL.
    """

    def forward(self, graph, feat, edge_weight=None):
        found = _served(graph, feat, edge_weight) if self._cached_h is None else None
        if found is None or (found.zero_in_degree and not self._allow_zero_in_degree) \
                or (edge_weight is not None and bool((edge_weight <= 0).any())):
            return super().forward(graph, feat, edge_weight=edge_weight)
        adj = found.adj
        if edge_weight is None:
            row_scale = col_scale = adj.in_degree().to(feat).clamp(min=1).rsqrt()
        else:
            row_scale, col_scale = _positive_rsqrt(adj.in_degree(weighted=True)), _positive_rsqrt(
                adj.out_degree(weighted=True))
        def propagate(h=feat):
            for _ in range(self._k):
                h = _spmm(adj, h, row_scale, col_scale)
            return h

        kept = _kept(self, graph, feat, edge_weight, found, propagate, self._k)
        feat = kept if kept is not None else propagate()
        if self.norm is not None:
            feat = self.norm(feat)
        if self._cached:
            self._cached_h = feat
        return self.fc(feat)


def _positive_rsqrt(deg: Tensor) -> Tensor:
    # A node without weighted edges has degree 0; DGL never uses its (infinite) scale.
    return torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))

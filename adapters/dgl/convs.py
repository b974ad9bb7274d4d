"""DGL's ``GraphConv``, ``SAGEConv`` (mean) and ``SGConv`` with their aggregation on fgplugin's SpMM.

Each subclasses the stock layer and overrides only ``forward``, which hands the aggregation to
fgplugin.aggregation (with its shortcuts): constructor, parameters, ``state_dict``, errors and
results (within float rounding) stay DGL's. Where fgplugin cannot serve a call (a graph with
several edge types, features on another device, an aggregator other than mean) the stock code
runs. The structure of a graph is built once and kept on DGL's graph index (``graph._graph``),
which ``local_scope()`` shares and any structural change replaces.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from fgplugin import Normalization, TiledAdjacency, input_cache
from fgplugin._csr import aux_dtype_for, rows_of_edges
from fgplugin.aggregation import Aggregation, aggregate, cached_propagation, is_distributed, linear_parts, transform
from fgplugin.eager import eager_in_old_dynamo
from fgplugin.inference_mode import outside_inference_mode

from ._import_shim import import_dgl

import_dgl()  # through the shim, before anything below imports DGL
from dgl.nn.pytorch import conv as dgl_conv  # noqa: E402
from dgl.base import DGLError  # noqa: E402
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
@outside_inference_mode
def _build_structure(graph) -> Structure:
    src, dst = edges_by_id(graph)
    adj = TiledAdjacency.from_edge_index(torch.stack([src, dst]), size=(graph.num_src_nodes(), graph.num_dst_nodes()))
    built = Structure(adj, bool((adj.in_degree() == 0).any()))
    graph._graph._fgplugin_structure = built
    return built


def edges_by_id(graph) -> tuple[Tensor, Tensor]:
    """``(src, dst)`` of every edge in edge-id order, whichever sparse formats the graph allows:
    ``graph.edges(order="eid")`` needs COO, which a graph restricted by ``graph.formats("csc")``
    (DGL's memory-saving option) or ``"csr"`` does not have."""
    allowed = {f for formats in graph.formats().values() for f in formats}
    if "coo" in allowed:
        return graph.edges(order="eid")
    fmt = "csc" if "csc" in allowed else "csr"
    indptr, indices, eids = graph.adj_tensors(fmt)  # CSC: rows are destinations, CSR: sources
    rows = rows_of_edges(indptr, indices.numel()).to(indices.dtype)
    by_row = (indices, rows) if fmt == "csc" else (rows, indices)
    src, dst = torch.empty_like(indices), torch.empty_like(indices)
    src[eids.long()], dst[eids.long()] = by_row
    return src, dst


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


def _aggregation(graph, found: Structure, edge_weight, layer: str, row_scale=None, col_scale=None) -> Aggregation:
    """The aggregation of ``found`` with the given scales, keyed by the graph's structure, the edge
    weights and the layer kind (what the scales are computed from)."""
    return Aggregation(found.adj, Normalization(row_scale, col_scale, None), (structure(graph).adj, edge_weight, layer))


def _is_sharded(graph) -> bool:
    return is_distributed(graph, "sharded_data", "ShardedAdjacency")


def _sharded_graph(layer, adj, kind: str, feat, edge_weight, allow_zero_in_degree: bool):
    """The sharded graph of a ``fgplugin.distributed.ShardedAdjacency`` (:func:`shard_dgl`) under
    ``kind``, with DGL's loop rule (the edges as they are) and its zero-in-degree check."""
    if isinstance(feat, Tensor):
        adj.check_call(layer, feat)  # first: every rank learns here whether some rank's features do not fit
    if edge_weight is not None:
        raise ValueError("a sharded graph (fgplugin.distributed.shard_dgl) takes no edge weights: its normalization "
                         "comes from the edge counts; drop edge_weight or train in one process")
    if not isinstance(feat, Tensor) or feat.dim() != 2 or feat.shape[0] != adj.num_rows:
        raise ValueError(f"on a sharded graph the features are this rank's {adj.num_rows} rows, one tensor "
                         f"(shard_dgl's ndata), got {type(feat).__name__} of shape {tuple(getattr(feat, 'shape', ()))}")
    if feat.device != adj.ctx.device:
        raise ValueError(f"the features are on {feat.device} but this rank's shard of the graph is on {adj.ctx.device}; "
                         f"pass shard_dgl's ndata (or move the features there)")
    if not allow_zero_in_degree and adj.zero_in_degree:
        raise DGLError("There are 0-in-degree nodes in the graph, output for those nodes will be invalid. Add self "
                       "loops before shard_dgl (dgl.add_self_loop) or pass allow_zero_in_degree=True to the layer.")
    return adj.graph(kind, add_self_loops=False, replace_loops=False, scale_dtype=aux_dtype_for(feat.dtype))


class _Named:
    """Mixin: ``print(model)`` names the fgplugin layer."""

    def _get_name(self) -> str:
        return f"fgplugin.dgl.{type(self).__name__}"


class GraphConv(_Named, dgl_conv.GraphConv):
    r"""Drop-in :class:`dgl.nn.GraphConv` whose aggregation runs on fgplugin's SpMM.

    Same constructor (``norm`` in both/right/left/none, ``weight``, ``bias``, ``activation``,
    ``allow_zero_in_degree``), ``forward(graph, feat, weight=None, edge_weight=None)``, errors
    (``DGLError`` on zero-in-degree nodes, on an external weight next to the module's own) and
    results as the stock layer. Degrees are edge counts, as in DGL (edge weights scale messages
    only); ``norm="both"`` uses source out-degrees and destination in-degrees, no self loops.
    """

    @eager_in_old_dynamo
    @outside_inference_mode
    def forward(self, graph, feat, weight=None, edge_weight=None):
        if _is_sharded(graph):
            if weight is not None and self.weight is not None:
                raise DGLError("External weight is provided while at the same time the module has defined its own "
                               "weight parameter. Please create the module with flag weight=False.")
            kind = {"both": "both", "right": "mean", "left": "left", "none": "none"}[self._norm]
            aggregation = _sharded_graph(self, graph, kind, feat, edge_weight, self._allow_zero_in_degree)
            feat_src = feat
        else:
            feat_src, _ = expand_as_pair(feat, graph)
            found = _served(graph, feat_src, edge_weight)
            if found is None or (found.zero_in_degree and not self._allow_zero_in_degree) \
                    or (weight is not None and self.weight is not None):
                return super().forward(graph, feat, weight=weight, edge_weight=edge_weight)
            row_scale, col_scale, _ = found.adj.norm(self._norm, dtype=aux_dtype_for(feat_src.dtype))
            aggregation = _aggregation(graph, found, edge_weight, f"GraphConv-{self._norm}", row_scale, col_scale)
        rst = aggregate(aggregation, feat_src, weight=self.weight if weight is None else weight, bias=self.bias,
                        owner=self, fresh=True)  # the output itself, or the activation's input
        return rst if self._activation is None else self._activation(rst)


class SAGEConv(_Named, dgl_conv.SAGEConv):
    r"""Drop-in :class:`dgl.nn.SAGEConv`; ``aggregator_type="mean"`` runs on fgplugin's SpMM, the
    other aggregators (gcn, pool, lstm) keep the stock code. Same constructor, parameters,
    ``forward(graph, feat, edge_weight=None)`` and results as the stock layer."""

    @eager_in_old_dynamo
    @outside_inference_mode
    def forward(self, graph, feat, edge_weight=None):
        if _is_sharded(graph):
            if self._aggre_type != "mean":
                raise ValueError(f"SAGEConv(aggregator_type={self._aggre_type!r}) cannot run on a sharded graph: only "
                                 "the mean aggregation is sharded")
            aggregation = _sharded_graph(self, graph, "mean", feat, edge_weight, allow_zero_in_degree=True)
            feat_src = feat_dst = self.feat_drop(feat)
        else:
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
            scale = found.adj.norm("mean", dtype=aux_dtype_for(feat_src.dtype)).row_scale
            aggregation = _aggregation(graph, found, edge_weight, "SAGEConv-mean", scale)
        parts = linear_parts(self.fc_neigh)
        if parts is None and self._in_src_feats > self._out_feats:
            # the user's map (hooks, a module of theirs) where stock applies it: before the mean,
            # where it narrows the features (its output changes every step: nothing to keep, and
            # what earlier calls kept is let go of)
            input_cache.of(self).clear()
            h_neigh = aggregate(aggregation, self.fc_neigh(feat_src))
        elif parts is None:  # after the mean; it may write to its input in place: a copy of a kept one
            h_neigh = self.fc_neigh(aggregate(aggregation, feat_src, owner=self, fresh=True))
        else:
            h_neigh = aggregate(aggregation, feat_src, weight=parts[0], bias=parts[1], owner=self)
        root = linear_parts(self.fc_self)
        rst = (self.fc_self(feat_dst) if root is None else transform(feat_dst, *root, owner=self)) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst


class SGConv(_Named, dgl_conv.SGConv):
    r"""Drop-in :class:`dgl.nn.SGConv` whose k propagation steps run on fgplugin's SpMM.

    Same constructor, ``forward(graph, feat, edge_weight=None)``, errors and results as the stock
    layer: without edge weights both sides are scaled by in-degree^-1/2 (DGL's choice); with them,
    the weights are normalized as by ``EdgeWeightNorm("both")`` (weighted degrees). With
    ``cached=True`` the propagated features are kept on the first call, as in DGL.
    """

    @eager_in_old_dynamo
    @outside_inference_mode
    def forward(self, graph, feat, edge_weight=None):
        if _is_sharded(graph):
            if self._cached_h is not None:
                return self.fc(self._cached_h)
            # DGL's SGConv scales both sides by the in-degree^-1/2: gcn without self loops, which
            # differs (zero, not one) at a source without in-edges, so those are refused here
            if graph.zero_in_degree:
                raise ValueError("SGConv on a sharded graph needs an in-edge at every node: add self loops "
                                 "(dgl.add_self_loop) before shard_dgl")
            aggregation = _sharded_graph(self, graph, "gcn", feat, edge_weight, allow_zero_in_degree=True)
        else:
            found = _served(graph, feat, edge_weight) if self._cached_h is None else None
            if found is None or (found.zero_in_degree and not self._allow_zero_in_degree) \
                    or (edge_weight is not None and bool((edge_weight <= 0).any())):
                return super().forward(graph, feat, edge_weight=edge_weight)
            adj, dtype = found.adj, aux_dtype_for(feat.dtype)
            if edge_weight is None:
                row_scale = col_scale = adj.in_degree(dtype=torch.float64).clamp(min=1).rsqrt().to(dtype)
            else:
                row_scale = _positive_rsqrt(adj.in_degree(weighted=True, dtype=torch.float64)).to(dtype)
                col_scale = _positive_rsqrt(adj.out_degree(weighted=True, dtype=torch.float64)).to(dtype)
            aggregation = _aggregation(graph, found, edge_weight, "SGConv", row_scale, col_scale)
        with cached_propagation(self._cached, feat.device.type):
            # the user's norm, or an fc with hooks or of the user's making, may write to it in place: a copy
            feat = aggregate(aggregation, feat, hops=self._k, owner=self,
                             fresh=self.norm is not None or linear_parts(self.fc) is None)
        if self.norm is not None:
            feat = self.norm(feat)
        if self._cached:
            self._cached_h = feat
        return self.fc(feat)


def _positive_rsqrt(deg: Tensor) -> Tensor:
    # A node without weighted edges has degree 0; DGL never uses its (infinite) scale.
    return torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))

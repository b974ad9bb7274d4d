"""What the fgplugin PyG layers share: the aggregation of their graph input, and the rules for
handing a call to the stock code (hooks, explain mode, TorchScript)."""
from __future__ import annotations

import copy

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear

from fgplugin import TiledAdjacency
from fgplugin._csr import aux_dtype_for, rows_of_edges
from fgplugin.aggregation import Aggregation, is_distributed, linear_parts
from fgplugin.inference_mode import outside_inference_mode

from ._aggregation import _UNWEIGHTED_FILL, NONE, NormSpec, aggregation_of
from ._deferred import DeferredAggregation
from ._graph import SPARSE_KINDS, graph_of, input_kind, values_of

# MessagePassing hooks run inside the stock propagate(); a layer with any of them registered
# keeps the stock path so that they see their messages.
_HOOKS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks",
    "_message_forward_pre_hooks", "_message_forward_hooks",
    "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
)
# The linear maps fgplugin.aggregation may apply itself (x W^T + b).
LINEAR_KINDS = (Linear, torch.nn.Linear)


def make_aggregation(source, edge_weight: Tensor | None, n_src: int, n_dst: int, flip: bool, norm: NormSpec,
                     dtype: torch.dtype, values_from: tuple[str, ...] = SPARSE_KINDS
                     ) -> Aggregation | DeferredAggregation | None:
    """The aggregation of a layer's graph input ``source``, or ``None`` where the stock code must
    run.

    The edge values are those of a sparse input whose kind is in ``values_from``, else
    ``edge_weight``; the scales are in ``dtype``, the accumulation dtype of the features. Under ``torch.compile`` an ``edge_index`` gives a
    :class:`DeferredAggregation` (built when the compiled graph runs; see _deferred.py), so
    tracing never breaks on it.
    """
    sharded = _sharded_graph(source, edge_weight, norm, dtype, flip)
    if sharded is not None:
        return sharded
    if isinstance(source, EdgeIndex) and not _sizes_agree(source, n_src, n_dst, flip):
        return None  # the stock code does what it does with such sizes (mostly: raises)
    if torch.compiler.is_compiling() and input_kind(source) == "edge_index":
        return DeferredAggregation(source, edge_weight, n_src, n_dst, flip, norm)
    graph = graph_of(source, n_src, n_dst, flip)
    if graph is None:
        return None
    if graph.kind not in values_from:
        return aggregation_of(graph, edge_weight, norm, dtype=dtype)
    return aggregation_of(graph, values_of(source), norm, source if graph.kind == "torch.sparse" else None, dtype)


def check_sharded_call(layer, source, x: Tensor, node_dim: int) -> None:
    """Before a layer asks a ``fgplugin.distributed.ShardedAdjacency`` for a graph: its first
    call with such features checks that every rank calls it alike (``check_call``)."""
    if is_distributed(source, "sharded_data", "ShardedAdjacency"):
        source.check_call(layer, x, node_dim)


def _sharded_graph(source, edge_weight: Tensor | None, norm: NormSpec, dtype: torch.dtype, flip: bool = False):
    """The sharded graph of a ``fgplugin.distributed.ShardedAdjacency`` under ``norm`` with scales
    in ``dtype``, or ``None`` for any other graph input."""
    if not is_distributed(source, "sharded_data", "ShardedAdjacency"):
        return None
    if edge_weight is not None:
        raise ValueError("a sharded graph (fgplugin.distributed.shard) takes no edge weights: its normalization "
                         "comes from the edge counts; drop edge_weight or train in one process")
    if flip:
        raise ValueError("a sharded graph aggregates along its edges (flow='source_to_target'); for "
                         "flow='target_to_source' shard the graph with edge_index.flip(0) and use the default flow")
    # Unweighted, the installed PyG may ignore `improved` (see _aggregation._probe_unweighted_fill).
    improved = norm.kind == "gcn" and _UNWEIGHTED_FILL[norm.improved] == 2.0
    return source.graph(norm.kind, improved, norm.add_self_loops, dtype)


def _sizes_agree(edge_index: EdgeIndex, n_src: int, n_dst: int, flip: bool) -> bool:
    """Whether an ``EdgeIndex``'s ``sparse_size`` (rows: ``edge_index[0]``'s nodes, columns:
    ``edge_index[1]``'s, which are the sources unless the flow is flipped; either may be unknown)
    fits the node counts the features give. Its ids may all be in range where it does not
    (features missing the last, isolated nodes): the output would then have the wrong number of
    rows. Stock PyG compares the sizes in the same order whatever the flow, so a bipartite
    SAGEConv with ``flow="target_to_source"`` that it refuses is served here, as it is for a plain
    ``edge_index``."""
    expected = (n_dst, n_src) if flip else (n_src, n_dst)
    return all(size is None or size == n for size, n in zip(edge_index.sparse_size(), expected))


_MESSAGE_PASSING = ("message", "aggregate", "message_and_aggregate", "update", "edge_update")
_own_way: dict[type, bool] = {}  # a dict, not functools.cache: Dynamo warns on every call of a cached function


def _passes_messages_its_own_way(cls: type) -> bool:
    """Whether a class between ``cls`` and fgplugin's drop-in overrides a step of PyG's message
    passing, which fgplugin's kernel would skip."""
    known = _own_way.get(cls)
    if known is None:
        known = False
        for klass in cls.__mro__:
            if klass.__module__.startswith("fgplugin."):
                break
            if any(name in klass.__dict__ for name in _MESSAGE_PASSING):
                known = True
                break
        _own_way[cls] = known
    return known


def _stock_form(aggregation: Aggregation, flow: str, sparse_tensor: bool):
    """A layer's kept aggregation as the stock code caches a normalized graph: ``(edge_index,
    edge_weight)`` with the scales folded into the weights and the added self loops as edges, or
    a ``SparseTensor`` (``sparse_tensor``); rows are the messages' targets."""
    adj, (rows_scale, cols_scale, diag) = aggregation.adj, aggregation.norm
    rows, cols = rows_of_edges(adj.rowptr, adj.nnz), adj.col.long()
    dtype = next((t.dtype for t in (rows_scale, cols_scale, diag) if t is not None), torch.float32)
    weight = torch.ones(adj.nnz, dtype=dtype, device=adj.device) if adj.values is None else adj.values.to(dtype)
    if diag is not None:
        loops = diag.nonzero().squeeze(1)
        rows, cols, weight = torch.cat([rows, loops]), torch.cat([cols, loops]), torch.cat([weight, diag[loops].to(dtype)])
    if rows_scale is not None:
        weight = weight * rows_scale[rows].to(dtype)
    if cols_scale is not None:
        weight = weight * cols_scale[cols].to(dtype)
    if sparse_tensor:
        from torch_geometric.typing import SparseTensor
        return SparseTensor(row=rows, col=cols, value=weight, sparse_sizes=adj.shape)
    edge_index = torch.stack([rows, cols]) if flow == "target_to_source" else torch.stack([cols, rows])
    return edge_index, weight


def is_ours(cache) -> bool:
    """Whether a layer's graph cache holds one of fgplugin's aggregations (a sharded graph too),
    not a normalized graph the stock code cached."""
    return isinstance(cache, (Aggregation, DeferredAggregation)) or is_distributed(cache, "sharding", "ShardedGraph")


def fits(aggregation, x: Tensor, node_dim: int, n_dst: int | None = None) -> bool:
    """Whether ``aggregation`` can aggregate the nodes of ``x`` into ``n_dst`` nodes (device,
    node counts); where it cannot, the stock layer runs and raises its own error."""
    if aggregation is None or x.dim() < 2:
        return False
    n_rows, n_cols = aggregation.shape
    return x.device == aggregation.device and x.size(node_dim) == n_cols and (n_dst is None or n_rows == n_dst)


def linear(module) -> tuple[Tensor, Tensor | None] | None:
    """``(weight.t(), bias)`` of a layer's plain linear map (fgplugin.aggregation.linear_parts)."""
    return linear_parts(module, LINEAR_KINDS)


class FgpluginLayer:
    """Mixin of the drop-in layers. ``_stock`` is the PyG class a layer replaces; ``_graph_caches``
    names the stock attributes in which it caches its normalized graph (there the drop-in keeps
    its aggregation instead, so ``conv._cached_edge_index = None`` still resets the cache)."""

    _stock: type
    _graph_caches: tuple[str, ...] = ()
    # PyG keeps what `propagate` resolves to before it generates a class's own as
    # `_orig_propagate` (the decomposed-layers path): MessagePassing's, not the stock layer's
    # generated one, which a stock instance built first would otherwise leave here.
    propagate = MessagePassing.propagate

    # repr() names the implementation, so print(model) shows which layers are fgplugin's; str()
    # keeps the stock layer's text, which scripts and PyG's own tests compare.
    def __repr__(self) -> str:
        return f"fgplugin.pyg.{self._stock.__repr__(self)}"

    def __str__(self) -> str:
        return self._stock.__repr__(self)

    def _fgplugin_serves(self) -> bool:
        """False where the stock propagate() must run: explain mode, hooks (they must see the
        stock messages), a subclass's own message passing (``message``, ``aggregate``, ...: one
        defined after ``patch()`` inherits the drop-in). ``decomposed_layers > 1`` only splits the
        stock E x F message tensor to save memory; our kernel never builds it, so we serve those
        calls whole (same result as ``decomposed_layers=1``, which PyG's own test demands to
        allclose's default 1e-8)."""
        return not self._explain and not any(getattr(self, h) for h in _HOOKS) and \
            not _passes_messages_its_own_way(type(self))

    @outside_inference_mode
    def _served_aggregation(self, x, edge_index, edge_weight):
        """The aggregation for a node-feature input ``x`` of a one-node-set layer when fgplugin
        serves this call (else ``None``: the caller runs the stock code). An aggregation that
        cannot take ``x`` and that the stock code cannot take either (a ``TiledAdjacency``, a graph
        a ``cached=True`` layer kept) is an error that says so."""
        if not (isinstance(x, Tensor) and x.dim() >= 2 and self._fgplugin_serves()):
            return None
        check_sharded_call(self, edge_index, x, self.node_dim)
        aggregation = self._aggregation(x.size(self.node_dim), edge_index, edge_weight, aux_dtype_for(x.dtype))
        if fits(aggregation, x, self.node_dim):
            return aggregation
        self._refuse_misfit(aggregation, x, edge_index)
        return None

    def _refuse_misfit(self, aggregation, x: Tensor, edge_index) -> None:
        """Raises a clear error where ``aggregation`` cannot take ``x`` and the stock code cannot
        take the graph either (a ``TiledAdjacency``, one a ``cached=True`` layer kept)."""
        if is_distributed(aggregation, "sharding", "ShardedGraph"):
            raise ValueError(f"{type(self).__name__}: x has {x.size(self.node_dim)} rows (dim {self.node_dim}) on "
                             f"{x.device}, but this rank's shard of the graph has {aggregation.num_rows} on "
                             f"{aggregation.device}; pass this rank's rows (shard(data, ctx).x)")
        if aggregation is None or not (isinstance(edge_index, TiledAdjacency) or self._kept_graph(aggregation)):
            return
        what = "the TiledAdjacency" if isinstance(edge_index, TiledAdjacency) else \
            f"the graph this {type(self).__name__}(cached=True) kept from its first call"
        raise ValueError(f"{type(self).__name__}: x has {x.size(self.node_dim)} nodes (dim {self.node_dim}) on "
                         f"{x.device}, but {what} has {aggregation.shape[1]} nodes on {aggregation.device}; pass "
                         "the features of every node of that graph"
                         + ("" if isinstance(edge_index, TiledAdjacency) else
                            ", or reset the cache (conv._cached_edge_index = None) before using another graph, "
                            "as with the stock layer"))

    def _kept_graph(self, aggregation) -> bool:
        return any(getattr(self, name, None) is aggregation for name in self._graph_caches)

    def _stock_forward(self, *args):
        if len(args) > 1 and is_distributed(args[1], "sharded_data", "ShardedAdjacency"):
            raise ValueError(f"{type(self).__name__} ({self}) cannot aggregate over a sharded graph in this call: only "
                             "fgplugin's own aggregations (GCNConv, SGConv, LGConv, SAGEConv with aggr='mean', no hooks, "
                             "not in explain mode) run across ranks; the stock code needs the whole graph")
        # The stock code reads its caches as normalized graphs, never as our aggregations: it
        # gets the kept graph in its own form (the normalized edge list), so that it too ignores
        # the graph given now, as a cached stock layer does.
        for name in self._graph_caches:
            cache = getattr(self, name)
            if isinstance(cache, DeferredAggregation):  # traced by torch.compile: its graph, normalized by stock
                setattr(self, name, None)
                args = (args[0], cache.edge_index, cache.edge_weight, *args[3:])
            elif is_ours(cache):
                setattr(self, name, _stock_form(cache, self.flow, name == "_cached_adj_t")
                        if isinstance(cache, Aggregation) else None)
        return self._stock.forward(self, *args)

    def _adopt_stock_cache(self, name: str, n: int):
        """An aggregation for a normalized graph the stock code cached in attribute ``name``
        (before a ``convert()``, or on a stock-path call), so the layer goes on with our kernel."""
        cache = getattr(self, name)
        source, values = (cache[0], cache[1]) if isinstance(cache, tuple) else (cache, None)
        aggregation = make_aggregation(source, values, n, n, self.flow == "target_to_source", NONE, torch.float32)
        if aggregation is not None:
            setattr(self, name, aggregation)
        return aggregation

    def __prepare_scriptable__(self):
        """TorchScript cannot compile fgplugin's graph handling (Python objects), so
        ``torch.jit.script`` gets the stock layer with the same parameters and settings."""
        twin = copy.copy(self)
        twin.__class__ = self._stock
        twin.__dict__.pop("propagate", None)  # PyG's decomposed_layers binds it to `self`
        for name in self._graph_caches:
            if is_ours(getattr(twin, name)):
                setattr(twin, name, None)
        twin._set_jittable_templates()
        return twin

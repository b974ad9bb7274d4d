"""A PyG ``Data`` sharded by rows for the user's own model: :func:`shard` gives each rank its rows
of every node attribute and an ``adj_t`` that the drop-in layers take as they take a graph.

    local = shard(data, ctx)                      # every rank, same arguments
    out = model(local.x, local.adj_t)             # a model of fgplugin.pyg layers, unchanged

    adj, ndata = shard_dgl(g, ctx)                # a DGL graph
    out = model(adj, ndata["feat"])               # a model of fgplugin.dgl layers, unchanged

The layers ask the :class:`ShardedAdjacency` for the normalization they apply (GCN with or without
self loops, the neighbourhood mean); each is a :class:`~fgplugin.distributed.sharding.ShardedGraph`
built on first use, so the exchange of the rows a rank reads from the others happens inside each
layer's aggregation, with every option of the sharded graph (1D and 1.5D, comm modes, live rows,
bf16 on the wire).
"""
from __future__ import annotations

import math

import torch

from .context import ShardingContext, check_agreement, check_context
from .sharding import ShardedGraph

# What the layers' normalizations map to. PyG: GCNConv, SGConv (gcn), LGConv (gcn without self
# loops), SAGEConv with mean aggregation (mean). DGL: GraphConv's norm both/right/left/none (both,
# mean, left, none), SGConv (gcn without self loops: in-degrees on both sides), SAGEConv mean
# (mean). "none" is the plain sum.
_KINDS = ("gcn", "mean", "both", "left", "none")


class ShardedAdjacency:
    """This rank's rows of a graph sharded over the ranks, for the drop-in layers' graph argument.

    Args:
        ctx: the :class:`ShardingContext` of this run.
        edge_index: the whole graph's ``[2, E]`` edges in original ids (kept: a layer that asks for
            another normalization later builds its sharded graph from them).
        num_nodes: of the whole graph.
        perm: node order, new -> old (e.g. ``fgplugin.reorder.reorder(..., parts=ctx.num_blocks)``),
            or ``None``.
        options: passed to :meth:`ShardedGraph.from_edge_index` (``tile_size``, ``threshold``).

    Every rank must build it with the same arguments (checked: a rank given another graph, order
    or setting raises ``ValueError`` on every rank) and its model must ask for the same
    normalizations in the same order, as the same model does.
    """

    def __init__(self, ctx: ShardingContext, edge_index: torch.Tensor, num_nodes: int, perm=None, **options):
        check_context(ctx, "a sharded adjacency (shard, shard_dgl, ShardedAdjacency)")
        self.ctx, self.edge_index, self.num_nodes, self.perm, self.options = ctx, edge_index, int(num_nodes), perm, options
        self._graphs: dict[tuple, ShardedGraph] = {}
        self._zero_in_degree: bool | None = None
        self.base = self.graph("gcn")  # checks that the ranks agree, and fixes the row blocks

    def graph(self, kind: str, improved: bool = False, add_self_loops: bool = True,
              scale_dtype: torch.dtype = torch.float32, replace_loops: bool = True) -> ShardedGraph:
        """The sharded graph normalized as ``kind`` (``gcn``, ``mean``, ``both``, ``left`` or
        ``none``) with scales in ``scale_dtype`` (float64 for float64 features), built once.
        ``replace_loops`` is the PyG layers' rule for an unweighted ``edge_index`` (their GCN
        counts one self loop per node, duplicates included); DGL's layers count the edges as
        they are (``False``)."""
        if kind not in _KINDS:
            raise ValueError(f"a sharded graph serves the normalizations {_KINDS}, not {kind!r}")
        if kind == "gcn":
            key = (kind, bool(improved), bool(add_self_loops), bool(replace_loops) and bool(add_self_loops))
        else:
            key = (kind, False, False, False)  # no diagonal term: the loop options change nothing
        key += (scale_dtype,)
        found = self._graphs.get(key)
        if found is None:
            found = ShardedGraph.from_edge_index(self.ctx, self.edge_index, self.num_nodes, perm=self.perm, norm=kind,
                                                 improved=key[1], add_self_loops=key[2], replace_loops=key[3],
                                                 scale_dtype=scale_dtype, **self.options)
            self._graphs[key] = found
        return found

    @torch.compiler.disable  # a collective and a host sync: eager, also inside a compiled model
    def check_call(self, layer, x: torch.Tensor, node_dim: int = 0) -> None:
        """On ``layer``'s first call with features of ``x``'s width and dtype (``node_dim``: its
        node dimension), checks with every rank that they call it alike (:func:`check_agreement`:
        two small all-gathers and a host sync, once per layer and kind of input), and that each
        rank's ``x`` holds its rows on its device. Ranks given features of another width or dtype
        (another dataset, a cast on one rank) would otherwise exchange rows of different sizes or
        build different graphs while the others exchange, and a rank that refused its input alone
        would leave the others waiting for the timeout. Called by the drop-in layers before they
        ask for a graph; not while a CUDA graph is captured (its warm-up's eager calls came first)."""
        node_dim %= max(x.dim(), 1)
        key = (math.prod(n for i, n in enumerate(x.shape) if i != node_dim), x.dtype)
        seen = layer.__dict__.setdefault("_fgplugin_sharded_calls", set())
        if key in seen or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return
        check_agreement("a layer's first call on a sharded graph",
                        [type(layer).__name__, key[0], _dtype_code(x.dtype),
                         int(x.dim() > node_dim and x.shape[node_dim] == self.num_rows), int(x.device == self.device)],
                        ("layer class (a hash of its name)", "features per node",
                         "features' dtype (" + ", ".join(f"{i} {str(d)[6:]}" for i, d in enumerate(_DTYPES)) + ")",
                         f"x holds this rank's rows (dim {node_dim})", "x is on this rank's device"),
                        self.ctx.device, f"the ranks call a layer on different features, or different layers (here "
                                         f"{type(layer).__name__}); every rank must pass its rows of the same features "
                                         f"(same width and dtype, on its device) to the same model")
        seen.add(key)

    @property
    def zero_in_degree(self) -> bool:
        """Whether some node of the whole graph has no in-edge (DGL's layers refuse such graphs
        unless ``allow_zero_in_degree``); counted once."""
        if self._zero_in_degree is None:
            targets = torch.as_tensor(self.edge_index[1])
            self._zero_in_degree = bool((torch.bincount(targets, minlength=self.num_nodes) == 0).any())
        return self._zero_in_degree

    @property
    def num_rows(self) -> int:
        return self.base.num_rows

    @property
    def device(self) -> torch.device:
        return self.base.device

    def rows(self, tensor) -> torch.Tensor:
        """This rank's rows of a node-level ``tensor`` in original node order."""
        return self.base.rows(tensor)

    def global_ids(self) -> torch.Tensor:
        """Original id of each of this rank's rows."""
        return self.base.global_ids()

    def __repr__(self) -> str:
        return (f"ShardedAdjacency(rows {self.base.row_start}..{self.base.row_end} of {self.num_nodes} nodes, "
                f"rank {self.ctx.rank} of {self.ctx.world_size}, replication {self.ctx.replication})")


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _dtype_code(dtype: torch.dtype) -> int | str:
    return _DTYPES.index(dtype) if dtype in _DTYPES else str(dtype)


def block_order(edge_index: torch.Tensor, num_nodes: int, ctx: ShardingContext,
                method: str = "community") -> torch.Tensor:
    """Algorithm 2's node order for ``ctx``'s row blocks (``fgplugin.reorder.reorder(...,
    parts=ctx.num_blocks)``: ids stay in their block), computed once on rank 0 and broadcast, so
    every rank passes the same ``perm`` to :func:`shard` / :func:`shard_dgl`. Collective."""
    import torch.distributed as dist

    perm = torch.empty(int(num_nodes), dtype=torch.long, device=ctx.device)
    if ctx.rank == 0:
        from fgplugin.reorder import reorder
        perm.copy_(reorder(edge_index.to(ctx.device), method, num_nodes=int(num_nodes), parts=ctx.num_blocks))
    dist.broadcast(perm, 0)
    return perm


def shard(data, ctx: ShardingContext, *, perm=None, **options):
    """This rank's part of a PyG ``Data``: its rows of every node-level attribute (a tensor whose
    first dimension is ``data.num_nodes``: ``x``, ``y``, masks, ...), ``adj_t`` a
    :class:`ShardedAdjacency` of ``data.edge_index``, ``num_nodes`` its row count and ``n_id`` the
    original ids of its rows; other attributes are kept as they are, those named ``edge*``
    (``edge_index``, ``edge_attr``) are left out. A ``data.edge_weight`` is refused (a sharded
    graph is unweighted, and a model reading it from the result would get ``None``), and so are
    ``x`` or ``y`` without one row per node. Call it on every rank with the same arguments;
    ``perm`` and ``options`` as for :class:`ShardedAdjacency`."""
    from torch_geometric.data import Data

    if getattr(data, "edge_index", None) is None:
        raise ValueError("shard(data): data has no edge_index; a sharded adjacency is built from the whole graph's "
                         "edge_index (a Data whose adj_t was made by a transform keeps edge_index only if asked)")
    if getattr(data, "edge_weight", None) is not None:
        raise ValueError("shard(data): data.edge_weight is set, but a sharded graph takes no edge weights (its "
                         "normalization comes from the edge counts); delete it (del data.edge_weight) to train "
                         "unweighted, or train in one process")
    n = int(data.num_nodes)
    for key in ("x", "y"):
        value = getattr(data, key, None)
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] != n:
            raise ValueError(f"shard(data): data.{key} has {value.shape[0]} rows but data.num_nodes is {n}; give "
                             f"one row per node (or set data.num_nodes to {value.shape[0]})")
    adj = ShardedAdjacency(ctx, data.edge_index, n, perm, **options)
    local = Data()
    for key, value in data.items():
        if "edge" in key:  # edge_index, edge_attr, edge_weight: PyG's naming of edge-level attributes
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            local[key] = adj.rows(value)
        else:
            local[key] = value
    local.adj_t, local.num_nodes, local.n_id = adj, adj.num_rows, adj.global_ids()
    return local


def shard_dgl(graph, ctx: ShardingContext, *, perm=None, **options) -> tuple[ShardedAdjacency, dict]:
    """This rank's part of a DGL graph (one node and edge type): ``(adj, ndata)``, where ``adj`` is
    a :class:`ShardedAdjacency` of the graph's edges as they are (add self loops before, as for
    DGL's ``GraphConv``) that ``fgplugin.dgl``'s layers take in place of the graph, and ``ndata``
    this rank's rows of every node feature (``graph.ndata``). Call it on every rank with the same
    arguments; ``perm`` and ``options`` as for :class:`ShardedAdjacency`."""
    if len(graph.canonical_etypes) != 1 or len(graph.ntypes) != 1:
        raise ValueError(f"shard_dgl takes a graph of one node and one edge type, got node types {graph.ntypes} and "
                         f"edge types {graph.canonical_etypes}; shard each relation's homogeneous graph instead")
    from fgplugin.dgl.convs import edges_by_id  # DGL's own import order (fgplugin.dgl's shim)

    src, dst = edges_by_id(graph)  # whichever sparse formats the graph allows
    adj = ShardedAdjacency(ctx, torch.stack([src, dst]).to(torch.long), graph.num_nodes(), perm, **options)
    return adj, {key: adj.rows(value) for key, value in graph.ndata.items()}

"""From whatever a PyG layer is given as its graph to a cached fgplugin ``TiledAdjacency``.

A layer accepts an ``edge_index`` (plain or PyG's ``EdgeIndex``), a ``torch.sparse`` ``adj_t``,
a ``torch_sparse.SparseTensor`` ``adj_t`` or a ``TiledAdjacency``. Building a ``TiledAdjacency``
sorts the edges (O(E log E)), so the structure is cached per input object, even for
``cached=False`` layers: the key is the object's identity (``id``) checked through a weak
reference, plus its version, data and shape (fgplugin.stamps: an in-place edit of ``edge_index``,
or an assignment to its ``.data``, builds anew) and the node counts. An entry dies with its input
object, and every layer given the same object shares it. What may change between calls (edge
weights, the values of a sparse ``adj_t``, normalizations) is never cached here.

Under ``torch.compile`` an ``edge_index`` is not looked up while tracing: the layers defer it to
an opaque op that reads this cache when it runs (_deferred.py). Sparse inputs are looked up; one
first seen inside a compiled region is built eagerly behind a graph break (building needs
data-dependent shapes), so the compiled model runs fgplugin's kernel either way.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch_geometric.typing import SparseTensor

from fgplugin import TiledAdjacency
from fgplugin.inference_mode import outside_inference_mode
from fgplugin.stamps import pin, stamp, stampable
from fgplugin.validation import plain_tensor

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
SPARSE_KINDS = ("torch.sparse", "SparseTensor")  # inputs that carry their own edge values

# id(input) -> (weak reference to it, its stamp (fgplugin.stamps) when cached, {(n_src, n_dst, flip): Graph},
# its storage pinned)
_cache: dict[int, tuple[weakref.ref, tuple | int, dict, object]] = {}


class Graph(NamedTuple):
    """One input graph for fgplugin.

    ``adj`` holds the edges with unit weights, rows = targets, in the edge order of the input (so
    ``adj.with_values(w)`` takes per-edge tensors as the input orders them). ``kind`` is
    ``"edge_index"``, ``"torch.sparse"``, ``"SparseTensor"`` or ``"tiled"``: the stock layers
    treat existing self loops differently for each (see gcn_scales in _aggregation.py), which is why
    ``loops`` lists the positions of the self-loop edges (in edge order) and ``loop_nodes`` their
    nodes. Nothing here refers to the input object, so the cache entry can die with it.
    """

    adj: TiledAdjacency
    kind: str
    loops: torch.Tensor | None = None
    loop_nodes: torch.Tensor | None = None


def graph_of(source, n_src: int | None, n_dst: int | None, flip: bool = False, strict: bool = False) -> Graph | None:
    """The :class:`Graph` of ``source``, or ``None`` when fgplugin cannot serve it here (an input
    the stock layer rejects, a reversed flow on a sparse input); the caller then runs the stock
    code path, errors included. With ``strict``, an input that fails to build raises its error.

    ``n_src`` / ``n_dst`` are the node counts an ``edge_index`` spans (sparse inputs carry theirs);
    ``flip`` reverses an ``edge_index`` (PyG's ``flow="target_to_source"``).
    """
    if isinstance(source, TiledAdjacency):
        return None if flip else Graph(source, "tiled")
    kind = input_kind(source)
    if kind is None or (flip and kind != "edge_index"):
        return None
    key = (n_src, n_dst, flip) if kind == "edge_index" else ()
    if torch.compiler.is_compiling():
        entry = _cache.get(id(source))
        graph = None if entry is None else entry[2].get(key)
        # A graph first seen while compiling is built eagerly behind one graph break; tracing it
        # would need data-dependent shapes, and falling back to the stock code here would bake
        # the stock path into the compiled model for good.
        return graph if graph is not None else _cached_graph_eagerly(source, kind, key, n_src, n_dst, flip, strict)
    return _cached_graph(source, kind, key, n_src, n_dst, flip, strict)


def _cached_graph(source, kind, key, n_src, n_dst, flip, strict):
    tensor = isinstance(source, torch.Tensor)
    if tensor and not stampable(source):  # nothing to key a cache on
        return _built(source, kind, n_src, n_dst, flip, strict)
    version = stamp(source) if tensor else 0
    entry = _cache.get(id(source))
    if entry is None or entry[0]() is not source or entry[1] != version:
        entry = (weakref.ref(source, _forget(id(source))), version, {}, pin(source) if tensor else None)
        _cache[id(source)] = entry
    graph = entry[2].get(key)
    if graph is None:
        graph = _built(source, kind, n_src, n_dst, flip, strict)
        if graph is not None:
            entry[2][key] = graph
    return graph


def _built(source, kind, n_src, n_dst, flip, strict):
    """The :class:`Graph` of ``source``, or ``None`` (the stock layer then raises its own error)."""
    try:
        return _build(source, kind, n_src, n_dst, flip)
    except NodeIdError:
        raise
    except (ValueError, TypeError, RuntimeError):
        if strict:
            raise
        return None


_cached_graph_eagerly = torch.compiler.disable(outside_inference_mode(_cached_graph))


def values_of(source) -> torch.Tensor | None:
    """Edge values a sparse input carries, in the edge order of its :class:`Graph` (read on every
    call: they may change or require grad), or ``None`` for unit weights."""
    if isinstance(source, SparseTensor):
        return source.storage.value()
    if isinstance(source, torch.Tensor) and source.layout in _SPARSE_LAYOUTS:
        return _coalesced(source).values()
    return None


def input_kind(source) -> str | None:
    """``"edge_index"``, ``"torch.sparse"`` or ``"SparseTensor"`` for a graph input fgplugin can
    build (``"tiled"`` is checked apart), else ``None``."""
    if isinstance(source, SparseTensor):
        return "SparseTensor"
    if not isinstance(source, torch.Tensor):
        return None
    if source.layout in _SPARSE_LAYOUTS:
        return "torch.sparse" if source.dim() == 2 else None
    if source.layout == torch.strided and source.dim() == 2 and source.shape[0] == 2 \
            and not source.dtype.is_floating_point and not source.dtype.is_complex and source.dtype != torch.bool:
        return "edge_index"
    return None


def _build(source, kind: str, n_src, n_dst, flip: bool) -> Graph:
    if kind == "edge_index":
        edge_index = plain_tensor(source).long()  # EdgeIndex: its data only
        if flip:
            edge_index = edge_index.flip(0)
        _check_ids(edge_index, n_src, n_dst)
    elif kind == "SparseTensor":
        dst, src, _ = source.coo()
        n_dst, n_src = source.sparse_sizes()
        edge_index = torch.stack([src, dst])
    else:
        dst, src = _coo_indices(_coalesced(source))
        n_dst, n_src = source.shape
        edge_index = torch.stack([src, dst])
    adj = TiledAdjacency.from_edge_index(edge_index, size=(n_src, n_dst))
    loops = (edge_index[0] == edge_index[1]).nonzero().view(-1)
    return Graph(adj, kind, loops, edge_index[0, loops])


class NodeIdError(IndexError, ValueError):
    """Node ids that do not index the features: raised to the user with what to fix, not handed to
    the stock code (which raises an IndexError from deep inside its scatter: hence the base)."""


def _check_ids(edge_index: torch.Tensor, n_src: int, n_dst: int) -> None:
    """Node ids of an ``edge_index`` must index the features (stock PyG fails deep inside its
    scatter instead, or reads garbage on CUDA)."""
    if not edge_index.numel():
        return
    smallest, largest_src, largest_dst = int(edge_index.min()), int(edge_index[0].max()), int(edge_index[1].max())
    if smallest < 0:
        raise ValueError(f"edge_index holds a negative node id ({smallest}); node ids must be >= 0")
    for largest, bound, what in ((largest_src, n_src, "source"), (largest_dst, n_dst, "target")):
        if largest >= bound:
            raise NodeIdError(f"edge_index refers to {what} node {largest}, but the features have only {bound} "
                               f"{what} nodes; pass features for every node id in edge_index")


def _coalesced(adj: torch.Tensor) -> torch.Tensor:
    # COO indices and values line up only once coalesced (a no-op when it already is).
    return adj.coalesce() if adj.layout == torch.sparse_coo else adj


def _coo_indices(adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of every stored entry of a torch.sparse matrix, in the order of its values."""
    if adj.layout == torch.sparse_coo:
        return adj.indices()[0], adj.indices()[1]
    if adj.layout == torch.sparse_csr:
        ptr, other, n = adj.crow_indices(), adj.col_indices(), adj.shape[0]
    else:
        ptr, other, n = adj.ccol_indices(), adj.row_indices(), adj.shape[1]
    outer = torch.repeat_interleave(torch.arange(n, device=ptr.device), ptr[1:] - ptr[:-1])
    return (outer, other.long()) if adj.layout == torch.sparse_csr else (other.long(), outer)


def _forget(key: int):
    def callback(ref):
        entry = _cache.get(key)
        if entry is not None and entry[0] is ref:  # not an entry made since for a new object
            del _cache[key]
    return callback

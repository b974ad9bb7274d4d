"""``BlockReorder``: a PyG transform that lays a graph out for fgplugin's block-adaptive SpMM."""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.transforms import BaseTransform

from fgplugin.preprocess import check_cache_option, check_method_options, reorder_graph

_NODE_KEYS = ("x", "y", "pos", "batch", "train_mask", "val_mask", "test_mask", "node_id")


class BlockReorder(BaseTransform):
    r"""Reorders the nodes of a graph so that its adjacency forms dense tiles, and attaches the
    tiled adjacency as ``data.adj_t`` (a :class:`fgplugin.TiledAdjacency`).

    Every node-level attribute (``x``, ``y``, masks, ``pos``, any tensor, array or list with one
    entry per node, as PyG's ``data.is_node_attr`` tells) is permuted; ``edge_index`` and every
    other attribute holding node ids (PyG's ``*index`` keys and ``face``, e.g.
    ``edge_label_index``) are renumbered, keeping their order, so edge attributes stay with their
    edges. Where a graph has as many nodes as edges PyG tells the two kinds of attribute apart by
    name alone (``"edge"`` in the key: an edge attribute); the transform then warns which keys it
    permuted as node attributes. ``data.perm`` (new -> old, ``x_new = x_old[perm]``) and
    ``data.inv_perm`` (old -> new) record the permutation; applying the transform twice composes
    them. Use it on single graphs: as ``pre_transform=`` (done once, saved with the dataset),
    ``transform=``, or inside ``T.Compose``; a batch of graphs is refused (its nodes would mix).
    fgplugin's layers take ``data.adj_t`` in place of ``edge_index``.

    Args:
        method, parts, seed, tile_size, threshold, cache, method_options: as for
            :func:`fgplugin.preprocess.reorder_graph` (default: the ``community`` ordering,
            ``threshold="auto"``, no disk cache, the method's default options).
        edge_weight_key (str): edge attribute used as edge weights; ``"edge_weight"`` (the
            default) may be absent (unit weights), another key must be present.
    """

    def __init__(self, method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
                 threshold: float | str = "auto", cache=False, edge_weight_key: str = "edge_weight",
                 method_options: dict | None = None):
        self.method, self.parts, self.seed = method, parts, seed
        self.method_options = check_method_options(method_options)
        self.tile_size, self.threshold, self.cache = tile_size, threshold, check_cache_option(cache)
        self.edge_weight_key = edge_weight_key

    def forward(self, data: Data) -> Data:
        if isinstance(data, HeteroData):
            raise TypeError("BlockReorder handles homogeneous graphs (Data); for HeteroData, reorder each node "
                            "type's graph separately or convert with data.to_homogeneous() first")
        if data.edge_index is None:
            raise ValueError("BlockReorder needs data.edge_index; for a graph stored only as adj_t, build "
                             "edge_index first (e.g. with torch_geometric.utils.to_edge_index)")
        batch = data.batch if "batch" in data and isinstance(data.batch, torch.Tensor) else None
        if isinstance(data, Batch) or "ptr" in data or (batch is not None and batch.numel() and
                                                        bool((batch != batch[0]).any())):
            raise ValueError("BlockReorder reorders one graph, not a batch: its ordering would mix the graphs' "
                             "nodes. Apply it to each graph before batching (pre_transform= or transform= of "
                             "the dataset)")
        num_nodes = data.num_nodes
        if self.edge_weight_key in data:
            edge_weight = data[self.edge_weight_key]
        elif self.edge_weight_key == "edge_weight":
            edge_weight = None
        else:
            raise KeyError(f"BlockReorder(edge_weight_key={self.edge_weight_key!r}): data has no such attribute "
                           f"(it has {sorted(data.keys())}); name the edge weights' key, or leave the default "
                           "for unit weights")
        adj = reorder_graph(data.edge_index, num_nodes, edge_weight, method=self.method, parts=self.parts,
                            seed=self.seed, tile_size=self.tile_size, threshold=self.threshold, cache=self.cache,
                            method_options=self.method_options)
        perm, inv_perm = adj.perm, adj.inv_perm
        out = data.clone()
        by_name = []  # node attributes that PyG tells from edge attributes by their name alone
        for key, value in data.items():
            if key in ("perm", "inv_perm", "adj_t", "edge_index", self.edge_weight_key):
                continue
            if isinstance(value, torch.Tensor) and data.__inc__(key, value) == num_nodes:
                out[key] = _renumbered(key, value, inv_perm, num_nodes)
            elif data.is_node_attr(key):
                out[key] = _permuted(value, perm, data.__cat_dim__(key, value) if isinstance(value, torch.Tensor) else 0)
                if num_nodes == data.num_edges and key not in _NODE_KEYS:
                    by_name.append(key)
        out.edge_index = inv_perm[data.edge_index]  # checked by reorder_graph
        if by_name:
            warnings.warn(f"BlockReorder: this graph has as many nodes as edges, so PyG tells node from edge "
                          f"attributes by name (\"edge\" in the key: an edge attribute); {by_name} were permuted "
                          "as node attributes. Rename any of them that is per edge to contain \"edge\"",
                          UserWarning, stacklevel=3)  # the user's call, through BaseTransform.__call__
        if "perm" in data:  # applied before: compose, so that perm stays relative to the original order
            adj.perm = data.perm[perm]
        out.perm, out.inv_perm = adj.perm, adj.inv_perm
        out.adj_t = adj
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(method={self.method!r}, parts={self.parts}, seed={self.seed}, "
                f"tile_size={self.tile_size}, threshold={self.threshold}"
                + (f", method_options={self.method_options}" if self.method_options else "") + ")")


def _permuted(value, perm: torch.Tensor, dim: int):
    """A node attribute in the new order: tensors along their node dimension, arrays and lists
    along their first."""
    if isinstance(value, torch.Tensor):
        return value.index_select(dim, perm.to(value.device))
    if isinstance(value, np.ndarray):
        return value[perm.cpu().numpy()]
    return type(value)(value[i] for i in perm.tolist()) if isinstance(value, tuple) else [value[i] for i in perm.tolist()]


def _renumbered(key: str, value: torch.Tensor, inv_perm: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """An attribute holding node ids (``edge_label_index``, ``face``, ...) with the new ids, its
    entries in their order."""
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"data.{key} holds node ids for PyG ('index' in its name), but its dtype is {value.dtype}; "
                        "store node ids as integers, or rename it")
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= num_nodes):
        raise ValueError(f"data.{key} holds node ids for PyG ('index' in its name), but has entries outside "
                         f"[0, {num_nodes}); fix them, or rename the attribute")
    return inv_perm.to(value.device)[value].to(value.dtype)

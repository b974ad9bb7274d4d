"""``BlockReorder``: a PyG transform that lays a graph out for fgplugin's block-adaptive SpMM."""
from __future__ import annotations

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.transforms import BaseTransform

from fgplugin.preprocess import reorder_graph


class BlockReorder(BaseTransform):
    r"""Reorders the nodes of a graph so that its adjacency forms dense tiles, and attaches the
    tiled adjacency as ``data.adj_t`` (a :class:`fgplugin.TiledAdjacency`).

    Every node-level attribute (``x``, ``y``, masks, ``pos``, any tensor with one row per node)
    is permuted; ``edge_index`` is renumbered and keeps its edge order, so edge attributes stay
    with their edges. ``data.perm`` (new -> old, ``x_new = x_old[perm]``) and ``data.inv_perm``
    (old -> new) record the permutation; applying the transform twice composes them. Use it as
    ``pre_transform=`` (done once, saved with the dataset), ``transform=``, or inside
    ``T.Compose``. fgplugin's layers take ``data.adj_t`` in place of ``edge_index``.

    Args:
        method, parts, seed, tile_size, threshold, cache: as for
            :func:`fgplugin.preprocess.reorder_graph` (default: the ``community`` ordering,
            ``threshold="auto"``, no disk cache).
        edge_weight_key (str): edge attribute used as edge weights when present.
    """

    def __init__(self, method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
                 threshold: float | str = "auto", cache=False, edge_weight_key: str = "edge_weight"):
        self.method, self.parts, self.seed = method, parts, seed
        self.tile_size, self.threshold, self.cache = tile_size, threshold, cache
        self.edge_weight_key = edge_weight_key

    def forward(self, data: Data) -> Data:
        if isinstance(data, HeteroData):
            raise TypeError("BlockReorder handles homogeneous graphs (Data); for HeteroData, reorder each node "
                            "type's graph separately or convert with data.to_homogeneous() first")
        if data.edge_index is None:
            raise ValueError("BlockReorder needs data.edge_index; for a graph stored only as adj_t, build "
                             "edge_index first (e.g. with torch_geometric.utils.to_edge_index)")
        num_nodes = data.num_nodes
        edge_weight = data[self.edge_weight_key] if self.edge_weight_key in data else None
        adj = reorder_graph(data.edge_index, num_nodes, edge_weight, method=self.method, parts=self.parts,
                            seed=self.seed, tile_size=self.tile_size, threshold=self.threshold, cache=self.cache)
        perm = adj.perm
        out = data.clone()
        for key, value in data.items():
            if key in ("perm", "inv_perm") or not isinstance(value, torch.Tensor) or not data.is_node_attr(key):
                continue
            out[key] = value.index_select(data.__cat_dim__(key, value), perm.to(value.device))
        out.edge_index = adj.inv_perm[data.edge_index]
        if "perm" in data:  # applied before: compose, so that perm stays relative to the original order
            adj.perm = data.perm[perm]
        out.perm, out.inv_perm = adj.perm, adj.inv_perm
        out.adj_t = adj
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(method={self.method!r}, parts={self.parts}, seed={self.seed}, "
                f"tile_size={self.tile_size}, threshold={self.threshold})")

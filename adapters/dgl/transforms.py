"""``BlockReorder`` for DGL: a transform that lays a graph out for fgplugin's block-adaptive SpMM."""
from __future__ import annotations

import torch

from fgplugin.preprocess import check_cache_option, check_method_options, reorder_graph

from ._import_shim import import_dgl
from .convs import Structure, edges_by_id

dgl = import_dgl()
from dgl.transforms import BaseTransform  # noqa: E402  (after the import shim)


class BlockReorder(BaseTransform):
    r"""Reorders the nodes of a homogeneous ``DGLGraph`` so that its adjacency forms dense tiles.

    Returns a new graph whose node ``i`` is node ``perm[i]`` of the input: every ``ndata`` field
    is permuted, edges keep their order (so ``edata`` stays with its edges), the id type is kept, and
    ``ndata["perm"]`` / ``ndata["inv_perm"]`` hold the permutation (new -> old / old -> new;
    composed when applied twice). The tiled adjacency is built once and cached on the graph, where
    ``fgplugin.dgl``'s layers find it; it keeps the edge order, so they also serve ``edge_weight``
    given in the graph's edge order. Use it on single graphs: a batch (``dgl.batch``) is refused.

    Args:
        method, parts, seed, tile_size, threshold, cache, method_options: as for
            :func:`fgplugin.preprocess.reorder_graph` (default: the ``community`` ordering,
            ``threshold="auto"``, no disk cache, the method's default options).
    """

    def __init__(self, method: str = "community", parts: int = 1, seed: int = 0, tile_size: int = 32,
                 threshold: float | str = "auto", cache=False, method_options: dict | None = None):
        self.method, self.parts, self.seed = method, parts, seed
        self.method_options = check_method_options(method_options)
        self.tile_size, self.threshold, self.cache = tile_size, threshold, check_cache_option(cache)

    def __call__(self, g):
        if not g.is_homogeneous:
            raise TypeError("BlockReorder handles homogeneous DGL graphs (one node and one edge type); reorder "
                            "each relation's graph separately or use dgl.to_homogeneous first")
        if g.batch_size > 1:
            raise ValueError(f"BlockReorder reorders one graph, not a batch of {g.batch_size}: its ordering would "
                             "mix the graphs' nodes. Apply it to each graph before dgl.batch")
        n = g.num_nodes()
        src, dst = edges_by_id(g)
        # the edge order kept: DGL's layers take edge weights per call, in the graph's edge order
        adj = reorder_graph(torch.stack([src, dst]), n, method=self.method, parts=self.parts, seed=self.seed,
                            tile_size=self.tile_size, threshold=self.threshold, cache=self.cache,
                            method_options=self.method_options, keep_edge_order=True)
        perm, new_ids = adj.perm, adj.inv_perm.to(g.idtype)  # the id type kept: dgl.batch needs one for all graphs
        out = dgl.graph((new_ids[src], new_ids[dst]), num_nodes=n, idtype=g.idtype, device=g.device)
        for key, value in g.ndata.items():
            if key not in ("perm", "inv_perm"):
                out.ndata[key] = value[perm.to(value.device)]
        for key, value in g.edata.items():
            out.edata[key] = value
        formats = g.formats()
        out = out.formats(formats["created"] + formats["not created"])  # a restriction (DGL's memory saving) kept
        if "perm" in g.ndata:  # applied before: compose, so that perm stays relative to the original order
            adj.perm = g.ndata["perm"][perm]
        out.ndata["perm"], out.ndata["inv_perm"] = adj.perm, adj.inv_perm
        # The layers' structure cache (fgplugin.dgl.convs.structure): built here, not again later.
        out._graph._fgplugin_structure = Structure(adj, bool((adj.in_degree() == 0).any()))
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(method={self.method!r}, parts={self.parts}, seed={self.seed}, "
                f"tile_size={self.tile_size}, threshold={self.threshold}"
                + (f", method_options={self.method_options}" if self.method_options else "") + ")")

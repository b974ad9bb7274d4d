r"""Normalizations of the stock GNN layers as row scales, column scales and a diagonal term.

Every layer's aggregation is ``diag(r) (A + diag(d)) diag(c) X`` over the same plan:

=========  =====================================  =====================================  ==========================
kind       row scale r                            column scale c                         diagonal d
=========  =====================================  =====================================  ==========================
``gcn``    deg^-1/2, deg = weighted in-degree +    same as r                              fill where no self loop
           fill (PyG ``gcn_norm``)
``both``   in-degree^-1/2 (DGL, clamped at 1)      out-degree^-1/2 (clamped at 1)         none
``right``  1 / in-degree (clamped at 1)            none                                   none
``left``   none                                   1 / out-degree (clamped at 1)          none
``none``   none                                   none                                   none
``mean``   1 / in-degree (clamped at 1)            none                                   none
=========  =====================================  =====================================  ==========================

``gcn`` follows PyG's ``add_remaining_self_loops``: a node that already has a self loop keeps it
(its weight counts in the degree) and gets no extra fill; every other node gets a loop of weight
``fill`` = 1, or 2 when ``improved``. ``add_self_loops=False`` gives LGConv's normalization.
Degrees of DGL's norms are edge counts, as in ``dgl.nn.GraphConv`` (which ignores edge weights in
its norm); ``gcn`` uses weighted degrees, as PyG does.

Where stock PyG's ``gcn_norm`` depends on the input kind, ``fgplugin.pyg.GCNConv`` reproduces it
on top of these scales (adapters/pyg): torch.sparse inputs add a loop to every node,
``SparseTensor`` inputs overwrite the diagonal, a node with duplicate self loops keeps the last
one's weight, and PyG 2.8 ignores ``improved`` on unweighted ``edge_index``. Here a node's
duplicate self loops count with their summed weight.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

KINDS = ("gcn", "both", "right", "left", "none", "mean")


class Normalization(NamedTuple):
    """``(row_scale, col_scale, diag)``, each a 1-D tensor or ``None``; splat into ``spmm``."""

    row_scale: torch.Tensor | None
    col_scale: torch.Tensor | None
    diag: torch.Tensor | None


def normalization(adj, kind: str = "gcn", *, add_self_loops: bool = True, improved: bool = False,
                  dtype: torch.dtype = torch.float32) -> Normalization:
    """Scales of normalization ``kind`` for ``adj`` (see the module docstring) in ``dtype`` (that
    of the features they scale: float64 features want float64 scales); O(nnz) once. Degrees are
    summed in float64, so float32 scales are correctly rounded too."""
    if kind not in KINDS:
        raise ValueError(f"unknown normalization {kind!r}; expected one of {KINDS}")
    if kind == "gcn":
        return _as(_gcn(adj, add_self_loops, improved), dtype)
    in_deg = adj.in_degree(dtype=torch.float64).clamp(min=1)
    if kind == "mean" or kind == "right":
        scales = Normalization(in_deg.reciprocal(), None, None)
    elif kind == "left":
        scales = Normalization(None, adj.out_degree(dtype=torch.float64).clamp(min=1).reciprocal(), None)
    elif kind == "both":
        scales = Normalization(in_deg.rsqrt(), adj.out_degree(dtype=torch.float64).clamp(min=1).rsqrt(), None)
    else:
        scales = Normalization(None, None, None)
    return _as(scales, dtype)


def _as(scales: Normalization, dtype: torch.dtype) -> Normalization:
    return Normalization(*(None if t is None else t.to(dtype) for t in scales))


def _gcn(adj, add_self_loops: bool, improved: bool) -> Normalization:
    if not adj.is_square:
        raise ValueError(f"GCN normalization needs a square adjacency (one node set), got shape {adj.shape}")
    deg = adj.in_degree(weighted=True, dtype=torch.float64)
    diag = None
    if add_self_loops:
        diag = (~adj.self_loop_mask()).to(deg.dtype) * (2.0 if improved else 1.0)
        deg = deg + diag
    inv_sqrt = deg.rsqrt()
    inv_sqrt = inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)  # isolated nodes: zero, as PyG
    return Normalization(inv_sqrt, inv_sqrt, diag)

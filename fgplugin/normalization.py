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


def normalization(adj, kind: str = "gcn", *, add_self_loops: bool | None = None, improved: bool = False,
                  dtype: torch.dtype | None = None) -> Normalization:
    """Scales of normalization ``kind`` for ``adj``, for ``diag(r) (A + diag(d)) diag(c) X``;
    O(nnz) once. ``kind``: ``"gcn"`` (PyG's ``gcn_norm``: D^-1/2 (A + I) D^-1/2 on weighted
    degrees, a self loop only where a node has none, of weight 2 with ``improved``; LGConv's with
    ``add_self_loops=False``; the other kinds add no loops, and refuse ``add_self_loops=True`` and
    ``improved=True``), DGL ``GraphConv``'s ``"both"``, ``"right"``, ``"left"``, ``"none"``
    (on edge counts, clamped at 1), or ``"mean"`` (1 / in-degree). The table of the kinds is in
    fgplugin/normalization.py.

    By default they are float64, exact to float64 rounding, and ``spmm`` rounds them to the
    precision of the features it multiplies (float32 for float32 and 16-bit features), so float64
    features get float64 accuracy. ``dtype=torch.float32`` gives them in the kernels' float32 and
    saves that cast on every call: the layers ask for the dtype of their features."""
    if kind not in KINDS:
        raise ValueError(f"unknown normalization {kind!r}; expected one of {KINDS}")
    if kind != "gcn" and (improved or add_self_loops):
        raise ValueError(f"improved=True and add_self_loops=True are options of the 'gcn' normalization; {kind!r} "
                         "adds no self loops: leave them out")
    add_self_loops = True if add_self_loops is None else add_self_loops
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype= must be a floating-point torch dtype (the scales' precision, e.g. torch.float32), "
                         f"got {dtype!r}")
    dtype = dtype or torch.float64
    if kind == "gcn":
        if not adj.is_square:
            raise ValueError(f"GCN normalization needs a square adjacency (one node set), got shape {adj.shape}")
        diag = (~adj.self_loop_mask()).to(torch.float64) * (2.0 if improved else 1.0) if add_self_loops else None
        return scales_of_degrees(kind, adj.in_degree(weighted=True, dtype=torch.float64), diag=diag, dtype=dtype)
    in_deg = adj.in_degree(dtype=torch.float64) if kind in ("mean", "right", "both") else None
    out_deg = adj.out_degree(dtype=torch.float64) if kind in ("left", "both") else None
    return scales_of_degrees(kind, in_deg, out_deg, dtype=dtype)


def scales_of_degrees(kind: str, in_degree: torch.Tensor | None, out_degree: torch.Tensor | None = None, *,
                      diag: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> Normalization:
    """The scales of ``kind`` from the (float64) degrees: ``in_degree`` (weighted for ``gcn``),
    ``out_degree`` for ``left`` and ``both``, and for ``gcn`` the weight ``diag`` added to each
    node's diagonal (``None``: no self loops added). The caller's loop rule decides ``diag``: a
    fill where a node has no loop (``normalization``), or the fill less the node's own loops, which
    replaces them by one as PyG's ``GCNConv`` does. Computed in float64 (differentiable in the
    degrees and ``diag``) and rounded once to ``dtype``, so every path that has the same degrees
    (one process, sharded, the PyG layers) gets the same scales."""
    if kind == "gcn":
        deg = in_degree.to(torch.float64)
        if diag is not None:
            diag = diag.to(torch.float64)
            deg = deg + diag
        inv_sqrt = deg.rsqrt()
        inv_sqrt = inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)  # isolated nodes: zero, as PyG
        scales = Normalization(inv_sqrt, inv_sqrt, diag)
    elif kind == "mean" or kind == "right":
        scales = Normalization(in_degree.to(torch.float64).clamp(min=1).reciprocal(), None, None)
    elif kind == "left":
        scales = Normalization(None, out_degree.to(torch.float64).clamp(min=1).reciprocal(), None)
    elif kind == "both":
        scales = Normalization(in_degree.to(torch.float64).clamp(min=1).rsqrt(),
                               out_degree.to(torch.float64).clamp(min=1).rsqrt(), None)
    else:
        scales = Normalization(None, None, None)
    row, col, diag = (None if t is None else t.to(dtype) for t in scales)
    # One tensor where both scales are one (gcn): consumers test `col_scale is row_scale`.
    return Normalization(row, row if scales.col_scale is scales.row_scale else col, diag)

"""The models of the ``epoch`` suite: one 2-layer GCN, six implementations, identical weights.

Every implementation computes ``conv2(dropout(relu(conv1(x))))`` with
``conv(h) = D^-1/2 (A + I) D^-1/2 h W + b`` from the same weights (:func:`reference_weights`):

- ``fgplugin``: :class:`fgplugin.pyg.GCNConv` (what ``fgplugin.pyg.convert`` gives) on a
  :class:`fgplugin.TiledAdjacency`; like stock PyG it multiplies by W before aggregating;
- ``fgplugin-kernels``: ``fgplugin`` with all it adds beyond its SpMM kernels switched off, so
  that it runs every product and every op the baselines run: the first layer aggregates its
  (constant) input every step (fgplugin.input_cache), the last layer's backward product reads
  every row of its gradient (fgplugin.grad_rows), and dropout is torch's. The kernels' share of
  the ``fgplugin`` row's gain;
- ``fgplugin-torch-dropout``: ``fgplugin`` with torch's dropout (``convert(model, dropout=False)``),
  which separates the gain of fgplugin's CPU dropout (fgplugin.parallel_dropout) from the rest;
- ``fgplugin-dgl``: :class:`fgplugin.dgl.GraphConv` (what ``fgplugin.dgl.convert`` gives) on the
  same DGL graph as ``dgl``: DGL's order of operations, fgplugin's SpMM;
- ``dgl``: stock ``dgl.nn.GraphConv(norm='both')`` on a DGL graph with self loops;
- ``dgl-path``: DGL's GPU code path rebuilt from torch ops (:class:`DGLPathConv`);
- ``cusparse-cached``: normalized CSR and its transpose built once (:class:`CachedCSRConv`);
- ``pyg-edge_index`` / ``pyg-adj_t``: stock ``torch_geometric.nn.GCNConv(cached=True)`` on
  ``edge_index`` / on a ``torch.sparse_csr`` ``adj_t`` as ``T.ToSparseTensor(layout=torch.sparse_csr)``
  gives.

Dropout sits between the layers only (as in DGL's GCN example), so the timed step is dominated by
the layers, not by drawing a mask over a wide input. It is a ``torch.nn.Dropout`` module, which
``fgplugin.pyg.convert`` / ``fgplugin.dgl.convert`` swap for :class:`fgplugin.Dropout`: so the
``fgplugin`` and ``fgplugin-dgl`` models have it (it is torch's dropout on GPUs). PyG and DGL are imported inside functions:
importing this module needs neither.
"""
from __future__ import annotations

import importlib.util
import math
import time
import warnings
from dataclasses import dataclass

import torch
from torch import nn

IMPLS = ("fgplugin", "dgl", "dgl-path", "cusparse-cached", "pyg-edge_index", "pyg-adj_t")
# fgplugin variants (fgplugin plus a suffix): fgplugin.dgl.GraphConv on the DGL graph, which keeps
# DGL's order of operations (aggregate first when in_feats <= out_feats), so it pairs with `dgl`; fgplugin
# without the input cache and zero-row skipping (run_one switches them off) and with torch's dropout; and
# fgplugin with torch's dropout only.
VARIANTS = ("fgplugin-dgl", "fgplugin-kernels", "fgplugin-torch-dropout")
FGPLUGIN_PYG = ("fgplugin", "fgplugin-kernels", "fgplugin-torch-dropout")  # the same convs
FGPLUGIN_DROPOUT = ("fgplugin", "fgplugin-dgl")  # what convert() gives: fgplugin.Dropout


class ImplUnavailable(RuntimeError):
    """An implementation cannot run here (missing framework, unsupported device); the message is
    what the result row's ``error`` says."""


@dataclass
class Weights:
    """The two layers' parameters: ``w1 [in, hidden]``, ``b1 [hidden]``, ``w2 [hidden, out]``, ``b2 [out]``."""
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor


def reference_weights(in_feats: int, hidden: int, out_feats: int, seed: int = 0, device="cpu") -> Weights:
    """Glorot-uniform weights and zero biases (PyG's and DGL's initialization), seeded."""
    gen = torch.Generator().manual_seed(seed)

    def glorot(fan_in, fan_out):
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return ((torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * a).to(device)

    return Weights(glorot(in_feats, hidden), torch.zeros(hidden, device=device),
                   glorot(hidden, out_feats), torch.zeros(out_feats, device=device))


class GCN2(nn.Module):
    """``conv2(dropout(relu(conv1(x, g))), g)``; every conv is called as ``conv(x, g)``."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, dropout: nn.Module):
        super().__init__()
        self.conv1, self.conv2, self.dropout = conv1, conv2, dropout

    def forward(self, x, g):
        return self.conv2(self.dropout(self.conv1(x, g).relu()), g)


# ---------------------------------------------------------------- CSR helpers (torch only)
def _csr_of(edge_index: torch.Tensor, num_nodes: int, self_loops: bool = True):
    """``(rowptr, col)`` int64 of ``A (+ I)`` with rows = destination, columns = source."""
    src, dst = edge_index[0], edge_index[1]
    if self_loops:
        loop = torch.arange(num_nodes, device=edge_index.device)
        keep = src != dst
        src, dst = torch.cat([src[keep], loop]), torch.cat([dst[keep], loop])
    order = torch.argsort(dst * num_nodes + src)
    row, col = dst[order], src[order]
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=edge_index.device)
    rowptr[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    return rowptr, col, row


def _csr_tensor(rowptr, col, values, n):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(rowptr, col, values, size=(n, n), check_invariants=False)


def _transpose_csr(rowptr, col, row, values, n):
    """CSR of the transpose (rows = source): DGL keeps this as the graph's CSC."""
    order = torch.argsort(col * n + row)
    t_row, t_col, t_values = col[order], row[order], values[order]
    t_rowptr = torch.zeros(n + 1, dtype=torch.int64, device=col.device)
    t_rowptr[1:] = torch.cumsum(torch.bincount(t_row, minlength=n), 0)
    return _csr_tensor(t_rowptr, t_col, t_values, n)


class _SpMM(torch.autograd.Function):
    """``A @ h`` with ``A`` a CSR built by ``make_fwd()`` per call; backward ``A^T @ g`` on a
    transposed CSR given once."""

    @staticmethod
    def forward(ctx, h, make_fwd, transposed):
        ctx.transposed = transposed
        return torch.sparse.mm(make_fwd(), h)

    @staticmethod
    def backward(ctx, grad):
        return torch.sparse.mm(ctx.transposed, grad.contiguous()), None, None


class DGLPathGraph:
    """What DGL holds for a graph with self loops: CSR (rows = destination) with an all-ones value
    array, the transposed CSR (DGL's CSC, built once, reused by every backward), and degrees."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        rowptr, col, row = _csr_of(edge_index, num_nodes)
        self.n = num_nodes
        self.rowptr, self.col = rowptr, col
        self.ones = torch.ones(col.numel(), device=col.device)
        self.transposed = _transpose_csr(rowptr, col, row, self.ones, num_nodes)
        self.in_deg = torch.diff(rowptr).float()
        self.out_deg = torch.bincount(col, minlength=num_nodes).float()

    def csr(self):
        """A fresh CSR tensor per call: torch.sparse.mm then sets up cuSPARSE from scratch (uncached)."""
        return _csr_tensor(self.rowptr, self.col, self.ones, self.n)


class DGLPathConv(nn.Module):
    """DGL ``GraphConv(norm='both')``'s code path from torch ops: ``h * out_deg^-1/2``, then W first
    when ``in_feats > out_feats`` (else after), the un-normalized SpMM, ``* in_deg^-1/2``, ``+ b``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x, g: DGLPathGraph):
        norm_src = g.out_deg.clamp(min=1).pow(-0.5)
        h = x * norm_src.unsqueeze(1)
        if self.weight.shape[0] > self.weight.shape[1]:
            h = _SpMM.apply(h @ self.weight, g.csr, g.transposed)
        else:
            h = _SpMM.apply(h, g.csr, g.transposed) @ self.weight
        norm_dst = g.in_deg.clamp(min=1).pow(-0.5)
        return h * norm_dst.unsqueeze(1) + self.bias


class CachedCSRGraph:
    """``D^-1/2 (A + I) D^-1/2`` as a CSR tensor and its transpose, both built once."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        rowptr, col, row = _csr_of(edge_index, num_nodes)
        deg = torch.diff(rowptr).float()
        inv_sqrt = deg.clamp(min=1).rsqrt()
        values = inv_sqrt[row] * inv_sqrt[col]
        self.fwd = _csr_tensor(rowptr, col, values, num_nodes)
        self.transposed = _transpose_csr(rowptr, col, row, values, num_nodes)

    def csr(self):
        return self.fwd


class CachedCSRConv(DGLPathConv):
    """The strongest plain baseline: one cached SpMM on the normalized CSR, W on the narrow side."""

    def forward(self, x, g: CachedCSRGraph):
        if self.weight.shape[0] > self.weight.shape[1]:
            h = _SpMM.apply(x @ self.weight, g.csr, g.transposed)
        else:
            h = _SpMM.apply(x, g.csr, g.transposed) @ self.weight
        return h + self.bias


class _DGLConv(nn.Module):
    """Calls stock DGL ``GraphConv`` as ``conv(x, g)``."""

    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, g):
        return self.conv(g, x)


# ---------------------------------------------------------------- framework imports
def require_pyg():
    if importlib.util.find_spec("torch_geometric") is None:
        raise ImplUnavailable("PyG not installed")
    import torch_geometric
    return torch_geometric


def require_dgl(device: torch.device):
    if importlib.util.find_spec("dgl") is None:
        raise ImplUnavailable("DGL not installed")
    from fgplugin.dgl import import_dgl
    try:
        dgl = import_dgl()
    except ImportError as err:
        raise ImplUnavailable(f"DGL failed to import: {err}") from err
    if device.type == "cuda":
        try:
            dgl.graph(([0], [0])).to(device)
        except Exception as err:  # PyPI DGL is a CPU build
            raise ImplUnavailable(f"installed DGL cannot run on {device}: {str(err).splitlines()[0][:120]}") from err
    return dgl


# ---------------------------------------------------------------- builders
def _copy_pyg(conv, w, b):
    with torch.no_grad():
        conv.lin.weight.copy_(w.t())
        conv.bias.copy_(b)
    return conv


def _build_pyg_convs(weights: Weights, cls):
    return [_copy_pyg(cls(w.shape[0], w.shape[1], cached=True).to(w.device), w, b)
            for w, b in ((weights.w1, weights.b1), (weights.w2, weights.b2))]


def unavailable(impl: str, device) -> str | None:
    """Why ``impl`` cannot run on ``device`` here (its framework is missing or cannot run there),
    or ``None`` when it can; imports the framework to find out."""
    try:
        _import(impl, torch.device(device))
    except ImplUnavailable as err:
        return str(err)
    except ImportError as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    return None


def _import(impl: str, device: torch.device) -> None:
    if impl not in IMPLS + VARIANTS:
        raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS + VARIANTS)}")
    if impl in (*FGPLUGIN_PYG, "pyg-edge_index", "pyg-adj_t"):
        require_pyg()
        import torch_geometric.nn  # noqa: F401
        import torch_geometric.transforms  # noqa: F401
        if impl in FGPLUGIN_PYG:
            import fgplugin.pyg  # noqa: F401
    elif impl in ("dgl", "fgplugin-dgl"):
        require_dgl(device)
        import dgl.nn  # noqa: F401
        if impl == "fgplugin-dgl":
            import fgplugin.dgl  # noqa: F401


def fgplugin_adjacency(edge_index: torch.Tensor, num_nodes: int, perm: torch.Tensor | None = None):
    """fgplugin's graph as the benchmarks run it: ``threshold="auto"`` (the probe picks the
    density threshold per graph; 0.05 off CUDA), with its CUDA kernel plans built here, so the
    probe and the plans count as preprocessing rather than hiding in the warm-up steps."""
    from fgplugin import TiledAdjacency

    adj = TiledAdjacency.from_edge_index(edge_index, num_nodes, perm=perm, threshold="auto")
    adj.prepare()
    return adj


def build(impl: str, weights: Weights, edge_index: torch.Tensor, num_nodes: int, *, adj=None,
          dropout: float = 0.5):
    """The ``impl`` model with ``weights`` and its graph object for ``edge_index`` (no self loops,
    both directions stored, on the weights' device).

    Args:
        adj: a ready :class:`fgplugin.TiledAdjacency` of the same graph for ``fgplugin`` (built
            here when ``None``).

    Returns:
        ``(model, graph, setup_seconds)``: call ``model(x, graph)``; ``setup_seconds`` is the time
        to build the graph object (the impl's own preprocessing).

    Raises:
        ImplUnavailable: the framework is missing or cannot run on this device.
        ValueError: unknown impl.
    """
    device = edge_index.device
    _import(impl, device)  # imports are not preprocessing: time only the graph objects
    start = time.perf_counter()
    if impl in FGPLUGIN_PYG:
        import fgplugin
        import fgplugin.pyg as fgpyg
        if adj is None:
            adj = fgplugin_adjacency(edge_index, num_nodes)
        graph = adj
        convs = _build_pyg_convs(weights, fgpyg.GCNConv)
    elif impl in ("pyg-edge_index", "pyg-adj_t"):
        from torch_geometric.nn import GCNConv
        if impl == "pyg-edge_index":
            graph = edge_index
        else:
            import torch_geometric.transforms as T
            from torch_geometric.data import Data
            graph = T.ToSparseTensor(layout=torch.sparse_csr)(Data(edge_index=edge_index, num_nodes=num_nodes)).adj_t
        convs = _build_pyg_convs(weights, GCNConv)
    elif impl in ("dgl", "fgplugin-dgl"):
        dgl = require_dgl(device)
        if impl == "dgl":
            from dgl.nn import GraphConv
        else:
            from fgplugin.dgl import GraphConv, structure
        graph = dgl.add_self_loop(dgl.remove_self_loop(
            dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes, device=device)))
        if impl == "fgplugin-dgl":
            structure(graph)  # the tile plan, cached on the graph: preprocessing, not the first epoch
        convs = []
        for w, b in ((weights.w1, weights.b1), (weights.w2, weights.b2)):
            conv = GraphConv(w.shape[0], w.shape[1], norm="both", allow_zero_in_degree=True).to(device)
            with torch.no_grad():
                conv.weight.copy_(w)
                conv.bias.copy_(b)
            convs.append(_DGLConv(conv))
    elif impl == "dgl-path":
        graph = DGLPathGraph(edge_index, num_nodes)
        convs = [DGLPathConv(weights.w1, weights.b1), DGLPathConv(weights.w2, weights.b2)]
    elif impl == "cusparse-cached":
        graph = CachedCSRGraph(edge_index, num_nodes)
        convs = [CachedCSRConv(weights.w1, weights.b1), CachedCSRConv(weights.w2, weights.b2)]
    else:
        raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS + VARIANTS)}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    setup = time.perf_counter() - start
    if impl in FGPLUGIN_DROPOUT:
        from fgplugin import Dropout as dropout_cls
    else:
        dropout_cls = nn.Dropout
    return GCN2(*convs, dropout=dropout_cls(dropout)).to(device), graph, setup

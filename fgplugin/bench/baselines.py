"""The models of the ``epoch`` suite, each in six implementations with identical weights.

Models (``MODELS``), all ``conv2(dropout(relu(conv1(x))))`` with dropout 0.5:

- ``gcn``: ``conv(h) = D^-1/2 (A + I) D^-1/2 h W + b`` (PyG ``GCNConv``, DGL ``GraphConv(norm='both')``);
- ``gcn-input-dropout``: the same with dropout on the input too, as PyG's ``examples/gcn.py``
  and DGL's GCN example have it (the first layer's input then changes every step);
- ``sage``: ``conv(h) = mean_{j in N(i)} h_j W_l + h_i W_r + b`` (PyG ``SAGEConv``, DGL
  ``SAGEConv('mean')``; no self loops).

Implementations, from the same weights (:func:`reference_weights`):

- ``fgplugin``: :class:`fgplugin.pyg.GCNConv` (what ``fgplugin.pyg.convert`` gives) on a
  :class:`fgplugin.TiledAdjacency`; like stock PyG it multiplies by W before aggregating;
- ``fgplugin-kernels``: ``fgplugin`` with all it adds beyond its SpMM kernels switched off, so
  that it runs every product and every op the baselines run: the first layer aggregates its
  (constant) input every step (fgplugin.input_cache), the last layer's backward product reads
  every row of its gradient (fgplugin.grad_rows), and dropout is torch's. The kernels' share of
  the ``fgplugin`` row's gain;
- ``fgplugin-graphed``: the ``fgplugin`` model trained by :func:`fgplugin.graphed_step` (the whole
  step captured as one CUDA graph; eager, with a warning, off CUDA);
- ``<baseline>-graphed`` (``GRAPHED_BASELINES``): a baseline's model trained by the same captured
  step, :func:`fgplugin.graphed_step` on the stock model: the capture is open to any model whose
  step has no host sync, so these rows tell what fgplugin's captured step gains beyond capture;
- ``fgplugin-sharded``: the ``fgplugin`` model through fgplugin.distributed on a one-rank process
  group (``shard`` + ``replicate``): the distributed wrapper's cost over ``fgplugin``;
- ``fgplugin-torch-dropout``: ``fgplugin`` with torch's dropout (``convert(model, dropout=False)``),
  which separates the gain of fgplugin's CPU dropout (fgplugin.parallel_dropout) from the rest;
- ``fgplugin-dgl``: :class:`fgplugin.dgl.GraphConv` (what ``fgplugin.dgl.convert`` gives) on the
  same DGL graph as ``dgl``: DGL's order of operations, fgplugin's SpMM;
- ``dgl``: stock ``dgl.nn.GraphConv(norm='both')`` on a DGL graph with self loops (``SAGEConv``
  on the graph as it is);
- ``dgl-path``: DGL's GPU code path rebuilt from torch ops (:class:`DGLPathConv`,
  :class:`DGLPathSAGEConv`);
- ``cusparse-cached``: normalized CSR and its transpose built once (:class:`CachedCSRConv`,
  :class:`CachedCSRSAGEConv`);
- ``pyg-edge_index`` / ``pyg-adj_t``: stock ``torch_geometric.nn.GCNConv(cached=True)`` (``SAGEConv``) on
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
# fgplugin with torch's dropout only; and fgplugin's model run through fgplugin.distributed on one rank
# (shard + DDP), whose difference to fgplugin is the distributed wrapper's cost; and fgplugin's model
# trained by a step captured as one CUDA graph (fgplugin.graphed_step).
# Baselines trained by the captured step too (see the module doc).
GRAPHED_BASELINES = ("pyg-edge_index-graphed", "pyg-adj_t-graphed", "dgl-path-graphed", "cusparse-cached-graphed")
VARIANTS = ("fgplugin-dgl", "fgplugin-kernels", "fgplugin-torch-dropout", "fgplugin-sharded", "fgplugin-graphed",
            *GRAPHED_BASELINES)
MODELS = ("gcn", "gcn-input-dropout", "sage")
# the same convs on the same adjacency
FGPLUGIN_PYG = ("fgplugin", "fgplugin-kernels", "fgplugin-torch-dropout", "fgplugin-graphed")
# what convert() gives: fgplugin.Dropout
FGPLUGIN_DROPOUT = ("fgplugin", "fgplugin-dgl", "fgplugin-sharded", "fgplugin-graphed")


def captured(impl: str) -> bool:
    """Whether ``impl`` trains by a step captured as one CUDA graph (fgplugin.graphed_step)."""
    return impl.endswith("-graphed")


def model_impl(impl: str) -> str:
    """The impl whose model and graph ``impl`` trains: the baseline of a ``GRAPHED_BASELINES`` row."""
    return impl.removesuffix("-graphed") if impl in GRAPHED_BASELINES else impl


class ImplUnavailable(RuntimeError):
    """An implementation cannot run here (missing framework, unsupported device); the message is
    what the result row's ``error`` says."""


@dataclass
class Weights:
    """The two layers' parameters: ``w1 [in, hidden]``, ``b1 [hidden]``, ``w2 [hidden, out]``,
    ``b2 [out]``, and for ``sage`` the root weights ``r1 [in, hidden]``, ``r2 [hidden, out]``."""
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    r1: torch.Tensor | None = None
    r2: torch.Tensor | None = None

    def layers(self):
        """``(w, b, r)`` of each layer."""
        return (self.w1, self.b1, self.r1), (self.w2, self.b2, self.r2)


def reference_weights(in_feats: int, hidden: int, out_feats: int, seed: int = 0, device="cpu",
                      root: bool = False) -> Weights:
    """Glorot-uniform weights and zero biases (PyG's and DGL's initialization), seeded; ``root``
    adds SAGE's root weights."""
    gen = torch.Generator().manual_seed(seed)

    def glorot(fan_in, fan_out):
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return ((torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * a).to(device)

    w = Weights(glorot(in_feats, hidden), torch.zeros(hidden, device=device),
                glorot(hidden, out_feats), torch.zeros(out_feats, device=device))
    if root:
        w.r1, w.r2 = glorot(in_feats, hidden), glorot(hidden, out_feats)
    return w


class TwoLayers(nn.Module):
    """``conv2(dropout(relu(conv1(input_dropout(x), g))), g)``; every conv is called as
    ``conv(x, g)``; ``input_dropout`` may be ``None`` (the ``gcn`` and ``sage`` models)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, dropout: nn.Module, input_dropout: nn.Module | None = None):
        super().__init__()
        self.conv1, self.conv2, self.dropout, self.input_dropout = conv1, conv2, dropout, input_dropout

    def forward(self, x, g):
        if self.input_dropout is not None:
            x = self.input_dropout(x)
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


def _product(graph, h, transpose: bool = False):
    """``A @ h`` on ``graph.csr(h.dtype)`` (asked for per call), or with ``transpose`` ``A^T @ h``
    on ``graph.transposed(h.dtype)``. In the features' dtype: cuSPARSE multiplies no float32
    matrix with 16-bit features, so under autocast the graph keeps a 16-bit copy of its values, as
    a user running this model under autocast would have to."""
    if transpose:
        return torch.sparse.mm(graph.transposed(h.dtype), h.contiguous())
    return torch.sparse.mm(graph.csr(h.dtype), h)


class _SpMM(torch.autograd.Function):
    """``A @ h`` (:func:`_product`); backward ``A^T @ g``."""

    @staticmethod
    def forward(ctx, h, graph):
        ctx.graph = graph
        return _product(graph, h)

    @staticmethod
    def backward(ctx, grad):
        return _product(ctx.graph, grad, transpose=True), None


class _PerDtype:
    """Built once per dtype: ``get(dtype, make)``; ``made`` holds those already there."""

    def __init__(self, made: dict | None = None):
        self._made = dict(made or {})

    def get(self, dtype, make):
        if dtype not in self._made:
            self._made[dtype] = make()
        return self._made[dtype]


class DGLPathGraph:
    """What DGL holds for a graph (with self loops added for GCN, as given for SAGE): CSR (rows =
    destination) with an all-ones value array, the transposed CSR (DGL's CSC, built once, reused
    by every backward), and degrees."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, self_loops: bool = True):
        rowptr, col, row = _csr_of(edge_index, num_nodes, self_loops)
        self.n = num_nodes
        self.rowptr, self.col, self.row = rowptr, col, row
        self._ones, self._transposed = _PerDtype(), _PerDtype()
        self.in_deg = torch.diff(rowptr).float()
        self.out_deg = torch.bincount(col, minlength=num_nodes).float()

    def _ones_of(self, dtype):
        return self._ones.get(dtype, lambda: torch.ones(self.col.numel(), device=self.col.device, dtype=dtype))

    def csr(self, dtype=torch.float32):
        """A fresh CSR tensor per call: torch.sparse.mm then sets up cuSPARSE from scratch (uncached)."""
        return _csr_tensor(self.rowptr, self.col, self._ones_of(dtype), self.n)

    def transposed(self, dtype=torch.float32):
        return self._transposed.get(dtype, lambda: _transpose_csr(self.rowptr, self.col, self.row,
                                                                   self._ones_of(dtype), self.n))

    def src_norm(self, dtype=torch.float32):
        """``out_deg^-1/2`` as a column in ``dtype``, computed on each call as DGL's ``GraphConv``
        does (which casts the degrees to its input features' dtype first)."""
        return self.out_deg.to(dtype).clamp(min=1).pow(-0.5).unsqueeze(1)

    def dst_norm(self, dtype=torch.float32):
        """``in_deg^-1/2`` as a column in ``dtype``, as :meth:`src_norm`."""
        return self.in_deg.to(dtype).clamp(min=1).pow(-0.5).unsqueeze(1)


def dgl_path_product(h, g: DGLPathGraph):
    """DGL ``GraphConv(norm='both')``'s aggregation without its weight, ``D_in^-1/2 (A + I)
    D_out^-1/2 h``, by :class:`DGLPathConv`'s ops: ``h * out_deg^-1/2``, the uncached SpMM with
    all-ones values, ``* in_deg^-1/2``, the scales in h's dtype as DGL has them (no autograd: the
    spmm suite's forward ``dgl-path`` row)."""
    return _product(g, h * g.src_norm(h.dtype)) * g.dst_norm(h.dtype)


def dgl_path_adjoint(grad, g: DGLPathGraph, src_norm, dst_norm):
    """The backward of :func:`dgl_path_product` as autograd runs it: ``grad * in_deg^-1/2``, the
    SpMM on the transposed CSR (built on first use, then reused), ``* out_deg^-1/2``; ``src_norm``
    and ``dst_norm`` are the forward's (:meth:`DGLPathGraph.src_norm`, ``dst_norm`` in the
    features' dtype), which autograd keeps rather than computing again."""
    return _product(g, grad * dst_norm, transpose=True) * src_norm


class DGLPathConv(nn.Module):
    """DGL ``GraphConv(norm='both')``'s code path from torch ops: ``h * out_deg^-1/2``, then W first
    when ``in_feats > out_feats`` (else after), the un-normalized SpMM, ``* in_deg^-1/2``, ``+ b``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x, g: DGLPathGraph):
        h = x * g.src_norm()
        if self.weight.shape[0] > self.weight.shape[1]:
            h = _SpMM.apply(h @ self.weight, g)
        else:
            h = _SpMM.apply(h, g) @ self.weight
        return h * g.dst_norm() + self.bias


class CachedCSRGraph:
    """``D^-1/2 (A + I) D^-1/2`` (``norm="gcn"``) or ``D^-1 A`` (``"mean"``) as a CSR tensor and
    its transpose, both built once (per dtype)."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, norm: str = "gcn"):
        rowptr, col, row = _csr_of(edge_index, num_nodes, self_loops=norm == "gcn")
        deg = torch.diff(rowptr).float().clamp(min=1)
        if norm == "gcn":
            values = deg.rsqrt()[row] * deg.rsqrt()[col]
        else:
            values = deg.reciprocal()[row]
        self._fwd = _PerDtype({values.dtype: _csr_tensor(rowptr, col, values, num_nodes)})
        self._transposed = _PerDtype({values.dtype: _transpose_csr(rowptr, col, row, values, num_nodes)})

    def csr(self, dtype=torch.float32):
        return self._fwd.get(dtype, lambda: self.csr().to(dtype))

    def transposed(self, dtype=torch.float32):
        return self._transposed.get(dtype, lambda: self.transposed().to(dtype))


class CachedCSRConv(DGLPathConv):
    """The strongest plain baseline: one cached SpMM on the normalized CSR, W on the narrow side."""

    def forward(self, x, g: CachedCSRGraph):
        if self.weight.shape[0] > self.weight.shape[1]:
            h = _SpMM.apply(x @ self.weight, g)
        else:
            h = _SpMM.apply(x, g) @ self.weight
        return h + self.bias


class DGLPathSAGEConv(nn.Module):
    """DGL ``SAGEConv('mean')``'s code path from torch ops: ``fc_neigh`` first when ``in_feats >
    out_feats`` (else after) around the un-normalized SpMM divided by the in-degree, plus
    ``fc_self(h)`` with its bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, root: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())
        self.root = nn.Parameter(root.clone())

    def _mean(self, h, g):
        return _SpMM.apply(h, g) / g.in_deg.clamp(min=1).unsqueeze(1)

    def forward(self, x, g: DGLPathGraph):
        if self.weight.shape[0] > self.weight.shape[1]:
            neigh = self._mean(x @ self.weight, g)
        else:
            neigh = self._mean(x, g) @ self.weight
        return torch.addmm(self.bias, x, self.root) + neigh


class CachedCSRSAGEConv(DGLPathSAGEConv):
    """SAGE (mean) on the cached ``D^-1 A``: one cached SpMM, ``W_l`` on the narrow side."""

    def _mean(self, h, g: CachedCSRGraph):
        return _SpMM.apply(h, g)


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
def _pyg_conv(model: str, module, w, b, r):
    """The layer of ``model`` from PyG's ``module`` (stock ``torch_geometric.nn`` or
    ``fgplugin.pyg``) with the given weights."""
    with torch.no_grad():
        if model == "sage":
            conv = module.SAGEConv(w.shape[0], w.shape[1]).to(w.device)
            conv.lin_l.weight.copy_(w.t())
            conv.lin_l.bias.copy_(b)
            conv.lin_r.weight.copy_(r.t())
        else:
            conv = module.GCNConv(w.shape[0], w.shape[1], cached=True).to(w.device)
            conv.lin.weight.copy_(w.t())
            conv.bias.copy_(b)
    return conv


def _dgl_conv(model: str, module, w, b, r):
    """The layer of ``model`` from DGL's ``module`` (stock ``dgl.nn`` or ``fgplugin.dgl``)."""
    with torch.no_grad():
        if model == "sage":
            conv = module.SAGEConv(w.shape[0], w.shape[1], "mean").to(w.device)
            conv.fc_neigh.weight.copy_(w.t())
            conv.fc_self.weight.copy_(r.t())
            conv.fc_self.bias.copy_(b)
        else:
            conv = module.GraphConv(w.shape[0], w.shape[1], norm="both", allow_zero_in_degree=True).to(w.device)
            conv.weight.copy_(w)
            conv.bias.copy_(b)
    return _DGLConv(conv)


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
    impl = model_impl(impl)
    if impl in (*FGPLUGIN_PYG, "fgplugin-sharded", "pyg-edge_index", "pyg-adj_t"):
        require_pyg()
        import torch_geometric.nn  # noqa: F401
        import torch_geometric.transforms  # noqa: F401
        if impl in FGPLUGIN_PYG:
            import fgplugin.pyg  # noqa: F401
        if impl == "fgplugin-sharded":
            import fgplugin.distributed  # noqa: F401
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
          dropout: float = 0.5, model: str = "gcn"):
    """The ``impl`` implementation of ``model`` with ``weights`` and its graph object for
    ``edge_index`` (no self loops, both directions stored, on the weights' device).

    Args:
        adj: a ready :class:`fgplugin.TiledAdjacency` of the same graph for ``fgplugin`` (built
            here when ``None``).
        model: one of ``MODELS``; ``sage`` needs ``weights`` with root weights.

    Returns:
        ``(model, graph, setup_seconds)``: call ``model(x, graph)``; ``setup_seconds`` is the time
        to build the graph object (the impl's own preprocessing).

    Raises:
        ImplUnavailable: the framework is missing or cannot run on this device.
        ValueError: unknown impl.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    sage = model == "sage"
    if sage and weights.r1 is None:
        raise ValueError("the sage model needs root weights: reference_weights(..., root=True)")
    device = edge_index.device
    _import(impl, device)  # imports are not preprocessing: time only the graph objects
    impl = model_impl(impl)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the previous impl's queued work is not this one's setup
    start = time.perf_counter()
    if impl in FGPLUGIN_PYG or impl in ("pyg-edge_index", "pyg-adj_t"):
        if impl in FGPLUGIN_PYG:
            import fgplugin.pyg as module
            graph = adj if adj is not None else fgplugin_adjacency(edge_index, num_nodes)
        else:
            import torch_geometric.nn as module
            graph = edge_index
            if impl == "pyg-adj_t":
                import torch_geometric.transforms as T
                from torch_geometric.data import Data
                graph = T.ToSparseTensor(layout=torch.sparse_csr)(Data(edge_index=edge_index,
                                                                       num_nodes=num_nodes)).adj_t
        convs = [_pyg_conv(model, module, *layer) for layer in weights.layers()]
    elif impl in ("dgl", "fgplugin-dgl"):
        dgl = require_dgl(device)
        graph = dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes, device=device)
        if not sage:
            graph = dgl.add_self_loop(dgl.remove_self_loop(graph))
        if impl == "dgl":
            import dgl.nn as module
        else:
            import fgplugin.dgl as module
            module.structure(graph)  # the tile plan, cached on the graph: preprocessing, not the first epoch
        convs = [_dgl_conv(model, module, *layer) for layer in weights.layers()]
    elif impl == "fgplugin-sharded":
        import fgplugin.pyg as module
        graph = _one_rank_adjacency(edge_index, num_nodes)
        convs = [_pyg_conv(model, module, *layer) for layer in weights.layers()]
    elif impl == "dgl-path":
        graph = DGLPathGraph(edge_index, num_nodes, self_loops=not sage)
        convs = [DGLPathSAGEConv(w, b, r) if sage else DGLPathConv(w, b) for w, b, r in weights.layers()]
    elif impl == "cusparse-cached":
        graph = CachedCSRGraph(edge_index, num_nodes, norm="mean" if sage else "gcn")
        convs = [CachedCSRSAGEConv(w, b, r) if sage else CachedCSRConv(w, b) for w, b, r in weights.layers()]
    else:
        raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS + VARIANTS)}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    setup = time.perf_counter() - start
    if impl in FGPLUGIN_DROPOUT:
        from fgplugin import Dropout as dropout_cls
    else:
        dropout_cls = nn.Dropout
    input_dropout = dropout_cls(dropout) if model == "gcn-input-dropout" else None
    net = TwoLayers(*convs, dropout=dropout_cls(dropout), input_dropout=input_dropout).to(device)
    if impl == "fgplugin-sharded":
        from fgplugin.distributed import replicate
        net = replicate(net, graph.ctx)
    return net, graph, setup


_OWN_GROUP = False  # the default process group was made by _one_rank_adjacency


def end_one_rank_group() -> None:
    """Destroys the one-rank process group that ``fgplugin-sharded`` made, if it made one (call
    when its model is gone), so that the process can make another group later."""
    global _OWN_GROUP
    import torch.distributed as dist

    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP = False


def _one_rank_adjacency(edge_index: torch.Tensor, num_nodes: int):
    """``fgplugin.distributed``'s sharded adjacency of the whole graph on a process group of this
    process alone (NCCL on a GPU, gloo on the CPU; made here when none exists): what one rank of
    the distributed wrapper runs, timed in the same process as plain ``fgplugin``."""
    import torch.distributed as dist
    from fgplugin.distributed import ShardedAdjacency, ShardingContext

    global _OWN_GROUP
    device = edge_index.device
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        _OWN_GROUP = True
    if dist.get_world_size() != 1:
        raise ImplUnavailable("fgplugin-sharded times one rank; this process is in a group of "
                              f"{dist.get_world_size()} (run the scaling suite for several)")
    return ShardedAdjacency(ShardingContext(1), edge_index, num_nodes, threshold="auto")  # as fgplugin_adjacency

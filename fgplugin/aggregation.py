r"""The one aggregation path of fgplugin's layers: :func:`aggregate`.

Every drop-in layer (PyG's GCNConv, SAGEConv, SGConv, LGConv; DGL's GraphConv, SAGEConv, SGConv)
and the distributed path hand their aggregation to :func:`aggregate`, which computes

.. math::
    \mathrm{out} = (\hat A^{K} X)\, W + b

(``W``, ``b`` optional, ``K`` = ``hops``) and owns the shortcuts, each written once here:

- **kept input aggregation**: when ``X`` is a constant input (fgplugin.input_cache), ``A^K X`` is
  kept from the second call on and only the dense product runs; or, where ``X`` is mostly zeros
  and that is faster, ``X`` itself is kept as a sparse matrix and ``A^K (X W)`` runs with ``X W``
  on the SpMM (fgplugin.sparse_input);
- **order**: ``A (X W)`` when ``W`` narrows the features (fewer columns to aggregate), else
  ``(A X) W``, as DGL's GraphConv chooses;
- **padding**: where the kernel wants wider rows than ``W``'s columns (47 on CUDA: 48), ``W``
  gets zero columns, so the product's input comes out as wide as the SpMM wants it, and the
  SpMM's output pass cuts the extra columns;
- **bias fusion**: ``A (X W) + b`` with the bias added in the SpMM's output pass (the ``bias``
  of :func:`fgplugin.spmm`), ``(A X) W + b`` as one ``addmm``;
- and, inside the product's backward pass, the **zero-row skipping** of fgplugin.grad_rows.

The ``graph`` argument is anything that aggregates node features the same way on one device or
across ranks:

- ``graph(x)``: the normalized product ``Â x`` of a 2-D ``x`` ``[n_src, F]`` -> ``[n_dst, F]``;
- ``graph.shape`` (``(n_dst, n_src)``), ``graph.device``;
- ``graph.key``: a tuple that identifies what the product depends on (graph, edge values,
  normalization) for the kept input aggregation, or ``()`` when it must not be kept;
- ``graph.vector_width(features, dtype)``: the width its products want for ``features``
  columns of ``dtype``.

:class:`Aggregation` (an adjacency with its normalization) is the single-device one; the PyG
layers' ``torch.compile`` path has one of its own (``fgplugin.pyg``), and
``fgplugin.distributed.ShardedGraph`` is the sharded one.
"""
from __future__ import annotations

import contextlib
import sys
from typing import NamedTuple

import torch
from torch import Tensor
from torch.overrides import has_torch_function

from . import cusparse, input_cache, layer_calls, ops, sparse_input
from .normalization import Normalization
from .ops import padded_width
from .repeated_calls import need_grads
from .tiling import TiledAdjacency

NO_NORM = Normalization(None, None, None)


class Aggregation(NamedTuple):
    """The normalized product ``diag(r) (A + diag(d)) diag(c) x`` of one (weighted) adjacency:
    ``adj`` with ``norm = (r, c, d)``. ``key`` is what they were built from (the graph object,
    the edge values, the normalization settings): equal keys mean equal products, which the kept
    input aggregation relies on; ``()`` keeps nothing."""

    adj: TiledAdjacency
    norm: Normalization = NO_NORM
    key: tuple = ()

    @classmethod
    def of(cls, adj: TiledAdjacency, norm: str = "gcn", **options) -> "Aggregation":
        """The product of ``adj`` under the normalization ``norm`` (``adj.norm(norm, **options)``;
        ``"none"`` for the plain sum), keyed by the adjacency and the normalization. The scales are
        float64 unless ``dtype`` is given: pass the features' (``torch.float32`` for float32 and
        16-bit training) to save a cast per product."""
        scales = NO_NORM if norm == "none" else adj.norm(norm, **options)
        return cls(adj, scales, (adj, adj.values, norm, tuple(sorted(options.items()))))

    @property
    def shape(self) -> tuple[int, int]:
        return self.adj.shape

    @property
    def device(self) -> torch.device:
        return self.adj.device

    def __call__(self, x: Tensor, bias: Tensor | None = None, width: int | None = None) -> Tensor:
        """``Â x``; with ``bias`` and ``width``, its first ``width`` columns plus ``bias``, in the
        product's output pass (:func:`fgplugin.spmm`)."""
        return ops.spmm(self.adj, x, *self.norm, bias=bias, width=width)

    def vector_width(self, features: int, dtype: torch.dtype) -> int:
        return padded_width(features, dtype, self.adj.device, self.adj.nnz)


def aggregate(graph, x: Tensor, *, weight: Tensor | None = None, bias: Tensor | None = None, hops: int = 1,
              owner: torch.nn.Module | None = None, settings: tuple = (), node_dim: int = 0,
              fresh: bool = False) -> Tensor:
    r"""``(Â^hops x) weight + bias`` over ``graph`` (see the module doc), with the shortcuts.

    Args:
        graph: an aggregation (:class:`Aggregation`, a sharded graph, ...).
        x: node features ``[n_src, F]``; a layer's ``[batch, nodes, F]`` input (PyG's static
            graphs) aggregates over ``node_dim``.
        weight: ``[F, out]`` (a ``Linear``'s ``weight.t()``), or ``None`` for the aggregation alone.
        bias: ``[out]`` added to the result (``[F]`` without ``weight``), or ``None``.
        hops: how many times to aggregate (SGConv's K).
        owner: the layer whose kept input aggregation this call may use and fill, or ``None``;
            a layer that asked for it (fgplugin.layer_calls) also gets this call's decision noted.
        settings: the owner's options that change the aggregation beyond ``graph.key``.
        node_dim: the node dimension of ``x``.
        fresh: the caller hands the result to code that may write to it in place (the user's, an
            activation): without ``weight`` and ``bias`` a kept aggregation is then copied.
    """
    if x.layout != torch.strided:  # sparse features: the stock order, no shortcuts
        out = _propagate(graph, x if weight is None else x @ weight, hops, node_dim)
        return out if bias is None else out + bias
    kept = _kept(graph, x, hops, owner, settings, node_dim, weight)
    if isinstance(kept, sparse_input.SparseInput):
        return _aggregate_transformed(graph, kept, weight, bias, hops, 0, owner, layer_calls.KEPT_INPUT)
    if kept is not None:
        if weight is not None and hops == 1 and isinstance(graph, Aggregation) and layer_calls.asked(owner):
            # the sparse form's width too: a repeated call serves the form the cache holds then,
            # which a trial of the two forms switches (computed only for a layer that keeps its call)
            width = graph.vector_width(weight.shape[1], _product_dtype(x, weight))
            layer_calls.decided(owner, layer_calls.KEPT_INPUT, graph.adj, graph.norm, width)
        if fresh and weight is None and bias is None:
            # a copy, as stock's output is a fresh tensor: an in-place op on it (an activation, the
            # user's own writes, DGL SGConv's norm) must not reach what later calls are served
            return kept.clone()
        return transform_with_bias(kept, weight, bias)
    if weight is not None and weight.shape[0] > weight.shape[1]:
        return _aggregate_transformed(graph, x, weight, bias, hops, node_dim, owner)
    if weight is not None and hops == 1 and layer_calls.asked(owner) and type(graph).__call__ is Aggregation.__call__ \
            and x.dim() == 2 and node_dim % 2 == 0:
        layer_calls.decided(owner, layer_calls.AGGREGATED, graph.adj, graph.norm)
    return transform_with_bias(_propagate(graph, x, hops, node_dim), weight, bias)


def aggregate_as_decided(decision: layer_calls.Decision, owner: torch.nn.Module, x: Tensor, weight: Tensor,
                         bias: Tensor | None) -> Tensor | None:
    """What :func:`aggregate` returns for a call like the one that made ``decision``
    (fgplugin.layer_calls), with the same ops; ``weight``: the layer's linear map's ``[out, F]``
    (``x W^T``). ``None`` where the decision no longer applies (the graph was freed, the input
    cache let go of ``x``'s aggregation, the product's kept call was let go of): then call
    :func:`aggregate`."""
    parts = decision.aggregation_parts()
    # edge values or scales that came to need a gradient (``requires_grad_`` changes no version):
    # the scales noted with the decision, and a kept input, were computed without it; the full
    # path computes them afresh. Asked before the input cache counts a call on trial.
    if parts is None or need_grads(parts[0].values, *parts[1]):
        return None
    if decision.kind == layer_calls.KEPT_INPUT:  # in the form the input cache holds now
        kept = input_cache.of(owner).kept_for_call(x)
        if kept is None:
            return None
        if isinstance(kept, Tensor):
            return transform_with_bias(kept, weight.t(), bias)
        return _transformed_product(Aggregation(*parts), kept, weight.t(), bias, decision.width)
    if decision.kind == layer_calls.AGGREGATED:
        return transform_with_bias(Aggregation(*parts)(x), weight.t(), bias)
    product = layer_calls.product_call(decision)
    # a weight or bias with a __torch_function__ of its own must see its ops: the C++ call skips it
    if product is None or has_torch_function((weight, bias)):
        return _transformed_product(Aggregation(*parts), x, weight.t(), bias, decision.width)
    if product is False:
        return None
    return product.transformed(x, weight, decision.width - weight.shape[0], *parts[1], bias)


def is_distributed(obj, module: str, name: str) -> bool:
    """Whether ``obj`` is an instance of class ``name`` of ``fgplugin.distributed.<module>`` (for
    the adapters, which take a sharded graph where they take a graph); without that module
    imported nothing can be one, and fgplugin.distributed is not imported for the test."""
    loaded = sys.modules.get(f"fgplugin.distributed.{module}")
    return loaded is not None and isinstance(obj, getattr(loaded, name))


def _propagate(graph, x: Tensor, hops: int, node_dim: int = 0) -> Tensor:
    """``Â^hops x`` over the node dimension ``node_dim`` (other dimensions folded into features)."""
    if x.dim() != 2 or node_dim % x.dim() != 0:
        moved = x.movedim(node_dim, 0)
        out = _propagate(graph, moved.reshape(moved.shape[0], -1), hops)
        return out.view(out.shape[0], *moved.shape[1:]).movedim(0, node_dim)
    for _ in range(hops):
        x = graph(x)
    return x


def _kept(graph, x: Tensor, hops: int, owner, settings: tuple, node_dim: int,
          weight: Tensor | None = None) -> Tensor | sparse_input.SparseInput | None:
    """What an earlier call kept when ``x`` is a constant input over the same graph
    (fgplugin.input_cache): ``Â^hops x``, or, for a layer with a ``weight`` where that is faster,
    ``x`` as a :class:`fgplugin.sparse_input.SparseInput`; else ``None``."""
    if owner is None or not graph.key:
        return None
    cache = input_cache.of(owner)
    if not cache.admits(x):
        return None
    nbytes = x.numel() // max(x.shape[node_dim], 1) * graph.shape[0] * x.element_size()
    may_be_sparse = weight is not None and weight.dim() == 2 and x.dim() == 2 and node_dim % 2 == 0 \
        and isinstance(graph, Aggregation)

    def keep():
        def dense():
            # made once: its products do not time the cuSPARSE route (the sparse form's timing,
            # of products that repeat every step, runs them as the steps will)
            with cusparse.computed_once():
                return _propagate(graph, x, hops, node_dim)
        return sparse_input.keep(graph, x, weight.shape[1], hops, dense) if may_be_sparse else dense()

    # under autocast the aggregation is kept in the autocast dtype: a call in another precision
    # (a float32 evaluation after bf16 training) must not reuse it
    precision = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else None
    return cache.get(x, (*graph.key, hops, node_dim, may_be_sparse, precision, *settings), nbytes, keep)


def _aggregate_transformed(graph, x: Tensor | sparse_input.SparseInput, weight: Tensor, bias: Tensor | None,
                           hops: int, node_dim: int, owner: torch.nn.Module | None = None,
                           kind: str = layer_calls.TRANSFORMED) -> Tensor:
    """``Â^hops (x W) + bias``, with ``W`` padded by zero columns to the width the products want:
    the last product cuts them and adds the bias in its output pass where the graph is an
    :class:`Aggregation` (fgplugin's kernels; a layer's bias add is a pass over its output: 0.45 ms
    of a 13 ms GCN training step on products-like, H100), else :class:`_CutColumns` does. ``kind``:
    the decision noted for a layer deciding its call (fgplugin.layer_calls), ``KEPT_INPUT`` where
    ``x`` is the sparse form of its kept input."""
    out = weight.shape[1]
    width = graph.vector_width(out, _product_dtype(x, weight))
    # Aggregation's own call takes the epilogue; a subclass's may keep the plain graph(x)
    if type(graph).__call__ is Aggregation.__call__ and hops >= 1 and len(x.shape) == 2 and node_dim % 2 == 0:
        if hops == 1:
            layer_calls.decided(owner, kind, graph.adj, graph.norm, width)
        return _transformed_product(graph, x, weight, bias, width, hops, owner)
    h = _padded_product(x, weight, width)
    if width == out:
        return _plus_bias(_propagate(graph, h, hops, node_dim), bias)
    padded = _propagate(graph, h, hops, node_dim)
    return _CutColumns.apply(padded, out, None if bias is None else _autocast_bias(bias, padded))


def _transformed_product(graph: Aggregation, x: Tensor, weight: Tensor, bias: Tensor | None, width: int,
                         hops: int = 1, owner: torch.nn.Module | None = None) -> Tensor:
    """``graph^hops (x @ weight) + bias`` with ``weight`` padded by zero columns to ``width``, the
    bias added and the padding cut in the last product's output pass. For a layer (``owner``)
    deciding its call (fgplugin.layer_calls), the product's kept call is noted with the decision."""
    h = _padded_product(x, weight, width)
    deciding = hops == 1 and layer_calls.asked(owner)
    route_before = cusparse.choice_at(graph.adj, width) if deciding else None
    out = graph(_propagate(graph, h, hops - 1), bias, weight.shape[1])
    if deciding:
        # this product was the first at its width: the next one chooses its route (fgplugin.cusparse)
        left_open = route_before is None and cusparse.choice_at(graph.adj, width) == cusparse.SEEN_ONCE
        layer_calls.decided_product(owner, graph.adj, h, graph.norm, bias, weight.shape[1], left_open)
    return out


def _padded_product(x: Tensor, weight: Tensor, width: int) -> Tensor:
    """``x @ weight`` with ``weight`` padded by zero columns to ``width``."""
    pad = width - weight.shape[1]
    return x @ weight if pad == 0 else x @ torch.nn.functional.pad(weight, (0, pad))


def _plus_bias(out: Tensor, bias: Tensor | None) -> Tensor:
    return out if bias is None else out + _autocast_bias(bias, out)


def _autocast_bias(bias: Tensor, out: Tensor) -> Tensor:
    """``bias`` in ``out``'s 16-bit dtype under autocast, as ``F.linear`` adds its bias there: the
    layer's output stays in the autocast dtype instead of being promoted to float32, which would
    cost a float32 pass for the add and for every elementwise op after it, and a cast back before
    the next layer's matmul (products-like, bf16, on an H100: the float32 add alone took 1.2 ms of a
    32.5 ms training step)."""
    if bias.dtype != out.dtype and torch.is_autocast_enabled(out.device.type):
        return bias.to(out.dtype)
    return bias


def _product_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype of ``x @ weight`` (under autocast, the autocast dtype)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.promote_types(x.dtype, weight.dtype)


def linear_parts(module, kinds: tuple = (torch.nn.Linear,)) -> tuple[Tensor, Tensor | None] | None:
    """``(weight.t(), bias)`` of a linear map that :func:`aggregate` may apply itself: one of
    ``kinds`` (classes computing ``x W^T + b``), initialized, without hooks; else ``None`` (the
    caller applies the module)."""
    if type(module) not in kinds or module._forward_hooks or module._forward_pre_hooks:
        return None
    # the mixin, not UninitializedParameter: Parameter's metaclass makes isinstance on it a Python call
    if isinstance(module.weight, torch.nn.parameter.UninitializedTensorMixin):
        return None
    return module.weight.t(), module.bias


def transform(x: Tensor, weight: Tensor, bias: Tensor | None, owner: torch.nn.Module) -> Tensor:
    """``x @ weight + bias`` for a layer's product of its input that is not aggregated (SAGE's root
    weight): on the sparse form of ``x`` where ``owner`` keeps one (fgplugin.sparse_input), so
    that no dense GEMM over a mostly-zero input is left in the layer."""
    kept = input_cache.of(owner).kept_for(x)
    if not isinstance(kept, sparse_input.SparseInput):
        return transform_with_bias(x, weight, bias)
    return _plus_bias(kept @ weight, bias)


def transform_with_bias(h: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """``h @ weight + bias`` (either may be ``None``), as one ``addmm`` where it can be: on
    CUDA >= 12.1 cuBLASLt adds the bias in the GEMM's epilogue, which saves a read and a write of
    the output (products-like, an [2.45M, 64] output: 0.45 ms of a 14.3 ms training step on an
    H100)."""
    if weight is None:
        return _plus_bias(h, bias)
    if bias is not None and h.dim() == 2 and weight.dim() == 2 and (
            h.dtype == weight.dtype == bias.dtype or torch.is_autocast_enabled(h.device.type)):
        return torch.addmm(bias, h, weight)  # under autocast all three in the autocast dtype
    out = torch.matmul(h, weight)
    return out if bias is None else out + bias


class _CutColumns(torch.autograd.Function):
    """``z[..., :out] + bias`` (``bias`` may be ``None``), contiguous, with a backward pass that
    writes the padded gradient once (the ``pad_columns`` op) where autograd's slice backward
    fills a zero tensor and copies into it (products-like on an H100: a [2.45M, 48] write, about
    0.16 ms of a 14 ms training step). Written in the ``setup_context`` form, so ``torch.func``
    transforms work through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z, out, bias):
        cut = z[..., :out]
        return cut + bias if bias is not None else cut.contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output):
        z, out, bias = inputs
        ctx.pad = z.shape[-1] - out
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad):
        grad_z = ops.padded_columns(grad, grad.shape[-1] + ctx.pad)
        grad_bias = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(dim=0)
        return grad_z, None, grad_bias


@contextlib.contextmanager
def cached_propagation(cached: bool, device_type: str):
    """The context of an SGConv propagation that ``cached=True`` keeps, for an uncached layer none:
    outside autocast (what is cached stays in the input's precision, as stock's: later calls may
    run without autocast), and computed once (fgplugin.cusparse.computed_once: its products do not
    time the cuSPARSE route)."""
    if not cached:
        yield
        return
    with torch.autocast(device_type, enabled=False), cusparse.computed_once():
        yield

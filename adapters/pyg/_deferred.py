"""The ``torch.compile`` path of the PyG layers for an ``edge_index``: one opaque op per aggregation.

Building a graph's structure (CSR, kernel plans) needs data-dependent shapes, so it cannot be
traced. Under ``torch.compile`` a layer given an ``edge_index`` therefore does not build or look up
anything while tracing: it records a :class:`DeferredAggregation`, and its aggregation becomes one call of
the custom op ``fgplugin::pyg_aggregate(edge_index, edge_weight, x, ...)``, whose output shape
``[n_dst, F]`` is known without running it. The op runs eagerly inside the compiled graph: it finds
(or, the first time, builds) the structure in _graph.py's per-object cache and aggregates with
exactly the eager layer's aggregation (``aggregation_of``). So a model compiled before it has seen its graph has
no graph breaks, and a new ``edge_index`` object needs no recompilation.

Gradients: for ``x`` alone, the adjoint product (``fgplugin.ops.spmm_adjoint``, no forward
recompute). When the edge weights require grad too, the product's own gradients come from
``fgplugin.ops.spmm_vjp`` and are carried back to the weights through the aggregation's values and
scales (which depend on the weights through the degrees) with ``torch.func.vjp``: autograd is off
below a custom op, functorch's transform is not, and that part has no custom op in it. Both use
the spmm op's one gradient formula (``fgplugin.ops.input_grads``). The backward op is not itself
differentiable: double backward through this path raises PyTorch's error for ops without
autograd.
"""
# No `from __future__ import annotations` here: torch 2.4 infers a custom op's schema from its
# annotations as objects and refuses them as strings.
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from fgplugin._csr import aux_dtype_for
from fgplugin.aggregation import Aggregation
from fgplugin.ops import padded_width, spmm_adjoint, spmm_vjp

from ._aggregation import NormSpec, aggregation_of
from ._graph import graph_of


class DeferredAggregation(NamedTuple):
    """An aggregation recorded while tracing: the graph and what to do with it, built when the op
    runs (an aggregation as fgplugin.aggregation defines it; never kept by the input cache)."""

    edge_index: Tensor
    edge_weight: Tensor | None
    n_src: int
    n_dst: int
    flip: bool
    norm: NormSpec
    key: tuple = ()  # what the kept input aggregation keys on: nothing, it is never kept

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_dst, self.n_src)

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def vector_width(self, features: int, dtype: torch.dtype) -> int:
        return padded_width(features, dtype, self.device)

    def __call__(self, x: Tensor) -> Tensor:
        """The aggregation of 2-D ``x`` ``[n_src, F]`` -> ``[n_dst, F]``."""
        return torch.ops.fgplugin.pyg_aggregate(self.edge_index, self.edge_weight, x, self.n_src, self.n_dst,
                                                self.flip, *self.norm)


def _eager_aggregation(edge_index, edge_weight, n_src, n_dst, flip, norm: NormSpec, dtype: torch.dtype) -> Aggregation:
    graph = graph_of(edge_index, n_src, n_dst, flip, strict=True)
    aggregation = aggregation_of(graph, edge_weight, norm, dtype=dtype)
    if aggregation is None:
        raise ValueError("fgplugin: edge_weight must be finite, one float per edge; clean it (e.g. "
                         "torch.nan_to_num) before the layer")
    return aggregation


@torch.library.custom_op("fgplugin::pyg_aggregate", mutates_args=())
def pyg_aggregate(edge_index: Tensor, edge_weight: Optional[Tensor], x: Tensor, n_src: int, n_dst: int, flip: bool,
                  norm: str, improved: bool, add_self_loops: bool) -> Tensor:
    aggregation = _eager_aggregation(edge_index, edge_weight, n_src, n_dst, flip,
                                     NormSpec(norm, improved, add_self_loops), aux_dtype_for(x.dtype))
    with torch.no_grad():  # this op's gradient is registered below
        return aggregation(x)


@pyg_aggregate.register_fake
def _(edge_index, edge_weight, x, n_src, n_dst, flip, norm, improved, add_self_loops):
    torch._check(x.dim() == 2, lambda: "fgplugin::pyg_aggregate: x must be 2-D")
    return x.new_empty((n_dst, x.shape[1]))


@torch.library.custom_op("fgplugin::pyg_aggregate_backward", mutates_args=())
def pyg_aggregate_backward(grad: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor], x: Optional[Tensor],
                           n_src: int, n_dst: int, flip: bool, norm: str, improved: bool, add_self_loops: bool,
                           need_weight: bool) -> tuple[Tensor, Tensor]:
    """(gradient of ``edge_weight`` or an empty tensor, gradient of ``x``); ``x`` is needed (and
    saved) only with ``need_weight``."""
    spec = NormSpec(norm, improved, add_self_loops)
    dtype = aux_dtype_for(grad.dtype)
    aggregation = _eager_aggregation(edge_index, edge_weight, n_src, n_dst, flip, spec, dtype)
    if not need_weight:
        with torch.no_grad():
            return grad.new_empty(0), spmm_adjoint(aggregation.adj, grad, *aggregation.norm)
    with torch.no_grad():
        grads = spmm_vjp(aggregation.adj, x, grad, *aggregation.norm)  # (values, x, row scale, col scale, diag)
    used = [i for i, t in enumerate((aggregation.adj.values, *aggregation.norm)) if t is not None]

    def op_inputs(weight):  # the weights -> what the product was given (CSR values, scales)
        weighted = _eager_aggregation(edge_index, weight, n_src, n_dst, flip, spec, dtype)
        every = (weighted.adj.values, *weighted.norm)
        return tuple(every[i] for i in used)

    _, pullback = torch.func.vjp(op_inputs, edge_weight)
    (grad_weight,) = pullback(tuple(grads[0 if i == 0 else i + 1] for i in used))
    return grad_weight, grads[1]


@pyg_aggregate_backward.register_fake
def _(grad, edge_index, edge_weight, x, n_src, n_dst, flip, norm, improved, add_self_loops, need_weight):
    grad_weight = edge_weight.new_empty(edge_weight.shape) if need_weight else grad.new_empty(0)
    return grad_weight, grad.new_empty((n_src, grad.shape[1]))


def _setup_context(ctx, inputs, output):
    edge_index, edge_weight, x, *spec = inputs
    ctx.spec = spec
    ctx.save_for_backward(edge_index, edge_weight, x if ctx.needs_input_grad[1] else None)


def _backward(ctx, grad):
    edge_index, edge_weight, x = ctx.saved_tensors
    need_weight = ctx.needs_input_grad[1]
    grad_weight, grad_x = torch.ops.fgplugin.pyg_aggregate_backward(grad, edge_index, edge_weight, x, *ctx.spec,
                                                                    need_weight)
    return (None, grad_weight if need_weight else None, grad_x if ctx.needs_input_grad[2] else None) \
        + (None,) * len(ctx.spec)


pyg_aggregate.register_autograd(_backward, setup_context=_setup_context)

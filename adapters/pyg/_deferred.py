"""The ``torch.compile`` path of the PyG layers for an ``edge_index``: one opaque op per aggregation.

Building a graph's structure (CSR, tile plan) needs data-dependent shapes, so it cannot be
traced. Under ``torch.compile`` a layer given an ``edge_index`` therefore does not build or look up
anything while tracing: it records a :class:`DeferredPlan`, and its aggregation becomes one call of
the custom op ``fgplugin::pyg_aggregate(edge_index, edge_weight, x, ...)``, whose output shape
``[n_dst, F]`` is known without running it. The op runs eagerly inside the compiled graph: it finds
(or, the first time, builds) the structure in _graph.py's per-object cache and aggregates with
exactly the eager layer's plan (``plan_of``). So a model compiled before it has seen its graph has
no graph breaks, and a new ``edge_index`` object needs no recompilation.

The op's gradient is for ``x`` only: the adjoint product (``fgplugin.ops.spmm_adjoint``, no
forward recompute). Edge weights that require grad are not deferred (see ``make_plan``): the
scales depend on them through the graph's structure, which a backward formula inside an opaque op
cannot differentiate (autograd is off below a custom op). The backward op is not itself
differentiable: double backward through this path raises PyTorch's error for ops without autograd.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

import fgplugin
from fgplugin.ops import spmm_adjoint

from ._graph import graph_of
from ._plan import NormSpec, Plan, plan_of


class DeferredPlan(NamedTuple):
    """A plan recorded while tracing: the graph and what to do with it, built when the op runs."""

    edge_index: Tensor
    edge_weight: Tensor | None
    n_src: int
    n_dst: int
    flip: bool
    norm: NormSpec

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_dst, self.n_src)

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def aggregate(self, x: Tensor) -> Tensor:
        """The aggregation of 2-D ``x`` ``[n_src, F]`` -> ``[n_dst, F]``."""
        return torch.ops.fgplugin.pyg_aggregate(self.edge_index, self.edge_weight, x, self.n_src, self.n_dst,
                                                self.flip, *self.norm)


def _eager_plan(edge_index, edge_weight, n_src, n_dst, flip, norm: NormSpec) -> Plan:
    graph = graph_of(edge_index, n_src, n_dst, flip, strict=True)
    plan = plan_of(graph, edge_weight, norm)
    if plan is None:
        raise ValueError("fgplugin: edge_weight must be finite, one float per edge; clean it (e.g. "
                         "torch.nan_to_num) before the layer")
    return plan


@torch.library.custom_op("fgplugin::pyg_aggregate", mutates_args=())
def pyg_aggregate(edge_index: Tensor, edge_weight: Optional[Tensor], x: Tensor, n_src: int, n_dst: int, flip: bool,
                  norm: str, improved: bool, add_self_loops: bool) -> Tensor:
    plan = _eager_plan(edge_index, edge_weight, n_src, n_dst, flip, NormSpec(norm, improved, add_self_loops))
    with torch.no_grad():  # this op's gradient is registered below
        return fgplugin.spmm(plan.adj, x, *plan.norm)


@pyg_aggregate.register_fake
def _(edge_index, edge_weight, x, n_src, n_dst, flip, norm, improved, add_self_loops):
    torch._check(x.dim() == 2, lambda: "fgplugin::pyg_aggregate: x must be 2-D")
    return x.new_empty((n_dst, x.shape[1]))


@torch.library.custom_op("fgplugin::pyg_aggregate_backward", mutates_args=())
def pyg_aggregate_backward(grad: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor], n_src: int, n_dst: int,
                           flip: bool, norm: str, improved: bool, add_self_loops: bool) -> Tensor:
    """The gradient of ``pyg_aggregate`` with respect to ``x``."""
    plan = _eager_plan(edge_index, edge_weight, n_src, n_dst, flip, NormSpec(norm, improved, add_self_loops))
    with torch.no_grad():
        return spmm_adjoint(plan.adj, grad, *plan.norm)


@pyg_aggregate_backward.register_fake
def _(grad, edge_index, edge_weight, n_src, n_dst, flip, norm, improved, add_self_loops):
    return grad.new_empty((n_src, grad.shape[1]))


def _setup_context(ctx, inputs, output):
    edge_index, edge_weight, x, *spec = inputs
    ctx.spec = spec
    ctx.save_for_backward(edge_index, edge_weight)


def _backward(ctx, grad):
    if ctx.needs_input_grad[1]:
        raise RuntimeError("fgplugin::pyg_aggregate cannot differentiate edge weights; fgplugin's layers do not "
                           "defer weights that require grad (call the layer, not the op)")
    edge_index, edge_weight = ctx.saved_tensors
    grad_x = torch.ops.fgplugin.pyg_aggregate_backward(grad, edge_index, edge_weight, *ctx.spec) \
        if ctx.needs_input_grad[2] else None
    return (None, None, grad_x) + (None,) * len(ctx.spec)


pyg_aggregate.register_autograd(_backward, setup_context=_setup_context)

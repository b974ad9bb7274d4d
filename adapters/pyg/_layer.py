"""What the fgplugin PyG layers share: the plan they aggregate with, the aggregation itself, and
the rules for handing a call to the stock code (hooks, explain mode, TorchScript)."""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from fgplugin import input_cache

from ._deferred import DeferredPlan
from ._graph import SPARSE_KINDS, graph_of, input_kind, values_of
from ._plan import NONE, NormSpec, Plan, plan_of

# MessagePassing hooks run inside the stock propagate(); a layer with any of them registered
# keeps the stock path so that they see their messages.
_HOOKS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks",
    "_message_forward_pre_hooks", "_message_forward_hooks",
    "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
)


def make_plan(source, edge_weight: Tensor | None, n_src: int, n_dst: int, flip: bool, norm: NormSpec,
              values_from: tuple[str, ...] = SPARSE_KINDS) -> Plan | DeferredPlan | None:
    """The plan of a layer's graph input ``source``, or ``None`` where the stock code must run.

    The edge values are those of a sparse input whose kind is in ``values_from``, else
    ``edge_weight``. Under ``torch.compile`` an ``edge_index`` gives a :class:`DeferredPlan`
    (built when the compiled graph runs; see _deferred.py), so tracing never breaks on it.
    """
    if torch.compiler.is_compiling() and input_kind(source) == "edge_index":
        return DeferredPlan(source, edge_weight, n_src, n_dst, flip, norm)
    graph = graph_of(source, n_src, n_dst, flip)
    if graph is None:
        return None
    if graph.kind not in values_from:
        return plan_of(graph, edge_weight, norm)
    return plan_of(graph, values_of(source), norm, source if graph.kind == "torch.sparse" else None)


def fits(plan: Plan | DeferredPlan | None, x: Tensor, node_dim: int, n_dst: int | None = None) -> bool:
    """Whether ``plan`` can aggregate the nodes of ``x`` into ``n_dst`` nodes (device, node
    counts); where it cannot, the stock layer runs and raises its own error."""
    if plan is None or x.dim() < 2:
        return False
    n_rows, n_cols = plan.shape
    return x.device == plan.device and x.size(node_dim) == n_cols and (n_dst is None or n_rows == n_dst)


def aggregate(plan: Plan | DeferredPlan, x: Tensor, node_dim: int) -> Tensor:
    """``spmm`` over the node dimension ``node_dim`` of ``x`` (PyG's static graphs pass
    ``[batch, nodes, features]``): the other dimensions are folded into the feature columns."""
    if x.dim() == 2 and node_dim in (0, -2):
        return plan.aggregate(x)
    x = x.movedim(node_dim, 0)
    out = plan.aggregate(x.reshape(x.shape[0], -1))
    return out.view(out.shape[0], *x.shape[1:]).movedim(0, node_dim)


class FgpluginLayer:
    """Mixin of the drop-in layers. ``_stock`` is the PyG class a layer replaces; ``_plan_caches``
    names the stock attributes in which it caches its normalized graph (there the drop-in keeps
    its :class:`Plan` instead, so ``conv._cached_edge_index = None`` still resets the cache)."""

    _stock: type
    _plan_caches: tuple[str, ...] = ()
    # PyG keeps what `propagate` resolves to before it generates a class's own as
    # `_orig_propagate` (the decomposed-layers path): MessagePassing's, not the stock layer's
    # generated one, which a stock instance built first would otherwise leave here.
    propagate = MessagePassing.propagate

    def _fgplugin_serves(self) -> bool:
        """False where the stock propagate() must run: explain mode, hooks (they must see the
        stock messages). ``decomposed_layers > 1`` only splits the stock E x F message tensor to
        save memory; our kernel never builds it, so we serve those calls whole (same result as
        ``decomposed_layers=1``, which PyG's own test demands to allclose's default 1e-8)."""
        return not self._explain and not any(getattr(self, h) for h in _HOOKS)

    def _served_plan(self, x, edge_index, edge_weight) -> Plan | None:
        """The plan for a node-feature input ``x`` of a one-node-set layer when fgplugin serves
        this call (else ``None``: the caller runs the stock code)."""
        if not (isinstance(x, Tensor) and x.dim() >= 2 and self._fgplugin_serves()):
            return None
        plan = self._plan(x.size(self.node_dim), edge_index, edge_weight)
        return plan if fits(plan, x, self.node_dim) else None

    def _kept_aggregation(self, plan: Plan | DeferredPlan, x: Tensor, compute: Callable[[], Tensor] | None = None,
                          extra: tuple = ()) -> Tensor | None:
        """``compute()`` (default: ``aggregate(plan, x)``) kept from an earlier call when ``x`` is
        a constant input over the same graph (fgplugin.input_cache), else ``None``. ``extra``:
        the layer's settings that ``compute`` depends on beyond the plan."""
        if not isinstance(plan, Plan) or not plan.key or x.dim() < 2:
            return None
        nbytes = x.numel() // max(x.size(self.node_dim), 1) * plan.shape[0] * x.element_size()
        compute = compute or (lambda: aggregate(plan, x, self.node_dim))
        return input_cache.of(self).get(x, (*plan.key, self.node_dim, *extra), nbytes, compute)

    def _stock_forward(self, *args):
        # The stock code reads its caches as normalized graphs, never as our plans.
        for name in self._plan_caches:
            if isinstance(getattr(self, name), (Plan, DeferredPlan)):
                setattr(self, name, None)
        return self._stock.forward(self, *args)

    def _adopt_stock_cache(self, name: str, n: int) -> Plan | DeferredPlan | None:
        """A plan for a normalized graph the stock code cached in attribute ``name`` (before a
        ``convert()``, or on a stock-path call), so the layer goes on with our kernel."""
        cache = getattr(self, name)
        source, values = (cache[0], cache[1]) if isinstance(cache, tuple) else (cache, None)
        plan = make_plan(source, values, n, n, self.flow == "target_to_source", NONE)
        if plan is not None:
            setattr(self, name, plan)
        return plan

    def __prepare_scriptable__(self):
        """TorchScript cannot compile fgplugin's graph handling (Python objects), so
        ``torch.jit.script`` gets the stock layer with the same parameters and settings."""
        twin = copy.copy(self)
        twin.__class__ = self._stock
        twin.__dict__.pop("propagate", None)  # PyG's decomposed_layers binds it to `self`
        for name in self._plan_caches:
            if isinstance(getattr(twin, name), (Plan, DeferredPlan)):
                setattr(twin, name, None)
        twin._set_jittable_templates()
        return twin


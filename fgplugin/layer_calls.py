"""A drop-in layer's call that repeats its previous one runs what that one decided.

On small graphs an eager training step is bound by host time, and a GCN layer's call spent half
of its host time deciding what to run: whether fgplugin serves the call, the layer's
aggregation of its graph input, its linear map, the kept input aggregation, the order of the
products, the padding (fgplugin.aggregation). A layer's call took 50 us on a 2-core CPU where
the matrix product and the aggregation it ran took 25; on an H200 machine's host fgplugin's
2-layer GCN forward took 0.2-0.4 ms against 0.1-0.2 ms for the same products called directly.

Those decisions depend on what a training loop passes unchanged from one step to the next: the
graph input (by identity, with its edge values' version), the layer's own state (its linear map,
weight and bias objects, its graph cache, no hooks, not in explain mode), ``x``'s dtype, device,
shape and whether it needs a gradient, grad mode and the switches that steer the layer's choice.
So a layer keeps the decided call of its last call (:class:`KeptLayerCall`) and a call with the
same key runs it at once. Three decisions are kept, those a training step makes:

- ``x`` needs a gradient (a hidden layer's input), or needs none and is another tensor at every
  call (a first layer's input after dropout, as in PyG's gcn.py), and ``W`` narrows the features:
  ``A (x W) + b`` as :func:`fgplugin.spmm` of the (padded) product with the bias in its output
  pass; where the product's own kept call is the extension's ``KeptSpmm``
  (fgplugin.repeated_calls), the decision holds it (weakly) and runs the matrix product and the
  SpMM in one step from C++ (its ``transformed``: the same ATen ops), with no Python dispatch
  between them and no second lookup; its key then also covers the product's switches, and edge
  values or scales that came to need a gradient send the call the full way. A call whose ``x``
  needs no gradient and is the tensor of the call before takes the full path (a constant input is
  the input cache's to keep), and no such call is kept while the cache holds an input;
- the same inputs where ``W`` does not narrow the features: ``(A x) W + b``, :func:`fgplugin.spmm`
  of ``x`` and one ``addmm`` where it can be (the product keeps its own checks and kept call),
  under the same rule for an input that needs no gradient;
- ``x`` is the constant input the layer keeps (fgplugin.input_cache), in the form the cache holds
  at the call: its dense aggregation, ``(A x) W + b`` (one ``addmm`` where it can be), or ``x`` as
  a sparse matrix (fgplugin.sparse_input), ``A (x W) + b`` with ``x W`` on its SpMM and ``W``
  padded to the decided width. It is asked for anew on every call (the input cache checks ``x``'s
  identity and version), and while the two forms are on trial (fgplugin.form_trial) the cache
  counts the call and answers the form to run, so the trial times the forms as they run after it.

Everything else takes the full path every time: first calls, calls in any other context (autocast,
``torch.compile``, functorch transforms, forward-mode AD, CUDA graph capture, inference mode,
tensor subclasses, torch function or dispatch modes), edge weights, graph inputs or edge values
made in inference mode (they have no version), sparse ``x``, edge values or scales that need a
gradient, and a call whose product was the first at its width, the route to cuSPARSE then left to
the next product (fgplugin.cusparse). The products below keep their own checks (fgplugin.spmm's
on every call), so a kept layer call runs the same ops with the same arguments as the full path:
same results, bit for bit. A layer holds at most one kept call, with weak references only (to its
graph input, the layer's objects, the adjacency and the scales), so it keeps nothing alive: a freed
graph, a reset graph cache or a replaced weight is let go of as before, and the next call takes the
full path.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from . import _extension, input_cache
from .config import settings
from .normalization import Normalization
from .repeated_calls import context_allows, switches
from .repeated_calls import find as find_product
from .stamps import pin, stamp
from .tiling import TiledAdjacency

TRANSFORMED, AGGREGATED, KEPT_INPUT = "transformed", "aggregated", "kept input"
_PENDING = "_fgplugin_decided"  # what aggregate() decided in the call under way, until kept
_KEPT = "_fgplugin_layer_call"


def _weak(obj):
    """``obj`` as a kept call refers to it: tensors, modules and other objects by weak reference,
    tuples part by part, and what takes no weak reference (``None``, numbers, strings, dtypes)
    itself. Unlike fgplugin.input_cache's key, tensors are not also keyed by their version: the
    weights change every step and the decision holds across."""
    if isinstance(obj, tuple):
        return tuple(_weak(part) for part in obj)
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def _is(held, obj) -> bool:
    """Whether ``obj`` is what :func:`_weak` made ``held`` of (a dead reference never is)."""
    if isinstance(held, tuple):
        return isinstance(obj, tuple) and len(held) == len(obj) and all(_is(h, o) for h, o in zip(held, obj))
    if isinstance(held, weakref.ref):
        now = held()
        return now is not None and now is obj
    return held is obj or (type(held) is type(obj) and held == obj)


def _strong(held):
    """What :func:`_weak` made ``held`` of, or ``None`` when a referred object was freed."""
    if isinstance(held, tuple):
        parts = [_strong(h) for h in held]
        if any(p is None and h is not None for p, h in zip(parts, held)):
            return None
        return tuple(parts)
    return held() if isinstance(held, weakref.ref) else held


class Decision(NamedTuple):
    """What :func:`fgplugin.aggregation.aggregate` decided: ``kind`` (``TRANSFORMED``:
    ``A (x W) + b`` with ``W`` padded to ``width`` columns; ``AGGREGATED``: ``(A x) W + b``;
    ``KEPT_INPUT``: on the input cache's form of ``x``, ``(A x) W + b`` on its dense aggregation
    or ``A (x W) + b`` on its sparse form, ``W`` padded to ``width``) and the aggregation's
    adjacency and scales, held weakly."""

    kind: str
    adj: weakref.ref
    norm: tuple
    width: int = 0
    product: weakref.ref | None = None  # TRANSFORMED: the product's kept call (see decided_product)

    def aggregation_parts(self) -> tuple[TiledAdjacency, Normalization] | None:
        """``(adj, scales)``, or ``None`` where either was freed."""
        adj, norm = self.adj(), _strong(self.norm)
        return None if adj is None or norm is None else (adj, Normalization(*norm))

    def __reduce__(self):
        return _dropped()


def deciding(owner) -> None:
    """Called by a layer before its full path: what :func:`fgplugin.aggregation.aggregate`
    decides in this call is noted (:func:`decided`) for :func:`keep`."""
    owner.__dict__[_PENDING] = None


def asked(owner) -> bool:
    """Whether the call under way of ``owner`` notes what it decides (:func:`deciding`)."""
    # first: torch.compile traces aggregate(), and no kept call is made there
    return not torch.compiler.is_compiling() and owner is not None and _PENDING in owner.__dict__


def decided(owner, kind: str, adj: TiledAdjacency, norm: Normalization, width: int = 0) -> None:
    """Notes what :func:`fgplugin.aggregation.aggregate` decided for the call under way of
    ``owner``, a layer that asked for it (:func:`deciding`)."""
    if asked(owner):
        owner.__dict__[_PENDING] = Decision(kind, weakref.ref(adj), _weak(norm), width)


def decided_product(owner, adj: TiledAdjacency, h: Tensor, norm: Normalization, bias, width: int,
                     route_left_open: bool = False) -> None:
    """Notes, for ``owner``'s ``TRANSFORMED`` call under way (if it is deciding one), the kept
    ``fgplugin.spmm`` call (fgplugin.repeated_calls) that served its product
    ``spmm(adj, h, *norm, bias=bias, width=width)``, where that is the extension's ``KeptSpmm``
    recording the gradient of ``h`` alone: a repeated layer call then runs ``A (x W^T) + b`` in it,
    in one step from C++ (its ``transformed``), without the product's own lookup.
    ``route_left_open``: the product was the first at its width, whose route to cuSPARSE
    (fgplugin.cusparse) the next product chooses; the call is then not kept, and the next one
    decides again."""
    pending = owner.__dict__.get(_PENDING)
    if pending is None or pending.kind != TRANSFORMED:
        return
    if route_left_open:
        owner.__dict__[_PENDING] = None
        return
    kept_call = find_product(adj, h, *norm, bias, width)
    if isinstance(kept_call, _extension.kept_spmm or ()) and kept_call.wrt_x:
        owner.__dict__[_PENDING] = pending._replace(product=weakref.ref(kept_call))


def product_call(decision: Decision):
    """The kept ``KeptSpmm`` of a ``TRANSFORMED`` decision (:func:`decided_product`) where it still
    serves this call; ``None`` where none was kept (the layer runs the product through
    ``fgplugin.spmm``); ``False`` where it was let go of (the adjacency's kept calls were
    cleared): then the layer decides afresh. (Edge values or scales that came to need a gradient
    send the call the full way before: fgplugin.aggregation.aggregate_as_decided.)"""
    if decision.product is None:
        return None
    kept_call = decision.product()
    return False if kept_call is None else kept_call


class KeptLayerCall:
    """One layer's decided call and the key it was decided for, all held weakly."""

    __slots__ = ("graph_input", "key", "objects", "decision", "last_input", "pinned", "__weakref__")

    def __init__(self, graph_input, objects: tuple, values: tuple, x: Tensor, decision: Decision):
        this = weakref.ref(self)

        def unpin(_):  # the graph input freed: what its stamp names need not be held any longer
            kept = this()
            if kept is not None:
                kept.pinned = None

        self.graph_input = weakref.ref(graph_input, unpin)
        self.objects = _weak(objects)
        self.key = _key(graph_input, values, x, decision)
        self.pinned = pin(graph_input) if isinstance(graph_input, Tensor) else None  # what its stamp names
        self.decision = decision
        # an input that needs no gradient (not the cache's), as of the last call served: the same
        # tensor again may be a constant input, which the full path lets the input cache keep
        self.last_input = weakref.ref(x) if decision.kind != KEPT_INPUT and not x.requires_grad else None

    # A copy of a layer (deepcopy, pickle, torch.save) decides its first call afresh: what is
    # kept refers to the original's graph (weakly, which cannot be copied).
    def __reduce__(self):
        return _dropped()

    def matches(self, graph_input, objects: tuple, values: tuple, x: Tensor) -> bool:
        if self.last_input is not None and self.last_input() is x:
            return False
        return (self.graph_input() is graph_input and _is(self.objects, objects)
                and _key(graph_input, values, x, self.decision) == self.key)


def _dropped():
    return type(None), ()


def _key(graph_input, values: tuple, x: Tensor, decision: Decision) -> tuple:
    """What a decision depends on besides objects' identities: the layer's plain settings
    (``values``), ``x``'s kind, grad mode, the switches (the product's too, which a kept product
    call would otherwise skip), and the versions of the graph input and of the edge values the
    scales were computed from."""
    adj = decision.adj()
    edge_values = None if adj is None else adj.values
    return (values, x.dtype, x.device, x.shape, x.requires_grad, torch.is_grad_enabled(), settings.input_cache,
            settings.sparse_input, *switches(), stamp(graph_input) if isinstance(graph_input, Tensor) else None,
            adj is None, None if edge_values is None else edge_values._version)


def _may_keep(graph_input, edge_weight, x) -> bool:
    return (edge_weight is None and type(x) is Tensor and x.layout == torch.strided and context_allows(x)
            and not torch.is_inference_mode_enabled()
            and (isinstance(graph_input, TiledAdjacency)
                 or (isinstance(graph_input, Tensor) and not graph_input.is_inference())))


def find(owner, graph_input, edge_weight, objects: tuple, values: tuple, x) -> Decision | None:
    """What ``owner``'s kept call decided if this call is like that one, else ``None`` (then the
    layer takes its full path). ``objects``: what the layer's decisions read that is compared by
    identity (its linear map, weight, bias, graph cache); ``values``: its plain settings
    (normalization options, node dimension, the weight's shape), compared by equality."""
    kept = owner.__dict__.get(_KEPT)
    if kept is None or not _may_keep(graph_input, edge_weight, x) or not kept.matches(graph_input, objects, values, x):
        return None
    if kept.last_input is not None:
        kept.last_input = weakref.ref(x)
    return kept.decision


def keep(owner, graph_input, edge_weight, objects: tuple, values: tuple, x) -> None:
    """Keeps what ``aggregate`` decided in the call that just ran (:func:`decided`), where a later
    call may reuse it (see the module doc); else drops what the layer kept before."""
    decision = owner.__dict__.get(_PENDING)
    forget(owner)
    if decision is None or not _may_keep(graph_input, edge_weight, x):
        return
    if decision.kind != KEPT_INPUT:
        if not torch.is_grad_enabled():
            return  # an evaluation's call (once per epoch, not worth keeping) decides afresh
        if not x.requires_grad and input_cache.of(owner).holds:
            # the cache kept an input it could not serve here (saved-tensor hooks): its next call
            # with that input must reach it, so decide again
            return
    adj = decision.adj()
    if adj is None or (adj.values is not None and adj.values.is_inference()):
        return  # edge values made in inference mode have no version to key on
    owner.__dict__[_KEPT] = KeptLayerCall(graph_input, objects, values, x, decision)


def forget(owner) -> None:
    """Drops what ``owner`` kept: its next call takes the full path."""
    owner.__dict__.pop(_KEPT, None)
    owner.__dict__.pop(_PENDING, None)

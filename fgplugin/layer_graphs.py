"""A layer's kept call replayed as two CUDA graphs, its forward and its backward.

On a small graph an eager training step is bound by host time: each kernel-launching op costs
20-36 us of an H100 machine's host, and a GCN layer's kept call (fgplugin.layer_calls) launches
its products, a GEMM and the SpMM with its epilogue, and, in the backward pass, their gradients,
each through its own autograd node. Replayed from a CUDA graph, the forward is one launch and
the backward one more, whatever the user's loop does around them. So once a layer's kept call has
run ``REPEATS_BEFORE_CAPTURE`` times in a row on the same objects, its ops are captured (forward,
and the backward for the tensors that need a gradient) into a private memory pool and replayed by
its later calls, through an autograd function (:class:`_Replay`). Nothing it returns is the
graphs' own memory: the output and the gradients are copied out (a user may hold an output
across calls, or a gradient in a hook), the gradients of the weight and bias in one copy.

Where it applies (all must hold, else the kept call runs eagerly, as before):

- the switch (``FGPLUGIN_LAYER_GRAPHS``, :func:`fgplugin.set_layer_graphs`) is ``1``, or
  ``auto`` (the default) and the layer's product is small: the adjacency's non-zeros times the
  output width at most ``MAX_WORK``, where the product's kernels take a fraction of a
  millisecond. On larger graphs the GPU is busy while the host queues the next ops, so a replay
  saves nothing and its memory pool (about the layer's activations and their gradients once more)
  would be a cost;
- a CUDA call in a training context: grad mode on and something needing a gradient (no
  evaluation call is captured), and the kept call's context (plain eager: no autocast, capture,
  torch.compile, inference mode);
- the kept input's form is not on trial (fgplugin.form_trial times the forms as they run eagerly).

A replay checks what the graphs read at fixed addresses: the objects the kept call resolved to
(the kept input aggregation, the product's kept call, the adjacency and its scales; by identity,
held weakly), the weight's and bias's storage (a ``weight.data = ...`` moves it) and which of
``x``, weight and bias need a gradient. ``x`` itself is copied into the graph's input. Anything
else drops the graphs, and the call runs eagerly. What the graphs read from fgplugin's caches
(fgplugin.capture_holds) is held with them. They and their pool stay with the layer across its
other calls (an evaluation between training steps takes the full path and leaves them), and are
let go of by a kept training call that reads other objects, or with the layer.

The backward replay computes what the last forward replay saved. A backward pass for an earlier
forward (the layer called twice before one backward; ``retain_graph``) or one that must itself be
differentiable (``create_graph=True``) runs the layer's ops again eagerly and differentiates
them: right, and slower. A capture that fails leaves the layer eager, and fgplugin says why, once.
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

from . import capture_holds
from .config import settings
from .graphed import reset_generator_after_failed_capture
from .layer_calls import is_held, weakly

REPEATS_BEFORE_CAPTURE = 2  # eager kept calls on the same objects before their graphs are captured
# Non-zeros x output columns above which "auto" captures no layer: at 2**30 the product's kernels
# take about 0.6 ms on an H100 (the zero-row skipping's floor, 2**28, is about 0.15 ms), as long
# as a kernel-launching op's host time several times over.
MAX_WORK = 2 ** 30
MAX_CAPTURES = 16  # per layer: a call pattern that keeps changing what the kept call reads is left eager
_STATE = "_fgplugin_layer_graph"
_CAPTURES = "_fgplugin_layer_graph_captures"


class LayerGraphWarning(RuntimeWarning):
    """A layer's kept call could not be captured as CUDA graphs and runs eagerly."""


def wanted(x: Tensor, weight: Tensor, bias: Tensor | None, nnz: int) -> bool:
    """Whether a kept call with these arguments on an adjacency of ``nnz`` non-zeros may be
    replayed from graphs (the module doc's first two rules; the kept call's context is the caller's)."""
    mode = settings.layer_graphs
    if mode == "0" or not x.is_cuda or not torch.is_grad_enabled():
        return False
    if not (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    return mode == "1" or nnz * weight.shape[0] <= MAX_WORK


def run(owner, reads: tuple, op, x: Tensor, weight: Tensor, bias: Tensor | None, reads_x: bool = True,
        may_capture: bool = True) -> Tensor:
    """``op(x, weight, bias)``, the ops of ``owner``'s kept call, replayed from its graphs where
    they serve this call, else run eagerly (and captured after ``REPEATS_BEFORE_CAPTURE`` eager
    calls like it). ``reads``: the objects ``op`` reads besides its arguments (compared by
    identity); ``reads_x``: whether it reads ``x`` (a kept input's call does not);
    ``may_capture``: no new capture now. Call only where :func:`wanted` holds."""
    signature = _signature(x, weight, bias, reads_x)
    state = owner.__dict__.get(_STATE)
    if state is not None and not state.fits(reads, signature):
        state = None  # what the graphs read changed: their memory goes first
        owner.__dict__.pop(_STATE)
    if isinstance(state, LayerGraph):
        return _Replay.apply(state, op, x, weight, bias)
    if state is None:
        state = owner.__dict__[_STATE] = _Seen(reads, signature)
    if type(state) is _Seen and may_capture:  # not a refused capture's
        state.calls += 1
        if state.calls > REPEATS_BEFORE_CAPTURE and owner.__dict__.get(_CAPTURES, 0) < MAX_CAPTURES:
            owner.__dict__[_CAPTURES] = owner.__dict__.get(_CAPTURES, 0) + 1
            graph = _captured(op, reads, signature, x, weight, bias, reads_x)
            owner.__dict__[_STATE] = graph if graph is not None else _Refused(reads, signature)
            if graph is not None:
                return _Replay.apply(graph, op, x, weight, bias)
    return op(x, weight, bias)


def _signature(x: Tensor, weight: Tensor, bias: Tensor | None, reads_x: bool) -> tuple:
    """What the graphs depend on besides the objects they read: which inputs need a gradient (the
    backward graph computes those), where the weight and bias are stored (the graphs read them
    there), and ``x``'s shape where they copy it in."""
    return (x.requires_grad, weight.requires_grad, weight.data_ptr(), x.shape if reads_x else None,
            None if bias is None else (bias.requires_grad, bias.data_ptr()))


class _Seen:
    """Calls of a layer's kept call on the same objects, counted until their graphs are captured."""

    __slots__ = ("reads", "signature", "calls")

    def __init__(self, reads: tuple, signature: tuple):
        self.reads, self.signature, self.calls = weakly(reads), signature, 0

    def fits(self, reads: tuple, signature: tuple) -> bool:
        return signature == self.signature and is_held(self.reads, reads)

    def __reduce__(self):  # a copy of the layer (deepcopy, pickle) starts without graphs
        return type(None), ()


class _Refused(_Seen):
    """Calls whose capture failed: they run eagerly while they read the same objects."""

    __slots__ = ()


class LayerGraph(_Seen):
    """The captured forward and backward of one kept call, and their static tensors: ``x`` (where
    read), the output and its gradient, ``x``'s gradient and the parameters' in one buffer."""

    __slots__ = ("forward", "backward", "x", "out", "grad_out", "grad_x", "grad_params", "param_shapes",
                 "holds", "replays")


def _captured(op, reads: tuple, signature: tuple, x: Tensor, weight: Tensor, bias: Tensor | None,
              reads_x: bool) -> LayerGraph | None:
    """``op``'s graphs, captured on a side stream into a pool of their own; ``None`` where the
    capture failed (said once)."""
    graph = LayerGraph(reads, signature)
    device = x.device
    static_x = x.detach().clone().requires_grad_(x.requires_grad) if reads_x else x
    params = [t for t in (weight, bias) if t is not None and t.requires_grad]
    holds: list = []
    first_error = None
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    pool = torch.cuda.graph_pool_handle()
    forward, backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    try:
        with torch.cuda.device(device), torch.cuda.stream(side):
            forward.capture_begin(pool=pool)
            try:
                with capture_holds.collecting(holds):
                    # Differentiated through views made here: a leaf's gradient would pass its
                    # AccumulateGrad node, whose stream is the one of the call that made it (the
                    # user's, kept alive by a loss still held), which a capture may not wait on.
                    # The views read the same memory, so the graphs read the weight's as it is.
                    x_in, weight_in, bias_in = (t if t is None or not t.requires_grad else t.view_as(t)
                                                for t in (static_x, weight, bias))
                    wrt = [t for t in (x_in, weight_in, bias_in) if t is not None and t.requires_grad]
                    out = op(x_in, weight_in, bias_in)
            except Exception as err:
                first_error = err
                raise
            finally:
                forward.capture_end()
            grad_out = torch.empty_like(out)
            backward.capture_begin(pool=pool)
            try:
                with capture_holds.collecting(holds):
                    # retain_graph: the forward's saved tensors keep their memory, which a second
                    # backward replay for the same forward (retain_graph in the user's loop) reads
                    grads = torch.autograd.grad(out, wrt, grad_out, retain_graph=True)
                    grad_params = torch.cat([g.reshape(-1) for g in grads[len(wrt) - len(params):]]) if params else None
            except Exception as err:
                first_error = err
                raise
            finally:
                backward.capture_end()
        torch.cuda.current_stream(device).wait_stream(side)
    except Exception as err:  # noqa: BLE001 - anything the capture refuses: the layer stays eager
        err = first_error or err
        torch.cuda.current_stream(device).wait_stream(side)
        reset_generator_after_failed_capture(device)
        _say_once(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
        return None
    graph.forward, graph.backward, graph.holds, graph.replays = forward, backward, holds, 0
    graph.x = static_x.detach() if reads_x else None
    graph.out, graph.grad_out = out.detach(), grad_out
    graph.grad_x = grads[0] if x.requires_grad else None
    graph.grad_params = grad_params
    graph.param_shapes = [(t is not None and t.requires_grad, None if t is None else t.shape) for t in (weight, bias)]
    return graph


_said: set = set()


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        warnings.warn(f"fgplugin: a layer's repeated call could not be captured as CUDA graphs and runs eagerly "
                      f"({reason})", LayerGraphWarning, stacklevel=4)


class _Replay(torch.autograd.Function):
    """The kept call's output from its forward graph; its gradients from its backward graph, or,
    for a backward pass the graph cannot serve, from the ops run again (see the module doc)."""

    @staticmethod
    def forward(ctx, graph: LayerGraph, op, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if graph.x is not None and graph.x.data_ptr() != x.data_ptr():
            graph.x.copy_(x)
        graph.forward.replay()
        graph.replays += 1
        ctx.graph, ctx.op, ctx.replay = graph, op, graph.replays
        ctx.save_for_backward(x, weight, bias)  # also checks, as the ops' own nodes do, for in-place changes
        return graph.out.clone()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias = ctx.saved_tensors
        graph = ctx.graph
        if torch.is_grad_enabled() or ctx.replay != graph.replays:
            return (None, None, *_recomputed(ctx.op, x, weight, bias, grad_out))
        graph.grad_out.copy_(grad_out)
        graph.backward.replay()
        grad_x = graph.grad_x.clone() if graph.grad_x is not None else None
        grads = [None, None]
        if graph.grad_params is not None:
            flat, start = graph.grad_params.clone(), 0
            for i, (needed, shape) in enumerate(graph.param_shapes):
                if needed:
                    grads[i] = flat[start:start + shape.numel()].view(shape)
                    start += shape.numel()
        return None, None, grad_x, *grads


def _recomputed(op, x: Tensor, weight: Tensor, bias: Tensor | None, grad_out: Tensor) -> list:
    """The gradients of ``op(x, weight, bias)`` for ``grad_out``, by running the ops again
    (differentiable where the backward pass creates a graph)."""
    inputs = [x, weight, bias]
    wrt = [t for t in inputs if t is not None and t.requires_grad]
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        out = op(x, weight, bias)
        grads = iter(torch.autograd.grad(out, wrt, grad_out, create_graph=create_graph, allow_unused=True))
    return [next(grads) if t is not None and t.requires_grad else None for t in inputs]

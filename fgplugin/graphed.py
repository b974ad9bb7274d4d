"""A whole full-batch training step as one CUDA graph: forward, loss, backward and optimizer step
captured once and replayed.

On the graphs most users train (10K-3M nodes, 0.1-10M edges) a step's kernels take a fraction of
its eager time: the rest is Python and kernel launches. Replaying a captured step launches the
same kernels with one call::

    train_idx = data.train_mask.nonzero().squeeze(1)          # an index, not a mask (see below)
    step = fgplugin.graphed_step(model, optimizer,
                                 lambda out: F.cross_entropy(out[train_idx], data.y[train_idx]),
                                 data.x, data.edge_index)
    for epoch in range(200):
        loss = step()                                         # a tensor; float(loss) syncs

What capture needs, and what this does about it:

- **Fixed inputs.** The graph reads ``inputs`` at the addresses they had when captured: change
  the data by copying into them in place (``data.x.copy_(...)``), not by passing new tensors.
  The step notices an in-place change (a tensor's ``_version``, a ``TiledAdjacency``'s edge
  values) and captures itself again, without training; from then on the first layer computes its
  aggregation in every replay instead of reading the kept one (see below).
- **Hyperparameters.** An Adam or AdamW whose update reads its learning rate from the GPU
  (``capturable`` or ``fused``, as below) gets ``lr`` as a one-element CUDA tensor, which
  learning-rate schedulers update in place, so replays follow them. Any other change to a param
  group (another optimizer's ``lr``, weight decay, betas, ``add_param_group``, an
  ``optimizer.load_state_dict``) makes the next step capture itself again.
- **No host sync in the step.** A boolean mask index (``out[mask]``) has a data-dependent size:
  index with ``mask.nonzero()`` computed once, as above. fgplugin's zero-row skipping
  (fgplugin.grad_rows) finds the live rows of a gradient on the host, so it is off while the
  step is warmed up and captured (the captured backward runs the full products); the kept input
  aggregation (fgplugin.input_cache) is filled in the warm-up and read by the graph, its form
  (dense, or a mostly-zero input kept sparse: fgplugin.sparse_input) chosen by device time alone.
- **Optimizers**: those with a ``capturable`` option (Adam, AdamW, ...) are switched to it, which
  keeps their step counts on the GPU. Adam and AdamW left at torch's default implementation
  (neither ``foreach`` nor ``fused`` given) are switched to their fused one: the same update in
  one kernel for all parameters instead of a dozen multi-tensor kernels, which in a replayed step
  are kernel time, not hidden host time (where the capture fails, they are switched back). A ``GradScaler`` (fp16) syncs on every step and cannot be
  captured; bf16 autocast can (``autocast=torch.bfloat16``).
- The ``warmup`` steps before the capture are real training steps on a side stream, as torch's
  whole-network capture recipe has them.
- ``before_step``: a callable run after the backward pass and before ``optimizer.step()``, inside
  the capture too (gradient clipping: ``lambda: torch.nn.utils.clip_grad_norm_(params, 1.0)``).
- The step returns a new tensor holding the loss each time (a copy of the graph's own, which the
  next replay overwrites).

Where capture is impossible (no CUDA device, a model that syncs, an op that cannot be captured)
the step runs eagerly and fgplugin warns once, saying why.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from . import autotune
from .config import set_row_skipping


class GraphedStepWarning(RuntimeWarning):
    """The training step could not be captured as a CUDA graph and runs eagerly."""


def graphed_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, *inputs,
                 warmup: int = 3, autocast: torch.dtype | None = None,
                 before_step: Callable[[], object] | None = None) -> Callable[[], torch.Tensor]:
    """A function running one training step of ``model`` (``optimizer.zero_grad()``,
    ``loss_fn(model(*inputs)).backward()``, ``before_step()`` if given, ``optimizer.step()``) that
    returns the loss (a detached tensor), captured as one CUDA graph (see the module doc for what
    that requires); eager, with one warning, where it cannot be. ``warmup`` steps run first,
    captured or not (they train, too). ``autocast``: a dtype (``torch.bfloat16``) to run the
    forward under ``torch.autocast`` in."""
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 (the capture needs the step run once), got {warmup}")
    device = _device_of(model, inputs)

    def forward():
        if autocast is None:
            return model(*inputs)
        with torch.autocast(device.type, dtype=autocast):
            return model(*inputs)

    def train() -> torch.Tensor:
        loss = loss_fn(forward())
        loss.backward()
        if before_step is not None:
            before_step()
        optimizer.step()
        return loss.detach()

    def eager() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        return train()

    if device is None or device.type != "cuda":
        _fall_back(f"CUDA graphs need the model and inputs on a CUDA device, not {device}")
        for _ in range(warmup):  # the same training as a captured step's
            eager()
        return eager
    fused, tensor_lrs = [], []  # the param groups switched here, switched back for eager steps

    def prepare_optimizer() -> None:  # again before a capture: load_state_dict makes new groups
        _make_capturable(optimizer)
        fused.extend(_use_fused_kernel(optimizer))
        tensor_lrs.extend(_lr_on_device(optimizer))

    def capture() -> _Captured | None:
        """Captures the step (the warm-up done), or returns ``None`` after restoring the
        optimizer where the capture fails (then the step runs eagerly, and says why)."""
        skipping = set_row_skipping(False)  # the live rows of a gradient are found with a host sync
        try:
            prepare_optimizer()
            graph = torch.cuda.CUDAGraph()
            optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph), autotune.for_captured_step():  # the warm-up's kernel choices
                static_loss = train()
            return _Captured(graph, static_loss, _kept_inputs(model), _fingerprint(optimizer, inputs))
        except Exception as err:  # noqa: BLE001 - anything the capture refuses: run eagerly, say why
            _reset_generator_after_failed_capture(device)
            _restore(optimizer, fused, tensor_lrs)  # the eager steps run the optimizer as the user made it
            torch.cuda.synchronize(device)
            optimizer.zero_grad(set_to_none=True)
            _fall_back(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
            return None
        finally:
            set_row_skipping(skipping)

    prepare_optimizer()
    skipping = set_row_skipping(False)
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), autotune.for_captured_step():
            for _ in range(warmup):
                eager()
        torch.cuda.current_stream(device).wait_stream(side)
    except Exception:
        _restore(optimizer, fused, tensor_lrs)
        raise  # an eager training step failed: the user's model or loss, not the capture
    finally:
        set_row_skipping(skipping)
    captured = capture()
    if captured is None:
        return eager

    def replay() -> torch.Tensor:
        nonlocal captured
        if captured is not None and captured.fingerprint != _fingerprint(optimizer, inputs):
            captured = capture()  # inputs or optimizer changed since: capture again (None: it failed)
            replay.graph = None if captured is None else captured.graph
        if captured is None:
            return eager()
        captured.graph.replay()
        return captured.loss.clone()  # the graph's own is overwritten by the next replay

    replay.graph = captured.graph  # the graph in use (inspectable)
    return replay


class _Captured:
    """A captured step: the graph, its loss tensor, what it reads that a cache could otherwise
    free (the layers' kept input aggregations), and the state of the inputs and optimizer it was
    captured with (:func:`_fingerprint`)."""

    __slots__ = ("graph", "loss", "holds", "fingerprint")

    def __init__(self, graph, loss, holds, fingerprint):
        self.graph, self.loss, self.holds, self.fingerprint = graph, loss, holds, fingerprint


def _kept_inputs(model: torch.nn.Module) -> list:
    """What the model's layers keep of their constant inputs (fgplugin.input_cache): a captured
    graph reads it, so the step holds it even if a layer's cache lets it go (a call with another
    input, for instance)."""
    held = []
    for module in model.modules():
        cache = module.__dict__.get("_fgplugin_input_cache")
        if cache is not None and cache.holds:
            held.append(cache.value)
    return held


def _fingerprint(optimizer: torch.optim.Optimizer, inputs) -> tuple:
    """What a captured step depends on beyond the tensors it reads: the inputs' versions (an
    in-place write), and the optimizer's param groups (their hyperparameters by value, tensors
    by identity) and state dict (``load_state_dict`` replaces them)."""
    versions = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            versions.append(item._version)
        values = getattr(item, "values", None)  # a TiledAdjacency's edge weights
        if isinstance(values, torch.Tensor):
            versions.append(values._version)
    groups = tuple(tuple((key, id(value) if isinstance(value, (torch.Tensor, list)) else value)
                         for key, value in group.items()) for group in optimizer.param_groups)
    return tuple(versions), id(optimizer.param_groups), id(optimizer.state), groups


def _lr_on_device(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Gives the param groups of an Adam or AdamW that updates on the GPU (``capturable`` or
    ``fused``) their learning rate as a one-element tensor on the parameters' device, which a
    learning-rate scheduler fills in place (``torch.optim.lr_scheduler``), so that a replayed step
    follows it; returns the groups changed. Other optimizers read a float, fixed in a capture."""
    if not isinstance(optimizer, _FUSED_ON_CUDA):
        return []
    changed = []
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor) or not (group.get("capturable") or group.get("fused")) \
                or group.get("differentiable") or not group["params"]:
            continue
        group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=group["params"][0].device)
        changed.append(group)
    return changed


def _restore(optimizer: torch.optim.Optimizer, fused: list[dict], tensor_lrs: list[dict]) -> None:
    """Undoes :func:`_use_fused_kernel` and :func:`_lr_on_device` for an eager step."""
    for group in fused:
        group["fused"] = None
    for group in tensor_lrs:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])


def _reset_generator_after_failed_capture(device: torch.device) -> None:
    """A capture that fails after a random op (dropout) leaves the device's default generator in
    capture mode: the next random op outside a capture raises "Offset increment outside graph
    capture encountered unexpectedly". A fresh state with the same seed and offset (``clone_state``)
    ends that, so the eager steps, and whatever the program does next, can draw again."""
    generator = torch.cuda.default_generators[device.index if device.index is not None else
                                              torch.cuda.current_device()]
    if hasattr(generator, "graphsafe_set_state"):
        generator.graphsafe_set_state(generator.clone_state())


def _device_of(model: torch.nn.Module, inputs) -> torch.device | None:
    for t in (*model.parameters(), *inputs):
        if isinstance(t, torch.Tensor):
            return t.device
    return None


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Turns on ``capturable`` where the optimizer has it, with its step counts moved to the
    parameters' device (an optimizer that already stepped keeps them on the CPU)."""
    for group in optimizer.param_groups:
        if "capturable" not in group or group["capturable"]:
            continue
        group["capturable"] = True
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                state["step"] = step.to(device=p.device, dtype=torch.float32)


# Optimizers whose fused implementation runs on CUDA with the update of their default one, for
# every gradient they take (SGD's fused kernel refuses sparse gradients, which its default takes)
_FUSED_ON_CUDA = (torch.optim.Adam, torch.optim.AdamW)


def _use_fused_kernel(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Switches the param groups of an Adam or AdamW left at torch's default implementation
    (``foreach`` and ``fused`` both unset) to ``fused``, and returns the groups it switched. In
    eager training torch's default, the multi-tensor ``foreach`` kernels, hides behind the host's
    launch time; a replayed step has no host time, and Adam's multi-tensor kernels took ~95 us of a
    401 us captured step (H100, coauthor_cs) where the fused kernel does the same update in one. A
    choice the user made (either option given, ``differentiable``, a parameter that is not a
    floating-point CUDA tensor) is kept."""
    if not isinstance(optimizer, _FUSED_ON_CUDA):
        return []
    switched = []
    for group in optimizer.param_groups:
        if (group.get("fused") is not None or group.get("foreach") is not None or group.get("differentiable")
                or not all(p.is_cuda and p.is_floating_point() for p in group["params"])):
            continue
        group["fused"] = True
        switched.append(group)
    return switched


_warned: set[str] = set()


def _fall_back(reason: str) -> None:
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(f"fgplugin.graphed_step: the step runs eagerly ({reason}). See fgplugin/graphed.py for what a "
                  "captured step needs.", GraphedStepWarning, stacklevel=3)

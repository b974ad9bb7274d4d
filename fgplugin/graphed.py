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
                 warmup: int = 3, autocast: torch.dtype | None = None) -> Callable[[], torch.Tensor]:
    """A function running one training step of ``model`` (``optimizer.zero_grad()``,
    ``loss_fn(model(*inputs)).backward()``, ``optimizer.step()``) that returns the loss tensor,
    captured as one CUDA graph (see the module doc for what that requires); eager, with one
    warning, where it cannot be. ``warmup`` steps run first, captured or not (they train, too).
    ``autocast``: a dtype (``torch.bfloat16``) to run the forward under ``torch.autocast`` in."""
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 (the capture needs the step run once), got {warmup}")
    device = _device_of(model, inputs)

    def forward():
        if autocast is None:
            return model(*inputs)
        with torch.autocast(device.type, dtype=autocast):
            return model(*inputs)

    def eager() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(forward())
        loss.backward()
        optimizer.step()
        return loss

    if device is None or device.type != "cuda":
        _fall_back(f"CUDA graphs need the model and inputs on a CUDA device, not {device}")
        for _ in range(warmup):  # the same training as a captured step's
            eager()
        return eager
    _make_capturable(optimizer)
    fused = _use_fused_kernel(optimizer)
    skipping = set_row_skipping(False)  # the live rows of a gradient are found with a host sync
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), autotune.for_captured_step():
            for _ in range(warmup):
                eager()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph), autotune.for_captured_step():  # the warm-up's kernel choices
            static_loss = loss_fn(forward())
            static_loss.backward()
            optimizer.step()
    except Exception as err:  # noqa: BLE001 - anything the capture refuses: run eagerly, say why
        _reset_generator_after_failed_capture(device)
        for group in fused:  # the eager steps run the optimizer as the user made it
            group["fused"] = None
        torch.cuda.synchronize(device)
        optimizer.zero_grad(set_to_none=True)
        _fall_back(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
        return eager
    finally:
        set_row_skipping(skipping)

    def replay() -> torch.Tensor:
        graph.replay()
        return static_loss

    replay.graph = graph  # kept alive with the step (and inspectable)
    return replay


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

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
  values): that call trains eagerly and captures the step again (the first layer's kept
  aggregation of the old input is not read any more). What ``model`` and ``loss_fn`` read from
  elsewhere (an index tensor the loss closes over, a buffer) is read at its captured address
  too, and a change to it is not seen: change such tensors in place, at the same size (a new
  tensor bound to the same name is never read by the replays).
- **Hyperparameters.** An Adam or AdamW whose update reads its learning rate from the GPU
  (``capturable`` or ``fused``, as below) gets ``lr`` as a one-element CUDA tensor, which
  learning-rate schedulers update in place, so replays follow them. Any other change to a param
  group (another optimizer's ``lr``, weight decay, betas, ``add_param_group``), an
  ``optimizer.load_state_dict``, ``model.train()`` / ``eval()`` or a parameter frozen
  (``requires_grad_(False)``) makes the next call train eagerly and capture again; a step that
  changes on ``MAX_CAPTURES_IN_A_ROW`` calls in a row runs eagerly from then on, with a warning.
- **No host sync in the step.** A boolean mask index (``out[mask]``) has a data-dependent size:
  index with ``mask.nonzero()`` computed once, as above. fgplugin's zero-row skipping
  (fgplugin.grad_rows) finds the live rows of a gradient with a host sync: the warm-up finds
  them, and the graph's backward products keep to those rows. A replay whose gradient has a
  non-zero row outside them (the loss's rows changed in place) also runs that product in full
  (a kernel that reads its flag on the device), so it stays right, only slower. The kept input
  aggregation (fgplugin.input_cache) is filled in the warm-up (from its second step: with
  ``warmup=1`` the graph computes it every replay) and read by the graph, its form (dense, or a
  mostly-zero input kept sparse: fgplugin.sparse_input) chosen by device time alone. So is the
  route to cuSPARSE (fgplugin.cusparse), by the second product at a width: a width seen once in
  the warm-up runs fgplugin's kernels in the graph.
- **Optimizers**: those with a ``capturable`` option (Adam, AdamW, ...) are switched to it, which
  keeps their step counts on the GPU. Adam and AdamW left at torch's default implementation
  (neither ``foreach`` nor ``fused`` given) are switched to their fused one: the same update in
  one kernel for all parameters instead of a dozen multi-tensor kernels, which in a replayed step
  are kernel time, not hidden host time (where the capture fails, they are switched back). A
  ``GradScaler`` (fp16) syncs on every step and cannot be captured; bf16 autocast can
  (``autocast=torch.bfloat16``).
- The ``warmup`` steps before the capture are real training steps on a side stream, as torch's
  whole-network capture recipe has them.
- ``before_step``: a callable run after the backward pass and before ``optimizer.step()``, inside
  the capture too (gradient clipping: ``lambda: torch.nn.utils.clip_grad_norm_(params, 1.0)``).
- The step returns a new tensor holding the loss each time (a copy of the graph's own, which the
  next replay overwrites).

Where capture is impossible (no CUDA device, a model that syncs, an op that cannot be captured,
a sharded graph of fgplugin.distributed among the inputs) the step runs eagerly and fgplugin warns
once, saying why.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Callable

import torch

from . import autotune, capture_holds
from .aggregation import is_distributed


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
    step = _GraphedStep(model, optimizer, loss_fn, inputs, autocast, before_step)
    reason = None
    if any(is_distributed(i, "sharded_data", "ShardedAdjacency") or is_distributed(i, "sharding", "ShardedGraph")
           for i in inputs):
        # Decided on every rank alike, before a warm-up on a side stream: a capture of such a step
        # failed on a host sync ("operation not permitted when stream is capturing", 2 H200s,
        # docs/results.md section 44) after the ranks had posted collectives into it.
        reason = ("capturing a step over a sharded graph (fgplugin.distributed) is not supported: its row "
                  "exchanges and DistributedDataParallel's all-reduce run eagerly")
    elif step.device is None or step.device.type != "cuda":
        reason = f"CUDA graphs need the model and inputs on a CUDA device, not {step.device}"
    if reason is not None:
        step.fall_back(reason)
        for _ in range(warmup):  # the same training as a captured step's
            step.eager()
        return step
    step.prepare_optimizer()
    try:
        step.warm_up(warmup)
    except Exception:
        step.restore_optimizer()
        raise  # an eager training step failed: the user's model or loss, not the capture
    step.capture()  # where it fails, the step runs eagerly (step.graph is None)
    return step


# A step whose inputs or optimizer change on this many calls in a row runs eagerly from then on:
# capturing it again each time costs more than the replay saves (OneCycleLR cycles Adam's betas
# every step; an SGD's learning rate is a float, which a per-step scheduler changes every step).
MAX_CAPTURES_IN_A_ROW = 3


class _GraphedStep:
    """What :func:`graphed_step` returns: ``step()`` replays the captured step, or trains eagerly
    where there is none; ``step.graph`` is the CUDA graph in use (``None`` where the step runs
    eagerly), ``step.captures`` how many were made, ``step.capture_s`` the seconds the last one
    took, ``step.fallback_reason`` why the step last ran eagerly (``None`` if it never did)."""

    def __init__(self, model, optimizer, loss_fn, inputs, autocast, before_step):
        self.model, self.optimizer, self.loss_fn, self.inputs = model, optimizer, loss_fn, inputs
        self.autocast, self.before_step = autocast, before_step
        self.device = _device_of(model, inputs)
        self.graph = self._loss = self._state = None
        self._holds: list = []  # what the graph reads from fgplugin's caches (capture_holds)
        self._fused: list[dict] = []  # the param groups switched here, switched back for eager steps
        self._tensor_lrs: list[dict] = []
        self._capturable: list[dict] = []
        self._captures_in_a_row = 0
        self.captures = 0  # captures made (the first, and one per change seen since)
        self.capture_s = self.fallback_reason = None

    def fall_back(self, reason: str) -> None:
        """Notes why the step runs eagerly, and says so once per reason in the process."""
        self.fallback_reason = reason
        _fall_back(reason)

    # ------------------------------------------------------------------ one step, eagerly
    def _train(self) -> torch.Tensor:
        if self.autocast is None:
            out = self.model(*self.inputs)
        else:
            with torch.autocast(self.device.type, dtype=self.autocast):
                out = self.model(*self.inputs)
        loss = self.loss_fn(out)
        loss.backward()
        if self.before_step is not None:
            self.before_step()
        self.optimizer.step()
        return loss.detach()

    def eager(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        return self._train()

    def warm_up(self, steps: int) -> torch.Tensor:
        """``steps`` eager training steps on a side stream, with the choices a captured step
        wants (device time alone; the zero-row skipping finds the rows the capture keeps to);
        the last one's loss."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), autotune.for_captured_step():
            for _ in range(steps):
                loss = self.eager()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return loss

    # ------------------------------------------------------------------ the captured step
    def prepare_optimizer(self) -> None:
        """The optimizer's settings for a capture (again before each: load_state_dict and
        add_param_group bring groups without them)."""
        self._capturable.extend(_make_capturable(self.optimizer))
        self._fused.extend(_use_fused_kernel(self.optimizer))
        self._tensor_lrs.extend(_lr_on_device(self.optimizer))

    def restore_optimizer(self) -> None:
        _restore(self.optimizer, self._fused, self._tensor_lrs, self._capturable)

    def capture(self) -> bool:
        """Captures the step (after a warm-up). Where the capture fails: restores the optimizer,
        says why once, and returns False (the step runs eagerly)."""
        first_error = None  # the step's own error: ending the capture after it fails too, and says less
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            self.prepare_optimizer()
            graph, holds = torch.cuda.CUDAGraph(), []
            self.optimizer.zero_grad(set_to_none=True)
            # on a stream of the model's device, whichever device is current (torch's default
            # capture stream is made once, on the device current at the process's first capture)
            with torch.cuda.device(self.device), torch.cuda.graph(graph, stream=torch.cuda.Stream(self.device)), \
                    autotune.for_captured_step(), capture_holds.collecting(holds):
                try:
                    loss = self._train()  # with the warm-up's kernel choices
                except Exception as err:
                    first_error = err
                    raise
            self.graph, self._loss, self._holds = graph, loss, holds
            self._state = _CapturedState(self.model, self.optimizer, self.inputs)
            self.captures += 1
            torch.cuda.synchronize(self.device)
            self.capture_s = time.perf_counter() - start
            return True
        except Exception as err:  # noqa: BLE001 - anything the capture refuses: run eagerly, say why
            err = first_error or err
            _reset_generator_after_failed_capture(self.device)
            self._run_eagerly()
            torch.cuda.synchronize(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            self.fall_back(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
            return False

    def _run_eagerly(self) -> None:
        self.graph = self._loss = self._state = None
        self._holds = []
        self.restore_optimizer()  # the eager steps run the optimizer as the user made it

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            return self.eager()
        if self._state.matches(self.model, self.optimizer, self.inputs):
            self._captures_in_a_row = 0
            self.graph.replay()
            return self._loss.clone()  # the graph's own is overwritten by the next replay
        # Changed since the capture (an input written in place, the optimizer's groups or state):
        # this call trains eagerly, which also sets up what a new parameter group needs (optimizer
        # state made inside a capture would be made anew by every replay), then captures again.
        self._captures_in_a_row += 1
        self.graph = self._loss = None  # the old graph's memory first
        self._holds = []
        if self._captures_in_a_row >= MAX_CAPTURES_IN_A_ROW:
            self._run_eagerly()
            self.fall_back(f"its inputs or optimizer changed on {MAX_CAPTURES_IN_A_ROW} calls in a row, each needing "
                           "a new capture (OneCycleLR and CyclicLR change Adam's betas every step unless "
                           "cycle_momentum=False; an SGD's learning rate is fixed in a capture, so a scheduler "
                           "stepped every step changes it)")
            return self.eager()
        self.prepare_optimizer()  # a new group gets the captured step's settings before its first update
        try:
            loss = self.warm_up(1)
        except Exception as err:
            self._run_eagerly()  # the optimizer back as the user made it, for the calls that follow
            self.fall_back(f"a training step before capturing it again raised {type(err).__name__}")
            raise
        self.capture()
        return loss


class _CapturedState:
    """What a captured step depends on beyond the memory it reads: the inputs (the same tensors,
    and a ``TiledAdjacency``'s edge weights, unchanged: their ``_version``), the model's modes
    (``train()`` / ``eval()``) and which parameters train (``requires_grad``), and the optimizer's
    param groups (hyperparameters by value, tensors and lists by identity) and state
    (``load_state_dict`` replaces both). The objects compared by identity are held, so that a new
    one cannot take a freed one's ``id``."""

    __slots__ = ("inputs", "modes", "groups", "param_groups", "state")

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs):
        self.inputs = _input_tensors(inputs)
        self.modes = _modes(model, optimizer)
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        self.groups = [(group, dict(group)) for group in optimizer.param_groups]

    def matches(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs) -> bool:
        if optimizer.param_groups is not self.param_groups or optimizer.state is not self.state \
                or len(optimizer.param_groups) != len(self.groups) or _modes(model, optimizer) != self.modes:
            return False
        now = _input_tensors(inputs)
        if len(now) != len(self.inputs) or any(t is not held or version != was
                                               for (t, version), (held, was) in zip(now, self.inputs)):
            return False
        for group, (held, snapshot) in zip(optimizer.param_groups, self.groups):
            if group is not held or len(group) != len(snapshot):
                return False
            for key, value in group.items():
                was = snapshot.get(key, _MISSING)
                if isinstance(value, (torch.Tensor, list)):
                    if value is not was:
                        return False
                elif type(value) is not type(was) or value != was:
                    return False
        return True


_MISSING = object()


def _input_tensors(inputs) -> list:
    """``(tensor, its _version)`` of each input tensor and of a ``TiledAdjacency``'s edge weights."""
    found = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            found.append((item, item._version))
        values = getattr(item, "values", None)
        if isinstance(values, torch.Tensor):
            found.append((values, values._version))
    return found


def _modes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """The modules' ``training`` flags and the optimized parameters' ``requires_grad``."""
    return (tuple(m.training for m in model.modules()),
            tuple(p.requires_grad for group in optimizer.param_groups for p in group["params"]))


def _lr_on_device(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Gives the param groups of an Adam or AdamW that updates on the GPU (``capturable`` or
    ``fused``) their learning rate as a one-element tensor on the parameters' device, which a
    learning-rate scheduler fills in place (``torch.optim.lr_scheduler``), so that a replayed step
    follows it; returns the groups changed. Other optimizers read a float, fixed in a capture.
    The tensor is the group's ``lr`` from then on, also in ``optimizer.state_dict()`` (which holds
    it, not a copy: deep-copy a state dict kept in memory as a checkpoint)."""
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


def _restore(optimizer: torch.optim.Optimizer, fused: list[dict], tensor_lrs: list[dict],
             capturable: list[dict]) -> None:
    """Undoes :func:`_use_fused_kernel`, :func:`_lr_on_device` and :func:`_make_capturable` for an
    eager step: the optimizer as the user made it, its state where torch keeps it for that (the
    step counts of a group neither capturable nor fused on the CPU)."""
    for group in fused:
        group["fused"] = None
    for group in tensor_lrs:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])
    for group in capturable:
        group["capturable"] = False
        if not group.get("fused"):
            _move_scalar_state(optimizer, group, lambda p: torch.device("cpu"))
    fused.clear()
    tensor_lrs.clear()
    capturable.clear()


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


def _make_capturable(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Turns on ``capturable`` where the optimizer has it, with its scalar state (step counts,
    NAdam's ``mu_product``, ...) moved to the parameters' device (an optimizer that already
    stepped keeps them on the CPU); returns the groups switched."""
    switched = []
    for group in optimizer.param_groups:
        if "capturable" not in group or group["capturable"]:
            continue
        group["capturable"] = True
        _move_scalar_state(optimizer, group, lambda p: p.device)
        switched.append(group)
    return switched


def _move_scalar_state(optimizer: torch.optim.Optimizer, group: dict, device_of) -> None:
    """Moves the one-value state tensors of ``group``'s parameters to ``device_of(param)``, the
    step counts as float32 (what torch's optimizers make them)."""
    for p in group["params"]:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0 and value.device != device_of(p):
                state[key] = value.to(device=device_of(p), dtype=torch.float32 if key == "step" else value.dtype)


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
                  "captured step needs.", GraphedStepWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` at which the caller's ``warnings.warn`` points at the user's line: the
    first frame outside this module (the calls that fall back sit at different depths:
    ``graphed_step``, a capture, a step's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level

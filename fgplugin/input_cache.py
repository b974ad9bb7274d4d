"""Reuse of a layer's aggregation of an input that stays the same from one call to the next.

In full-batch training the first layer sees the same node features ``x`` every epoch: a tensor
that needs no gradient, over a graph that does not change. Its aggregation ``A x`` (with the
layer's normalization) is then the same every epoch, and because the layer's weight acts on the
feature dimension only, ``A (x W) = (A x) W``. So the drop-in layers keep ``A x`` and from then on
run only the dense product: on a 2-layer GCN this removes the first layer's forward SpMM and its
backward one (``A^T G`` for W's gradient) from every training step. The stock layers compute the
same values in a different order; results agree within float rounding.

When a layer uses it (all must hold, else the layer runs as without it, at no extra cost):

- ``x`` and every tensor the aggregation reads (edge weights, a sparse input's values) need no
  gradient, and no autograd-changing context is active (``torch.compile`` tracing,
  ``torch.func`` transforms, inference mode, saved-tensor hooks: a layer under non-reentrant
  activation checkpointing recomputes its forward in the backward pass, which must save what the
  forward saved, so neither may be the call that keeps or first reuses ``A x``; torch 2.9 can be
  asked for the hooks, 2.7 cannot, so there turn the cache off for such models);
- the cache is shown the same ``x`` object twice in a row, unchanged since (its
  ``_version``), over the same graph object and normalization: the aggregation is built then, so a
  model called once (inference) never pays for a wider SpMM it will not reuse (a GCNConv's kept
  call for inputs that are new at every call, fgplugin.layer_calls, shows them none; the same
  tensor twice takes the full path, which shows it);
- the kept tensor (the size of ``x``) is at most ``MAX_MEMORY_FRACTION`` of the device's memory.

Switch it off with ``FGPLUGIN_INPUT_CACHE=0`` or :func:`fgplugin.set_input_cache`. A layer holds
at most one kept input (two forms of it while fgplugin.form_trial times them); a call with another
input drops it, so does freeing ``x``, and a layer that is copied or pickled starts empty. An
assignment to ``x.data`` is seen (``x``'s data then lives elsewhere). Writes that PyTorch does not
count in ``_version`` are not: in place through ``x.data`` (``x.data.mul_(2)``) or through a NumPy
view of ``x``. After such a write, call :meth:`InputCache.clear` on the layer's cache
(``fgplugin.input_cache.of(layer)``) or switch the cache off.
"""
from __future__ import annotations

import os
import weakref
from typing import Callable

import torch
from torch import Tensor

from .autotune import in_captured_step
from .capture_holds import capturing, hold
from .config import settings
from .form_trial import FormTrial, current
from .inference_mode import in_inference_mode
from .stamps import pin, stamp

MAX_MEMORY_FRACTION = 0.125


class _Key:
    """What an aggregation depends on: tensors and other objects by identity (a weak reference;
    tensors also by :func:`fgplugin.stamps.stamp`, the input's storage pinned), plain values
    (normalization settings) by equality."""

    __slots__ = ("_parts", "_pinned")

    def __init__(self, deps: tuple):
        parts = []
        for obj in deps:
            try:
                ref = weakref.ref(obj)
            except TypeError:  # a plain value: None, a number, a string, a named tuple of them
                parts.append((False, obj, None))
                continue
            parts.append((True, ref, stamp(obj) if isinstance(obj, Tensor) else None))
        self._parts = tuple(parts)
        # only the input's storage is held (the key lives as long as the input): edge weights' is
        # held by their weighted copy's memo, which lets it go when they are freed
        self._pinned = pin(deps[0]) if isinstance(deps[0], Tensor) else None

    def is_of(self, x) -> bool:
        """Whether the first object keyed (the input) is ``x`` as it is now."""
        by_ref, held, version = self._parts[0]
        return by_ref and held() is x and stamp(x) == version

    def matches(self, deps: tuple) -> bool:
        if len(deps) != len(self._parts):
            return False
        for obj, (by_ref, held, version) in zip(deps, self._parts):
            if by_ref:  # a dead reference never matches: its object is gone, whatever this call passes
                now = held()
                if now is None or now is not obj or (isinstance(obj, Tensor) and stamp(obj) != version):
                    return False
            elif type(obj) is not type(held) or obj != held:
                return False
        return True


class InputCache:
    """One layer's kept aggregation (see the module docstring for when it is used)."""

    __slots__ = ("_key", "_value", "_for_captured_step", "_seen", "_seen_version", "_watch", "__weakref__")

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self._key = self._value = self._for_captured_step = None
        self._seen = self._seen_version = self._watch = None

    @property
    def holds(self) -> bool:
        """Whether an aggregation is kept."""
        return self._value is not None

    @property
    def value(self):
        """What is kept: ``A^K x`` (a tensor), ``x`` as a :class:`fgplugin.sparse_input.SparseInput`
        (while both forms are timed, fgplugin.form_trial, the one in use), or ``None``."""
        return current(self._value)

    @property
    def on_trial(self) -> bool:
        """Whether the kept input's form is still being timed on the training steps
        (fgplugin.form_trial): each call then counts, through :meth:`get` or
        :meth:`kept_for_call`."""
        return isinstance(self._value, FormTrial)

    def kept_for(self, x: Tensor):
        """What is kept if it was built from ``x`` as it is now (the same tensor, unchanged) and
        may be reused in this call (as for :meth:`get`: not under torch.compile, which would bake
        in the version check's answer, nor for an ``x`` that needs a gradient), else ``None``: a
        layer's other product with the same input (SAGE's root weight) may use it."""
        return hold(current(self._value)) if self._reusable_for(x) else None

    def kept_for_call(self, x: Tensor):
        """:meth:`kept_for` for a layer's repeated call (fgplugin.layer_calls), which runs on it
        instead of :meth:`get`: where the forms are on trial, the call is counted as :meth:`get`
        counts it, and the form it is to run on is returned."""
        return self._served() if self._reusable_for(x) else None

    def _served(self):
        """The form a call runs on, the call counted where the forms are on trial (the one place
        a call is counted, for :meth:`get` and :meth:`kept_for_call` alike)."""
        if isinstance(self._value, FormTrial):
            self._value = self._value.on_call()
        return hold(current(self._value))

    def _reusable_for(self, x: Tensor) -> bool:
        return self._key is not None and _context_allows() and _constant(x) and \
            (self._for_captured_step == in_captured_step() or not torch.is_grad_enabled()) and self._key.is_of(x)

    def admits(self, x) -> bool:
        """Whether ``x`` may be this call's kept input: asked before :meth:`get`, whose key costs
        more to build (a layer whose input needs a gradient, every layer but the first in training,
        ends here). No when the context rules the cache out (what is kept stays for the calls it
        fits), and no when ``x`` cannot be a constant input (what is kept is dropped: the layer's
        input is no longer the constant one)."""
        if not _context_allows():
            return False
        if not _constant(x):
            self.clear()
            return False
        return True

    def get(self, x: Tensor, deps: tuple, nbytes: int, aggregate: Callable[[], Tensor]) -> Tensor | None:
        """The aggregation of an ``x`` this cache :meth:`admits` (``aggregate()``, ``nbytes`` in
        size) when it may be reused, else ``None`` and the caller computes as usual.

        ``deps`` lists everything besides ``x`` that the aggregation reads (graph, edge values,
        normalization settings). Do not modify the returned tensor: later calls return it again.
        What is kept for a captured step's training (fgplugin.autotune.for_captured_step) and for
        an eager one is built apart, their forms being chosen by different costs; a call without
        autograd (evaluation) reads either.
        ``aggregate()`` may return a :class:`fgplugin.form_trial.FormTrial` of two forms: each
        call then returns the form in use and counts the call, until one form is kept.
        """
        if any(isinstance(t, Tensor) and (t.requires_grad or t.is_inference()) for t in deps):
            self.clear()  # what the aggregation reads changes with each step: nothing to keep
            return None
        for_captured_step = in_captured_step()
        if self._key is not None and not torch.is_grad_enabled():
            for_captured_step = self._for_captured_step  # an evaluation reads the form kept for training
        deps = (x, *deps, for_captured_step)
        if self._key is not None and self._key.matches(deps):
            return self._served()
        # The first call with this x only notes it (by a weak reference and its version: cheap,
        # since a layer whose input changes every step, e.g. after dropout, comes here each time);
        # the second builds the aggregation, from and keyed by that call's graph and settings.
        if self._seen is None or self._seen() is not x or x._version != self._seen_version:
            self.clear()  # a new input: drop what no longer matches
            self._seen, self._seen_version = weakref.ref(x), x._version
            return None
        if not _fits(nbytes, x.device):
            return None
        if capturing(x):
            # a capture records the aggregation's kernels without running them: kept now, it would
            # be read unfilled by any call before the first replay. The graph computes it instead.
            return None
        with torch.no_grad():
            value = aggregate()
        self._key, self._value, self._seen = _Key(deps), value, None
        self._for_captured_step = for_captured_step
        self._watch = weakref.ref(x, _dropper(self, self._key))  # x freed: free its aggregation too
        return hold(current(value))

    # A copy of a layer (deepcopy, pickle, torch.save) starts with an empty cache: what it holds
    # refers to the original's inputs and would only take memory.
    def __deepcopy__(self, memo):
        return InputCache()

    def __reduce__(self):
        return (InputCache, ())


def _dropper(cache: InputCache, key: _Key):
    owner = weakref.ref(cache)

    def drop(_):
        held = owner()
        if held is not None and held._key is key:
            held.clear()
    return drop


def of(module: torch.nn.Module) -> InputCache:
    """The :class:`InputCache` of a drop-in layer (created on first use)."""
    cache = module.__dict__.get("_fgplugin_input_cache")
    if cache is None:
        cache = module.__dict__["_fgplugin_input_cache"] = InputCache()
    return cache


def _context_allows() -> bool:
    """Whether this call's context lets the cache be used at all (compiling, inference mode,
    functorch transforms, saved-tensor hooks and the switch say no: a call there runs as without
    the cache and leaves it as it is; an evaluation under ``torch.inference_mode()`` between
    training steps must not drop what the training steps keep)."""
    if torch.compiler.is_compiling():  # first: what follows is not traced
        return False
    return settings.input_cache and not in_inference_mode() and \
        not torch._C._are_functorch_transforms_active() and \
        not _saved_tensor_hooks_active()  # torch.func.grad / vmap; checkpointing, save_on_cpu


_top_saved_tensor_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
#: Whether this torch can be asked for saved-tensor hooks (checkpointing): without, turn the cache
#: off (:func:`fgplugin.set_input_cache`) for models under non-reentrant activation checkpointing.
SEES_SAVED_TENSOR_HOOKS = _top_saved_tensor_hooks is not None


def _saved_tensor_hooks_active() -> bool:
    """Whether default saved-tensor hooks are active (``torch.autograd.graph.saved_tensors_hooks``:
    non-reentrant checkpointing's forward and its recomputation, ``save_on_cpu``). Torch 2.7
    and older have no way to ask (2.9 has): there this says no."""
    return SEES_SAVED_TENSOR_HOOKS and _top_saved_tensor_hooks(True) is not None


def _constant(x) -> bool:
    """Whether ``x`` can be a kept aggregation's input."""
    return isinstance(x, Tensor) and not x.requires_grad and x.layout == torch.strided and not x.is_inference()


_device_bytes: dict[torch.device, int | None] = {}


def _fits(nbytes: int, device: torch.device) -> bool:
    if device not in _device_bytes:
        _device_bytes[device] = _memory_of(device)
    total = _device_bytes[device]
    return total is None or nbytes <= MAX_MEMORY_FRACTION * total


def _memory_of(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    return None

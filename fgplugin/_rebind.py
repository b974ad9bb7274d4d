"""Swapping stock layer classes for fgplugin's drop-ins: the shared half of both adapters'
``convert(model)``, ``patch()`` and ``unpatch()`` (framework-neutral: it only moves classes)."""
from __future__ import annotations

import sys
from typing import Callable

import torch

from .parallel_dropout import Dropout


class LayerRebinder:
    """``layers`` maps each stock layer class to its fgplugin drop-in; ``on_convert`` runs on each
    module whose class :meth:`convert` changed (PyG regenerates its ``propagate`` there);
    :meth:`patch` rebinds names only in the modules whose name ``patches_module`` accepts (all)."""

    def __init__(self, layers: dict[type, type], on_convert: Callable[[torch.nn.Module], None] | None = None,
                 patches_module: Callable[[str], bool] = lambda name: True):
        self.layers = layers
        self.on_convert = on_convert
        self.patches_module = patches_module
        self._patched: list[tuple[dict, str, type]] = []  # (module namespace, name, stock class)

    def convert(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swaps every stock layer of ``model`` (``model`` itself included) for its drop-in, in place,
        and returns ``model``. Parameters, buffers, hooks and settings stay: only the class changes
        (the drop-ins add no state). Subclasses of the stock layers are left alone, since they may
        override what the drop-in replaces."""
        for module in model.modules():
            ours = self.layers.get(type(module))
            if ours is not None:
                module.__class__ = ours
                if self.on_convert is not None:
                    self.on_convert(module)
        return model

    def patch(self) -> None:
        """Makes the stock names resolve to the drop-ins, so unmodified scripts use them.

        Every imported module that holds a stock layer class under some name gets the drop-in
        instead, including modules that bound the class at import and user modules that imported
        it before. The defining modules keep the stock class, so existing stock objects still
        pickle. Idempotent; undone by :meth:`unpatch`.
        """
        stock_by_id = {id(stock): stock for stock in self.layers}  # id(): touches no attribute of odd objects
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            module_name = str(namespace.get("__name__", "")) if isinstance(namespace, dict) else ""
            if not module_name or module_name.startswith("fgplugin") or not self.patches_module(module_name):
                continue
            for name, value in list(namespace.items()):
                stock = stock_by_id.get(id(value))
                if stock is not None and namespace["__name__"] != stock.__module__:
                    namespace[name] = self.layers[stock]
                    self._patched.append((namespace, name, stock))

    def unpatch(self) -> None:
        """Restores every name :meth:`patch` rebound (layers already built stay drop-ins)."""
        while self._patched:
            namespace, name, stock = self._patched.pop()
            if namespace.get(name) is self.layers[stock]:
                namespace[name] = stock


def _outside_torch_internals(module_name: str) -> bool:
    """``torch.nn`` (where scripts and PyG's BasicGNN look ``Dropout`` up) and every module outside
    torch; not torch's own submodules (``torch.nn.modules.transformer`` & co.), which keep theirs."""
    return module_name == "torch.nn" or not (module_name == "torch" or module_name.startswith("torch."))


class _DropoutSwap:
    """The one ``torch.nn.Dropout`` -> :class:`fgplugin.Dropout` swap both adapters share: patched
    while at least one adapter's :meth:`AdapterSwaps.patch` asked for it and has not unpatched."""

    def __init__(self):
        # The stock class from its defining module, which patch() never rebinds: an adapter
        # imported while the other one's patch is active must still see torch's class.
        stock = torch.nn.modules.dropout.Dropout
        self.rebinder = LayerRebinder({stock: Dropout}, patches_module=_outside_torch_internals)
        self.holders: set[int] = set()  # id() of the AdapterSwaps that patched it

    def patch(self, holder) -> None:
        self.holders.add(id(holder))
        self.rebinder.patch()

    def unpatch(self, holder) -> None:
        self.holders.discard(id(holder))
        if not self.holders:
            self.rebinder.unpatch()


_DROPOUT_SWAP = _DropoutSwap()


class AdapterSwaps:
    """An adapter's ``convert``, ``patch`` and ``unpatch``: its conv layers (``layers``), and
    ``torch.nn.Dropout`` -> :class:`fgplugin.Dropout`.

    ``convert(model)`` swaps the dropout modules of the model it is given unless called with
    ``dropout=False``: that changes no result's distribution, only its masks
    (fgplugin/parallel_dropout.py), and it is where a CPU step on few input features spends most
    of its time; on GPUs, and in compiled, scripted or ``torch.func``-transformed code,
    :class:`fgplugin.Dropout` runs torch's dropout. ``patch()`` changes the process as a whole, so
    it leaves ``torch.nn.Dropout`` alone unless asked (``patch(dropout=True)``).
    """

    def __init__(self, layers: dict[type, type], on_convert: Callable[[torch.nn.Module], None] | None = None):
        self.convs = LayerRebinder(layers, on_convert)

    def convert(self, model: torch.nn.Module, *, dropout: bool = True) -> torch.nn.Module:
        """Swaps ``model``'s stock layers (and ``torch.nn.Dropout`` modules if ``dropout``) for
        fgplugin's **in place** (the same module objects change class; no copy is made) and
        returns ``model`` (see :meth:`LayerRebinder.convert`)."""
        self.convs.convert(model)
        return _DROPOUT_SWAP.rebinder.convert(model) if dropout else model

    def patch(self, *, dropout: bool = False) -> None:
        """Makes the stock names (and ``torch.nn.Dropout`` if ``dropout``: in ``torch.nn`` and
        modules outside torch) resolve to fgplugin's classes in every imported module (see
        :meth:`LayerRebinder.patch`)."""
        self.convs.patch()
        if dropout:
            _DROPOUT_SWAP.patch(self)

    def unpatch(self) -> None:
        """Restores every name :meth:`patch` rebound (the dropout swap stays while the other
        adapter's patch holds it)."""
        _DROPOUT_SWAP.unpatch(self)
        self.convs.unpatch()


def adapter_functions(swaps: AdapterSwaps, module: str, *, layers: str, patched: str, stock_classes: str):
    """An adapter's ``convert``, ``patch`` and ``unpatch`` (``module``: the adapter's module name),
    whose ``help()`` names its ``layers``, the names ``patch`` rebinds (``patched``) and the stock
    classes to test ``isinstance`` against after a patch (``stock_classes``)."""

    def convert(model: torch.nn.Module, *, dropout: bool = True) -> torch.nn.Module:
        return swaps.convert(model, dropout=dropout)

    def patch(*, dropout: bool = False) -> None:
        swaps.patch(dropout=dropout)

    def unpatch() -> None:
        swaps.unpatch()

    convert.__doc__ = f"""Swaps the stock {layers} layers of ``model`` for fgplugin's, **in place** (the same
    module objects change class; weights, settings and hooks kept; no copy), and returns ``model``.

    ``dropout``: also swap ``torch.nn.Dropout`` for :class:`fgplugin.Dropout` (the same
    distribution; a parallel mask on CPUs, torch's dropout on GPUs); ``False`` keeps torch's.
    Subclasses of the stock layers are left as they are (they may override what fgplugin's layers
    replace)."""
    patch.__doc__ = f"""Makes {patched} fgplugin's layers in every imported module, for scripts that build
    their models themselves; ``dropout=True`` also swaps ``torch.nn.Dropout``. The patched names
    then miss stock layers in ``isinstance`` (built before, unpickled, torch's own modules'
    dropout): test against {stock_classes}. :func:`unpatch` undoes it."""
    unpatch.__doc__ = "Undoes :func:`patch`."
    for function in (convert, patch, unpatch):
        function.__module__, function.__qualname__ = module, function.__name__
    return convert, patch, unpatch

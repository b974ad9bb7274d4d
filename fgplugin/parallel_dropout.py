"""Dropout with torch's contract and a parallel mask on CPU: ``fgplugin.dropout`` and ``fgplugin.Dropout``.

On CPU, PyTorch draws dropout's mask with ``bernoulli_``, which runs MKL's parallel generator on
Intel CPUs only; elsewhere it is one serial mt19937 stream, followed by two more passes to apply
the mask. In a full-batch GCN step on a graph with few input features that dominates: 10.2 of
17.8 ms per step on tolokers on the 2-core AMD machine, for stock DGL and fgplugin alike
(``benchmarks/results/cpu/step_profile.json``). fgplugin's CPU kernel (``csrc/cpu/dropout_cpu.cpp``)
draws the mask from a counter-based Philox stream in parallel and applies it in the same pass.

What stays as in ``torch.nn.functional.dropout``: each element is kept with probability ``1 - p``
and scaled by ``1 / (1 - p)``, dropped elements are multiplied by 0 (NaN stays NaN), ``p`` outside
[0, 1] raises ValueError, eval mode and ``p = 0`` return the input itself, and ``torch.manual_seed``
makes runs reproducible (each call draws its seed from torch's CPU generator). What differs: the
masks themselves (another generator), so a run is statistically, not bitwise, the same as with
torch's dropout; the output is contiguous (torch keeps the input's memory format); and
``inplace=True`` computes out of place and copies the result into the input. The mask depends only
on the seed and the element's (row-major) index, not on the thread count, and the backward pass
recomputes it from the seed instead of storing it (torch keeps a mask per element).

Where the kernel cannot serve, torch's dropout runs unchanged: CUDA and other devices, non-float
tensors, builds without the C++ extension, and code that is compiled, scripted or transformed
(``torch.compile`` / ``torch.export``, TorchScript, ``torch.func``, forward-mode AD), which have
their own handling of random ops. ``torch.fx`` tracing records a call to :func:`dropout` as one
node. ``fgplugin.pyg.convert`` /
``fgplugin.dgl.convert`` (and ``patch``) swap ``torch.nn.Dropout`` for :class:`Dropout` unless
called with ``dropout=False`` (fgplugin/_rebind.py).
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad
import torch.fx
import torch.nn.functional as F

from . import _extension

_SEED_BOUND = 2**63 - 1


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """``torch.nn.functional.dropout`` with fgplugin's parallel CPU kernel (see the module doc)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input  # as torch's dropout: the input itself
    if not _kernel_serves(input):
        return F.dropout(input, p, training, inplace)
    seed = int(torch.randint(_SEED_BOUND, (), device="cpu"))  # torch's CPU generator: manual_seed rules it
    out = torch.ops.fgplugin.dropout(input, float(p), seed)
    return input.copy_(out) if inplace else out


# fx's symbolic tracing records a call to dropout() as one node instead of tracing into it.
torch.fx.wrap("dropout")


def _kernel_serves(input: torch.Tensor) -> bool:
    """Whether fgplugin's kernel handles this call; otherwise torch's dropout does (module doc)."""
    return (input.device.type == "cpu" and input.is_floating_point() and _extension.status.loaded
            and not torch.compiler.is_compiling()  # the seed's .item() would break graphs and recompile
            and not torch._C._are_functorch_transforms_active()  # torch.func: no batching or jvp rule
            and torch.autograd.forward_ad._current_level < 0)  # forward AD: the op has no jvp


class Dropout(torch.nn.Dropout):
    """``torch.nn.Dropout`` whose forward is :func:`dropout`; same arguments, no added state."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return F.dropout(input, self.p, self.training, self.inplace)
        return _dropout_unscripted(input, self.p, self.training, self.inplace)


@torch.jit.unused
def _dropout_unscripted(input: torch.Tensor, p: float, training: bool, inplace: bool) -> torch.Tensor:
    # TorchScript compiles only the scripted branch of Dropout.forward; this one stays Python.
    if type(input) is torch.Tensor and input.device.type != "cpu":
        # torch's dropout at once, without dropout()'s checks, which would send it there anyway:
        # on a small graph an eager CUDA step is bound by host time (an fx Proxy is no Tensor)
        return F.dropout(input, p, training, inplace)
    return dropout(input, p, training, inplace)


def register_python_parts() -> None:
    """Fake kernel and autograd of ``fgplugin::dropout`` (the op exists only with the extension)."""
    torch.library.register_fake("fgplugin::dropout")(_dropout_fake)
    torch.library.register_autograd("fgplugin::dropout", _dropout_backward, setup_context=_dropout_setup_context)


def _dropout_fake(x, p, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _dropout_setup_context(ctx, inputs, output):
    _, ctx.p, ctx.seed = inputs


def _dropout_backward(ctx, grad):
    # out = x * keep / (1 - p) elementwise, so d out / d x is the same mask and scale: the same op
    # with the same seed. It is differentiable again, so double backward works too.
    return torch.ops.fgplugin.dropout(grad, ctx.p, ctx.seed), None, None

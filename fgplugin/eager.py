"""Whether a call runs in plain eager mode, where fgplugin may take its Python shortcuts.

Outside it (torch.compile tracing, functorch transforms, tensor subclasses, torch function or
dispatch modes) the ops go through the dispatcher and their registered kernels, which those
machineries know how to handle."""
from __future__ import annotations

import torch

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def plain_eager(x: torch.Tensor) -> bool:
    """True when ``x`` is a plain tensor and no tracing, transform or mode is active."""
    return (type(x) in _PLAIN_TENSORS and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active() and not torch._C._is_torch_function_mode_enabled()
            and torch._C._len_torch_dispatch_stack() == 0)


def _any_tensor_requires_grad(*args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


#: ``any_requires_grad(*args)``: whether a tensor among ``args`` requires grad. torch's C++ check
#: where it has one (torch >= 2.5); the hot paths call it on every product.
any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_tensor_requires_grad)

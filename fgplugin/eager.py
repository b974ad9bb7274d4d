"""Whether a call runs in plain eager mode, where fgplugin may take its Python shortcuts.

Outside it (torch.compile tracing, functorch transforms, tensor subclasses, torch function or
dispatch modes) the ops go through the dispatcher and their registered kernels, which those
machineries know how to handle."""
from __future__ import annotations

import functools

import torch
from torch.torch_version import Version

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def plain_eager(x: torch.Tensor) -> bool:
    """True when ``x`` is a plain tensor and no tracing, transform or mode is active."""
    return (type(x) in _PLAIN_TENSORS and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active() and not torch._C._is_torch_function_mode_enabled()
            and torch._C._len_torch_dispatch_stack() == 0)


def _any_tensor_requires_grad(*args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


#: ``any_requires_grad(*args)``: whether a tensor among ``args`` requires grad. torch's C++ check
#: where it has one (2.9 has it, 2.7 and older do not, 2.8 was not tried); the hot paths call it
#: on every product.
any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_tensor_requires_grad)


#: Whether torch.compile traces fgplugin's layers. The dynamo of torch 2.4-2.9 cannot call a
#: NamedTuple holding tensors or read its properties (fgplugin's aggregations): tracing failed
#: inside dynamo ("TensorVariable() is not a constant"). 2.11 traces them; 2.10 was not tried.
DYNAMO_TRACES_FGPLUGIN = Version(torch.__version__).release[:2] >= (2, 11)  # 2.11 pre-releases too


def eager_in_old_dynamo(fn):
    """``fn`` itself where dynamo traces fgplugin (:data:`DYNAMO_TRACES_FGPLUGIN`); before that,
    ``fn`` run eagerly when torch.compile traces a call of it (one graph break: the rest of the
    model is compiled, fgplugin's part runs as in eager mode)."""
    if DYNAMO_TRACES_FGPLUGIN:
        return fn
    eager = torch.compiler.disable(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return eager(*args, **kwargs) if torch.compiler.is_compiling() else fn(*args, **kwargs)
    return call

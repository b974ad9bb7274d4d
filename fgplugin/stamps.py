"""What tells a tensor's contents apart over time, for the caches that key a tensor object."""
from __future__ import annotations

import torch


def stamp(t: torch.Tensor) -> tuple:
    """``t``'s version counter (in-place writes through torch), where its data lives, its shape,
    strides and dtype (an assignment to ``t.data``, which leaves the counter as it was). Writes
    that torch does not count are not seen: in place through ``t.data``, through a NumPy view, or
    through another tensor that holds data assigned to ``t.data``. Only for a tensor that
    :func:`stampable` accepts."""
    if t.layout != torch.strided:
        return t._version, None, t.shape, None, t.dtype
    return t._version, t.data_ptr(), t.shape, t.stride(), t.dtype


def stampable(t: torch.Tensor) -> bool:
    """Whether ``t`` has a version counter and data of its own to stamp: not a tensor made in
    inference mode, nor one that a functorch transform (``vmap``, ``jvp``) wraps."""
    return not t.is_inference() and not _functorch_wrapped(t)


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def pin(t: torch.Tensor):
    """What a cache holds beside ``t``'s stamp: its storage, so that the address in the stamp
    stays ``t``'s old data's and no new data can take it after an assignment to ``t.data`` (else
    two assignments in a row may put the new data back where the stamp looks, unseen). Holding it
    costs no memory while ``t`` keeps that data, and one tensor's worth after such an assignment,
    until the cache entry is replaced or dropped."""
    return t.untyped_storage() if t.layout == torch.strided else None
